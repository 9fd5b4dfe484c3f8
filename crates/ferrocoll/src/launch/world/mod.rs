//! Which rank this process is, how many ranks there are, and where the
//! rendezvous store is, read from the launcher's environment variables.
//!
//! [`WorldSpec::from_env`] looks for the variable families below in this
//! order; the first family whose **rank** variable is set (and not empty)
//! is used, and the others are ignored (except `FERROCOLL_ADDR`,
//! `FERROCOLL_SECRET`, `FERROCOLL_LOCAL_*` and `FERROCOLL_WORLD_SIZE`, see
//! below).
//!
//! | # | launcher | rank | size | local rank / local size | store address | job id |
//! |---|---|---|---|---|---|---|
//! | 1 | `ferrocoll run` ([`Launcher::Ferrocoll`]) | `FERROCOLL_RANK` | `FERROCOLL_WORLD_SIZE` (required) | `FERROCOLL_LOCAL_RANK` / `FERROCOLL_LOCAL_WORLD_SIZE` | `FERROCOLL_ADDR` (required) | `FERROCOLL_JOB_ID` |
//! | 2 | torchrun, or set by hand ([`Launcher::Torchrun`]) | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` / `LOCAL_WORLD_SIZE` | `FERROCOLL_ADDR`, else `MASTER_ADDR:MASTER_PORT` | `TORCHELASTIC_RUN_ID` |
//! | 3 | Open MPI `mpirun` ([`Launcher::OpenMpi`]) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` / `OMPI_COMM_WORLD_LOCAL_SIZE` | `FERROCOLL_ADDR`, else `MASTER_ADDR:MASTER_PORT` | `OMPI_MCA_ess_base_jobid` |
//! | 4 | Slurm `srun` ([`Launcher::Slurm`]) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` / `SLURM_STEP_TASKS_PER_NODE` or `SLURM_NTASKS_PER_NODE` (uniform counts only) | `FERROCOLL_ADDR`, else `MASTER_ADDR:MASTER_PORT`, else first host of the node list with port `FERROCOLL_PORT`, else `MASTER_PORT`, else `20000 + SLURM_JOB_ID % 20000` | `SLURM_JOB_ID` + `_` + `SLURM_STEP_ID` |
//! | 5 | MPICH / Hydra, Intel MPI ([`Launcher::Pmi`]) | `PMI_RANK` | `PMI_SIZE` | — | `FERROCOLL_ADDR`, else `MASTER_ADDR:MASTER_PORT` | — |
//!
//! When none of the rank variables is set, [`WorldSpec::from_vars`] fails
//! with [`crate::Error::InvalidArgument`]; whether to fall back to a single
//! process is the caller's decision.
//!
//! Rules shared by every family:
//!
//! - A variable set to the empty string (or only spaces) counts as unset;
//!   values are trimmed.
//! - A variable that is set but unusable (not a number, rank not below
//!   size, an address without a port, ...) is a [`crate::Error::Config`]
//!   naming it; a required variable that is missing is a
//!   [`crate::Error::InvalidArgument`] saying what to set.
//! - `FERROCOLL_LOCAL_RANK` / `FERROCOLL_LOCAL_WORLD_SIZE` fill in the local
//!   rank and size when the launcher does not give them.
//! - `FERROCOLL_WORLD_SIZE`, when set while another family is used, must
//!   equal that family's size; a world has at most [`MAX_WORLD_SIZE`]
//!   ranks, and `FERROCOLL_SECRET` at most [`MAX_SECRET`] bytes without
//!   control characters.
//! - The store address is `host:port` (IPv6 as `[::1]:29500`) with a port in
//!   1..=65535. A bare IPv6 `MASTER_ADDR` is bracketed for you.
//! - Under a real `torchrun`, `MASTER_PORT` on rank 0's host is already taken
//!   by torchrun's own store; this module still uses `MASTER_PORT` as given
//!   (right when the variables are set by hand, the common case), so under
//!   torchrun set `FERROCOLL_ADDR` to another port.
//! - Under Slurm, the node list is `SLURM_STEP_NODELIST`, else
//!   `SLURM_JOB_NODELIST`, else `SLURM_NODELIST`; set `FERROCOLL_ADDR` when
//!   node names do not resolve to addresses, and `FERROCOLL_PORT` when two
//!   steps of one job run at once (they would derive the same port).
//!
//! The secret every rank presents to the store is `FERROCOLL_SECRET` when
//! set. Otherwise it is derived from what every rank sees alike (a 64-bit
//! FNV-1a hash of the launcher, job id, store address and size): that only
//! keeps out stray processes of other jobs, **not attackers**, since anyone
//! who can read the job's environment can compute it. `ferrocoll run`
//! generates a random `FERROCOLL_SECRET` for every job.
//!
//! The job id is the launcher's (made safe for file names: characters other
//! than `[A-Za-z0-9_-]` become `_`, and one longer than 32 characters is
//! shortened with a hash of the whole); when the launcher gives none it is
//! `j` followed by 12 hex digits of the same hash.
//!
//! # Layout
//!
//! - `mod.rs`: [`WorldSpec`], the order the families are tried in, and the
//!   checks and derivations every family shares (sizes, local ranks, job
//!   id, secret);
//! - `launcher.rs`: [`Launcher`];
//! - `families.rs`: the families of `ferrocoll run`, torchrun, Open MPI and
//!   PMI (`MASTER_ADDR`/`MASTER_PORT` as their fallback address);
//! - `slurm.rs`: the Slurm family (node lists, tasks per node, the derived
//!   port);
//! - `vars.rs`: the lookup where empty counts as unset, and what a family
//!   found;
//! - `address.rs`: `host:port`, host and port checks;
//! - `job_id.rs`: file-safe job ids and the hash behind derived ids and
//!   secrets;
//! - `tests.rs`: the launcher tables against example environments.

