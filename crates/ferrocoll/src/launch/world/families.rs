//! The variable families of `ferrocoll run`, torchrun, Open MPI and PMI
//! (MPICH, Intel MPI): each reads its rank, size, local rank and size, job
//! id and the store's address (`FERROCOLL_ADDR`, else `MASTER_ADDR` and
//! `MASTER_PORT`) into a [`Found`]. Slurm's, which derives the address from
//! its node list, is in `slurm.rs`.

use super::address::{check_addr, check_host, check_port};
use super::job_id::is_valid_job_id;
use super::launcher::Launcher;
use super::vars::{config, Env, Found};
use crate::error::{Error, Result};

/// `ferrocoll run` (or the same variables set by hand): `FERROCOLL_RANK`,
/// `FERROCOLL_WORLD_SIZE` and `FERROCOLL_ADDR`, all required.
pub(super) fn ferrocoll(env: &Env) -> Result<Found> {
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

/// torchrun, or `RANK` and `WORLD_SIZE` set by hand.
pub(super) fn torchrun(env: &Env) -> Result<Found> {
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

/// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
pub(super) fn open_mpi(env: &Env) -> Result<Found> {
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

/// A PMI launcher: MPICH's Hydra, Intel MPI (`PMI_RANK`, `PMI_SIZE`).
pub(super) fn pmi(env: &Env) -> Result<Found> {
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
