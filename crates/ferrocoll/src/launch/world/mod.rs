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

use std::fmt;

use crate::error::{Error, Result};

/// Which launcher's variables were used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `ferrocoll run` (or `FERROCOLL_RANK`/`FERROCOLL_WORLD_SIZE`/`FERROCOLL_ADDR` set by hand).
    Ferrocoll,
    /// torchrun / torch.distributed.launch (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...).
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, ...).
    Slurm,
    /// A PMI launcher: MPICH's Hydra, Intel MPI (`PMI_RANK`, `PMI_SIZE`).
    Pmi,
    /// No launcher's variables: the caller gave rank, size and a store
    /// ([`crate::init::init_with_rendezvous`], as the torch backend does).
    Caller,
}

impl Launcher {
    /// A short lowercase name: `ferrocoll`, `torchrun`, `openmpi`, `slurm`, `pmi`, `caller`.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Ferrocoll => "ferrocoll",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "openmpi",
            Launcher::Slurm => "slurm",
            Launcher::Pmi => "pmi",
            Launcher::Caller => "caller",
        }
    }
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

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

/// Variable lookup where empty (or all-space) values count as unset.
struct Env<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl Env<'_> {
    /// The trimmed value of `name`, `None` when unset or empty.
    fn get(&self, name: &str) -> Option<String> {
        (self.get)(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// `name` parsed as a count or index, `None` when unset.
    fn usize(&self, name: &'static str) -> Result<Option<Named>> {
        match self.get(name) {
            None => Ok(None),
            Some(value) => match value.parse::<usize>() {
                Ok(n) => Ok(Some(Named {
                    value: n,
                    var: name,
                })),
                Err(_) => Err(config(
                    name,
                    &value,
                    format!(
                        "{}: not a non-negative integer; set {name} to a whole number such as 0 \
                         or 4",
                        crate::env::not_whole(&value)
                    ),
                )),
            },
        }
    }

    /// `name` parsed as a count or index; `missing` explains what to set
    /// when it is unset.
    fn require_usize(&self, name: &'static str, missing: &str) -> Result<Named> {
        self.usize(name)?.ok_or_else(|| Error::invalid(missing))
    }
}

/// A number and the variable it came from (for error messages).
#[derive(Clone, Copy, Debug)]
struct Named {
    value: usize,
    var: &'static str,
}

/// What one family found, before the shared checks and derivations.
struct Found {
    launcher: Launcher,
    rank: Named,
    size: Named,
    local_rank: Option<Named>,
    local_size: Option<Named>,
    store_addr: String,
    /// From the launcher, not yet made file-name safe.
    job_id: Option<String>,
}

fn config(var: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn ferrocoll(env: &Env) -> Result<Found> {
    let rank = env.require_usize("FERROCOLL_RANK", "")?;
    let size = env.require_usize(
        "FERROCOLL_WORLD_SIZE",
        "FERROCOLL_RANK is set but FERROCOLL_WORLD_SIZE is not; set FERROCOLL_WORLD_SIZE to the \
         number of ranks (or launch with `ferrocoll run -n N`)",
    )?;
    let addr = env.get("FERROCOLL_ADDR").ok_or_else(|| {
        Error::invalid(
            "FERROCOLL_RANK is set but FERROCOLL_ADDR is not; set FERROCOLL_ADDR=host:port to \
             where rank 0 serves the rendezvous store, e.g. FERROCOLL_ADDR=node01:29500",
        )
    })?;
    let job_id = match env.get("FERROCOLL_JOB_ID") {
        None => None,
        Some(id) => {
            if !is_valid_job_id(&id) {
                return Err(config(
                    "FERROCOLL_JOB_ID",
                    &id,
                    "use at most 32 characters from A-Z, a-z, 0-9, `_` and `-`, or unset it \
                     to derive one",
                ));
            }
            Some(id)
        }
    };
    Ok(Found {
        launcher: Launcher::Ferrocoll,
        rank,
        size,
        local_rank: env.usize("FERROCOLL_LOCAL_RANK")?,
        local_size: env.usize("FERROCOLL_LOCAL_WORLD_SIZE")?,
        store_addr: check_addr("FERROCOLL_ADDR", &addr)?,
        job_id,
    })
}

fn torchrun(env: &Env) -> Result<Found> {
    let rank = env.require_usize("RANK", "")?;
    let size = env.require_usize(
        "WORLD_SIZE",
        "RANK is set but WORLD_SIZE is not; set WORLD_SIZE to the number of processes \
         (torchrun sets both)",
    )?;
    let store_addr = match env.get("FERROCOLL_ADDR") {
        Some(addr) => check_addr("FERROCOLL_ADDR", &addr)?,
        None => master_addr(env)?.ok_or_else(|| {
            Error::invalid(
                "RANK and WORLD_SIZE are set (torchrun) but MASTER_ADDR and MASTER_PORT are \
                 not; set MASTER_ADDR and MASTER_PORT, or FERROCOLL_ADDR=host:port of rank 0's \
                 rendezvous store",
            )
        })?,
    };
    // torchrun's default run id is the literal "none": the same for every
    // job, so useless as an identifier.
    let job_id = env
        .get("TORCHELASTIC_RUN_ID")
        .filter(|id| !id.eq_ignore_ascii_case("none"));
    Ok(Found {
        launcher: Launcher::Torchrun,
        rank,
        size,
        local_rank: env.usize("LOCAL_RANK")?,
        local_size: env.usize("LOCAL_WORLD_SIZE")?,
        store_addr,
        job_id,
    })
}

fn open_mpi(env: &Env) -> Result<Found> {
    let rank = env.require_usize("OMPI_COMM_WORLD_RANK", "")?;
    let size = env.require_usize(
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not; launch with Open MPI's \
         mpirun, or set FERROCOLL_RANK, FERROCOLL_WORLD_SIZE and FERROCOLL_ADDR instead",
    )?;
    Ok(Found {
        launcher: Launcher::OpenMpi,
        rank,
        size,
        local_rank: env.usize("OMPI_COMM_WORLD_LOCAL_RANK")?,
        local_size: env.usize("OMPI_COMM_WORLD_LOCAL_SIZE")?,
        store_addr: mpi_store_addr(env, "Open MPI", "mpirun -x FERROCOLL_ADDR=host0:29500")?,
        job_id: env.get("OMPI_MCA_ess_base_jobid"),
    })
}

fn pmi(env: &Env) -> Result<Found> {
    let rank = env.require_usize("PMI_RANK", "")?;
    let size = env.require_usize(
        "PMI_SIZE",
        "PMI_RANK is set but PMI_SIZE is not; launch with mpiexec (MPICH, Intel MPI), or set \
         FERROCOLL_RANK, FERROCOLL_WORLD_SIZE and FERROCOLL_ADDR instead",
    )?;
    Ok(Found {
        launcher: Launcher::Pmi,
        rank,
        size,
        local_rank: None,
        local_size: None,
        store_addr: mpi_store_addr(
            env,
            "MPICH/Intel MPI",
            "mpiexec -genv FERROCOLL_ADDR host0:29500",
        )?,
        job_id: None,
    })
}

/// Store address for the MPI families: `FERROCOLL_ADDR`, else
/// `MASTER_ADDR:MASTER_PORT`, else an error showing how to pass it.
fn mpi_store_addr(env: &Env, what: &str, example: &str) -> Result<String> {
    if let Some(addr) = env.get("FERROCOLL_ADDR") {
        return check_addr("FERROCOLL_ADDR", &addr);
    }
    master_addr(env)?.ok_or_else(|| {
        Error::invalid(format!(
            "{what} does not say where the rendezvous store is; set FERROCOLL_ADDR=host:port \
             (a free port on the host of rank 0) on every rank, e.g. `{example}`"
        ))
    })
}

/// `MASTER_ADDR:MASTER_PORT` when both are set, `None` when neither is, an
/// error when only one is.
fn master_addr(env: &Env) -> Result<Option<String>> {
    match (env.get("MASTER_ADDR"), env.get("MASTER_PORT")) {
        (None, None) => Ok(None),
        (Some(host), Some(port)) => {
            let host = check_host("MASTER_ADDR", &host)?;
            let port = check_port("MASTER_PORT", &port)?;
            Ok(Some(format!("{host}:{port}")))
        }
        (Some(_), None) => Err(Error::invalid(
            "MASTER_ADDR is set but MASTER_PORT is not; set MASTER_PORT to a free port on that \
             host, or FERROCOLL_ADDR=host:port",
        )),
        (None, Some(_)) => Err(Error::invalid(
            "MASTER_PORT is set but MASTER_ADDR is not; set MASTER_ADDR to the host of rank 0, \
             or FERROCOLL_ADDR=host:port",
        )),
    }
}

fn slurm(env: &Env) -> Result<Found> {
    let rank = env.require_usize("SLURM_PROCID", "")?;
    let size = env.require_usize(
        "SLURM_NTASKS",
        "SLURM_PROCID is set but SLURM_NTASKS is not; launch with `srun -n N` (or \
         --ntasks-per-node), or set FERROCOLL_RANK, FERROCOLL_WORLD_SIZE and FERROCOLL_ADDR",
    )?;
    let local_rank = env.usize("SLURM_LOCALID")?;
    // Tasks per node are a hint: SLURM_NTASKS_PER_NODE belongs to the
    // allocation and may not describe this step, so a value that cannot be
    // right is dropped rather than reported.
    let local_size = slurm_tasks_per_node(env, "SLURM_STEP_TASKS_PER_NODE")
        .or_else(|| slurm_tasks_per_node(env, "SLURM_NTASKS_PER_NODE"))
        .filter(|n| {
            n.value >= 1
                && n.value <= size.value
                && !matches!(local_rank, Some(l) if l.value >= n.value)
        });

    let job = env.get("SLURM_JOB_ID").or_else(|| env.get("SLURM_JOBID"));
    let job_id = job.as_ref().map(|job| match env.get("SLURM_STEP_ID") {
        Some(step) => format!("{job}.{step}"),
        None => job.clone(),
    });
    Ok(Found {
        launcher: Launcher::Slurm,
        rank,
        size,
        local_rank,
        local_size,
        store_addr: slurm_store_addr(env, job.as_deref())?,
        job_id,
    })
}

/// A Slurm tasks-per-node variable when it gives one count for every node
/// (`4`, or `4(x3)`); `None` otherwise.
fn slurm_tasks_per_node(env: &Env, var: &'static str) -> Option<Named> {
    let value = env.get(var)?;
    let count = match value.split_once('(') {
        None => value.as_str(),
        Some((count, rest)) => {
            let reps = rest.strip_prefix('x')?.strip_suffix(')')?;
            reps.parse::<usize>().ok()?;
            count
        }
    };
    count.parse().ok().map(|value| Named { value, var })
}

fn slurm_store_addr(env: &Env, job: Option<&str>) -> Result<String> {
    if let Some(addr) = env.get("FERROCOLL_ADDR") {
        return check_addr("FERROCOLL_ADDR", &addr);
    }
    let master_host = env.get("MASTER_ADDR");
    let master_port = env.get("MASTER_PORT");
    if let (Some(host), Some(port)) = (&master_host, &master_port) {
        let host = check_host("MASTER_ADDR", host)?;
        let port = check_port("MASTER_PORT", port)?;
        return Ok(format!("{host}:{port}"));
    }

    let host = match master_host {
        Some(host) => check_host("MASTER_ADDR", &host)?,
        None => {
            let (var, list) = [
                "SLURM_STEP_NODELIST",
                "SLURM_JOB_NODELIST",
                "SLURM_NODELIST",
            ]
            .into_iter()
            .find_map(|var| env.get(var).map(|list| (var, list)))
            .ok_or_else(|| {
                Error::invalid(
                    "Slurm gives no node list (SLURM_JOB_NODELIST) to find rank 0's host; \
                         set FERROCOLL_ADDR=host:port of the rendezvous store on every task, \
                         e.g. `srun --export=ALL,FERROCOLL_ADDR=node01:29500`",
                )
            })?;
            first_slurm_host(&list).ok_or_else(|| {
                config(
                    var,
                    &list,
                    "not a Slurm host list ferrocoll can read (e.g. node[01-04],gpu7); set \
                     FERROCOLL_ADDR=host:port of the rendezvous store instead",
                )
            })?
        }
    };

    let port = if let Some(port) = env.get("FERROCOLL_PORT") {
        check_port("FERROCOLL_PORT", &port)?
    } else if let Some(port) = master_port {
        check_port("MASTER_PORT", &port)?
    } else {
        let job = job.ok_or_else(|| {
            Error::invalid(
                "Slurm gives no SLURM_JOB_ID to derive the store port from; set \
                 FERROCOLL_PORT=port (or FERROCOLL_ADDR=host:port)",
            )
        })?;
        let id: u64 = job.parse().map_err(|_| {
            config(
                "SLURM_JOB_ID",
                job,
                format!(
                    "{}, so no port can be derived from it; set FERROCOLL_PORT=port (or \
                     FERROCOLL_ADDR=host:port)",
                    crate::env::not_whole(job)
                ),
            )
        })?;
        (20000 + id % 20000) as u16
    };
    Ok(format!("{host}:{port}"))
}

/// The first host of a Slurm host list: `node[01-04],gpu[1-2]` gives
/// `node01` (zero padding kept), `a,b` gives `a`. Several bracket groups in
/// one name (`r[1-2]n[3-4]`) take the first value of each. `None` when the
/// list is malformed.
fn first_slurm_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut chars = list.trim().chars();
    while let Some(c) = chars.next() {
        match c {
            ',' => break,
            '[' => {
                let mut group = String::new();
                loop {
                    match chars.next()? {
                        ']' => break,
                        '[' => return None,
                        c => group.push(c),
                    }
                }
                // "01-03,07" -> "01"; "5" -> "5"; a step ("1-9:2") is ignored.
                let first = group.split(',').next()?.split(['-', ':']).next()?.trim();
                if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                host.push_str(first);
            }
            ']' => return None,
            c if c.is_whitespace() => return None,
            c => host.push(c),
        }
    }
    (!host.is_empty()).then_some(host)
}

/// Checks a `host:port` address (IPv6 as `[addr]:port`) and returns it.
pub(crate) fn check_addr(var: &str, value: &str) -> Result<String> {
    let bad = |why: &str| {
        config(
            var,
            value,
            format!(
                "{why}; set {var}=host:port with a port in 1..=65535, e.g. {var}=node01:29500 \
                 (IPv6: {var}=[::1]:29500)"
            ),
        )
    };
    let (host, port) = if let Some(rest) = value.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("no `]` after the IPv6 address"))?;
        let port = after
            .strip_prefix(':')
            .ok_or_else(|| bad("no `:port` after `]`"))?;
        if host.is_empty() || !host.contains(':') {
            return Err(bad("brackets are for IPv6 addresses only"));
        }
        (host, port)
    } else {
        let (host, port) = value.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        if host.contains(':') {
            return Err(bad("an IPv6 address must be in brackets"));
        }
        (host, port)
    };
    if host.is_empty() {
        return Err(bad("no host before the port"));
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '/' | '[' | ']'))
    {
        return Err(bad("the host has characters a host name cannot have"));
    }
    match port.parse::<u16>() {
        Ok(p) if p >= 1 => Ok(value.to_string()),
        _ => Err(bad("the port is not a number in 1..=65535")),
    }
}