mod address;
mod families;
mod job_id;
mod launcher;
mod slurm;
#[cfg(test)]
mod tests;
mod vars;

pub(crate) use address::check_addr;
pub use launcher::Launcher;

use crate::error::{Error, Result};
use families::{ferrocoll, open_mpi, pmi, torchrun};
use job_id::{file_safe_job_id, fnv1a};
use slurm::slurm;
use vars::{config, Env, Found};

/// Where this process sits in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorldSpec {
    /// This process's rank, in `0..size`.
    pub rank: usize,
    /// Number of ranks in the job (at least 1).
    pub size: usize,
    /// Rank among the processes of this host, when the launcher says
    /// (`LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK`, `SLURM_LOCALID`,
    /// `FERROCOLL_LOCAL_RANK`).
    pub local_rank: Option<usize>,
    /// Processes on this host, when the launcher says (`LOCAL_WORLD_SIZE`,
    /// `OMPI_COMM_WORLD_LOCAL_SIZE`, `SLURM_STEP_TASKS_PER_NODE` or
    /// `SLURM_NTASKS_PER_NODE` when the same on every node,
    /// `FERROCOLL_LOCAL_WORLD_SIZE`).
    pub local_size: Option<usize>,
    /// `host:port` of the rendezvous store (rank 0 serves it).
    pub store_addr: String,
    /// Shared secret every rank presents to the store (`FERROCOLL_SECRET`,
    /// or derived; a derived one keeps out strays, not attackers).
    pub secret: String,
    /// A job identifier, the same on every rank, usable in file names
    /// (`[A-Za-z0-9_-]` only, at most 32 characters).
    pub job_id: String,
    /// Which launcher's variables were used.
    pub launcher: Launcher,
}

impl WorldSpec {
    /// Reads the process environment (see the [module docs](self) for the
    /// variables). Variables that are not valid UTF-8 count as unset.
    pub fn from_env() -> Result<WorldSpec> {
        WorldSpec::from_vars(&|name| std::env::var(name).ok())
    }

    /// Same as [`WorldSpec::from_env`], reading variables through `get`
    /// (tests pass a map).
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<WorldSpec> {
        let env = Env { get };
        let found = if env.get("FERROCOLL_RANK").is_some() {
            ferrocoll(&env)?
        } else if env.get("RANK").is_some() {
            torchrun(&env)?
        } else if env.get("OMPI_COMM_WORLD_RANK").is_some() {
            open_mpi(&env)?
        } else if env.get("SLURM_PROCID").is_some() {
            slurm(&env)?
        } else if env.get("PMI_RANK").is_some() {
            pmi(&env)?
        } else {
            return Err(Error::invalid(
                "cannot tell this process's rank: none of FERROCOLL_RANK, RANK (torchrun), \
                 OMPI_COMM_WORLD_RANK (Open MPI), SLURM_PROCID (Slurm) or PMI_RANK (MPICH, \
                 Intel MPI) is set; run under `ferrocoll run -n N`, torchrun, mpirun or srun, \
                 or set FERROCOLL_RANK, FERROCOLL_WORLD_SIZE and FERROCOLL_ADDR=host:port",
            ));
        };
        finish(&env, found)
    }
}

