//! The Slurm family (`srun`): rank and size from `SLURM_PROCID` and
//! `SLURM_NTASKS`, tasks per node when every node has the same count, and
//! the store's address from `FERROCOLL_ADDR`, `MASTER_ADDR`/`MASTER_PORT`,
//! or the first host of the step's node list with a port from
//! `FERROCOLL_PORT`, `MASTER_PORT` or the job id.

use super::address::{check_addr, check_host, check_port};
use super::launcher::Launcher;
use super::vars::{config, Env, Found, Named};
use crate::error::{Error, Result};

/// Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, ...).
pub(super) fn slurm(env: &Env) -> Result<Found> {
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

/// The store's address under Slurm (see the [module docs](self)); `job`
/// is `SLURM_JOB_ID`, for the derived port.
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
pub(super) fn first_slurm_host(list: &str) -> Option<String> {
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