/// Checks a bare host (`MASTER_ADDR`), bracketing a bare IPv6 address so a
/// port can follow.
fn check_host(var: &str, value: &str) -> Result<String> {
    let bad = || {
        config(
            var,
            value,
            format!("not a host name or address; set {var} to the host of rank 0, e.g. node01"),
        )
    };
    if value.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(bad());
    }
    if let Some(inner) = value.strip_prefix('[') {
        match inner.strip_suffix(']') {
            Some(ip) if ip.contains(':') && !ip.contains(['[', ']']) => Ok(value.to_string()),
            _ => Err(bad()),
        }
    } else if value.contains(['[', ']']) {
        Err(bad())
    } else if value.contains(':') {
        Ok(format!("[{value}]"))
    } else {
        Ok(value.to_string())
    }
}

/// Checks a port number in 1..=65535.
fn check_port(var: &str, value: &str) -> Result<u16> {
    match value.parse::<u16>() {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(config(
            var,
            value,
            format!("not a port number in 1..=65535; set {var} to a free port, e.g. 29500"),
        )),
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

/// Longest job id.
const MAX_JOB_ID: usize = 32;

fn is_job_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

fn is_valid_job_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_JOB_ID && id.chars().all(is_job_id_char)
}

/// A launcher's job id made safe for file names: other characters become
/// `_`; one too long keeps its first 19 characters, then `_` and 12 hex
/// digits of a hash of the whole, so distinct ids stay distinct.
fn file_safe_job_id(id: &str) -> String {
    let safe: String = id
        .chars()
        .map(|c| if is_job_id_char(c) { c } else { '_' })
        .collect();
    if safe.len() <= MAX_JOB_ID {
        return safe;
    }
    let prefix: String = safe.chars().take(MAX_JOB_ID - 13).collect();
    format!("{prefix}_{:012x}", fnv1a(&[id]) & 0xffff_ffff_ffff)
}

/// 64-bit FNV-1a over `parts`, each followed by a 0xff byte (which UTF-8
/// never contains) so that `["ab", "c"]` and `["a", "bc"]` differ.
fn fnv1a(parts: &[&str]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for part in parts {
        for &b in part.as_bytes().iter().chain(&[0xff]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

#[cfg(test)]
mod tests;