/// The shared checks and derivations: rank < size, local rank < local
/// size, `FERROCOLL_WORLD_SIZE` agreement, job id and secret.
fn finish(env: &Env, found: Found) -> Result<WorldSpec> {
    let Found {
        launcher,
        rank,
        size,
        local_rank,
        local_size,
        store_addr,
        job_id,
    } = found;

    if size.value == 0 {
        return Err(config(
            size.var,
            "0",
            format!(
                "the job needs at least one rank; set {} to 1 or more",
                size.var
            ),
        ));
    }
    if size.value > MAX_WORLD_SIZE {
        return Err(config(
            size.var,
            &size.value.to_string(),
            format!(
                "more ranks than a ferrocoll job can have (at most {MAX_WORLD_SIZE}); set {} to \
                 the number of processes of the job",
                size.var
            ),
        ));
    }
    if rank.value >= size.value {
        return Err(config(
            rank.var,
            &rank.value.to_string(),
            format!(
                "rank must be less than {}={} (ranks are numbered from 0); set {} to 0..{} or {} \
                 to the number of ranks",
                size.var,
                size.value,
                rank.var,
                size.value - 1,
                size.var
            ),
        ));
    }
    if launcher != Launcher::Ferrocoll {
        if let Some(ours) = env.usize("FERROCOLL_WORLD_SIZE")? {
            if ours.value != size.value {
                return Err(config(
                    "FERROCOLL_WORLD_SIZE",
                    &ours.value.to_string(),
                    format!(
                        "contradicts {}={} from the {launcher} launcher; unset \
                         FERROCOLL_WORLD_SIZE or make the two equal",
                        size.var, size.value
                    ),
                ));
            }
        }
    }

    let local_rank = match local_rank {
        Some(l) => Some(l),
        None => env.usize("FERROCOLL_LOCAL_RANK")?,
    };
    let local_size = match local_size {
        Some(l) => Some(l),
        None => env.usize("FERROCOLL_LOCAL_WORLD_SIZE")?,
    };
    if let Some(ls) = local_size {
        if ls.value == 0 || ls.value > size.value {
            return Err(config(
                ls.var,
                &ls.value.to_string(),
                format!(
                    "processes on this host must be between 1 and {}={}; set {} to the number \
                     of ranks on this host",
                    size.var, size.value, ls.var
                ),
            ));
        }
    }
    if let Some(lr) = local_rank {
        let (bound, bound_var) = match local_size {
            Some(ls) => (ls.value, ls.var),
            None => (size.value, size.var),
        };
        if lr.value >= bound {
            return Err(config(
                lr.var,
                &lr.value.to_string(),
                format!(
                    "local rank must be less than {bound_var}={bound}; set {} to this process's \
                     index among the ranks of its host, 0..{}",
                    lr.var,
                    bound - 1
                ),
            ));
        }
    }

    let size_text = size.value.to_string();
    let job_id = match job_id {
        Some(id) => file_safe_job_id(&id),
        None => {
            let h = fnv1a(&[launcher.name(), "", &store_addr, &size_text]);
            format!("j{:012x}", h & 0xffff_ffff_ffff)
        }
    };
    let secret = match env.get("FERROCOLL_SECRET") {
        Some(given) => Some(crate::env::text(
            "FERROCOLL_SECRET",
            &given,
            MAX_SECRET,
            "secret",
            "give the same plain token on every rank (e.g. 32 hex digits), or unset it to \
             derive one",
        )?),
        None => None,
    };
    let secret = secret.unwrap_or_else(|| {
        format!(
            "{:016x}",
            fnv1a(&[launcher.name(), &job_id, &store_addr, &size_text])
        )
    });

    Ok(WorldSpec {
        rank: rank.value,
        size: size.value,
        local_rank: local_rank.map(|l| l.value),
        local_size: local_size.map(|l| l.value),
        store_addr,
        secret,
        job_id,
        launcher,
    })
}

/// Most ranks a job may have (start-up waits for one key per rank in one
/// request of the store).
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// Longest `FERROCOLL_SECRET` (it travels in the store's hello).
pub const MAX_SECRET: usize = 4096;
