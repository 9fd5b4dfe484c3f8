//! Setting up the ranks of one host: pinning to cores, the shared-memory
//! segments and what they can do (single-copy reads, mapped shared
//! buffers, the small-call fast path), agreed through the rendezvous store.

use super::rendezvous::Rendezvous;
use super::settings::{BindMode, LaunchSettings, SingleCopy};
use super::waits::store_error;
use super::world::WorldSpec;
use crate::error::{Error, Result};
use crate::transport::config::TransportConfig;
use crate::transport::shm::{ShmNode, SingleCopyUse};

/// Ring size for `local` ranks on a node: `FERROCOLL_SHM_RING_BYTES` when
/// set (`chosen`), else about 32 MiB of shared memory per node in all
/// (local² rings), each ring 64 KiB to 4 MiB.
pub(super) fn ring_bytes(local: usize, chosen: Option<usize>) -> usize {
    if let Some(b) = chosen {
        return b;
    }
    let budget = (32usize << 20) / (local.saturating_mul(local)).max(1);
    let pow = if budget.is_power_of_two() {
        budget
    } else {
        budget.next_power_of_two() / 2
    };
    pow.clamp(64 << 10, 4 << 20)
}

/// Pins this process to one CPU when `FERROCOLL_BIND` asks for it (`core`),
/// or by default (`auto`) when the host's ranks fit one per allowed CPU:
/// two ranks that wake each other otherwise drift onto one core (the
/// scheduler's wake-affinity), where every hand-off costs a context switch.
/// Oversubscribed hosts are left to the scheduler. `none` never pins.
/// Returns whether this rank now has a core to itself.
pub(super) fn bind_to_core(local_rank: usize, local_size: usize, mode: BindMode) -> Result<bool> {
    if mode == BindMode::None {
        return Ok(false);
    }
    // SAFETY: cpu_set_t is plain data; sched_getaffinity/sched_setaffinity
    // read and write exactly one cpu_set_t of the size passed, for this
    // process (pid 0).
    unsafe {
        let mut allowed: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) != 0 {
            return Ok(false);
        }
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &allowed))
            .collect();
        if cpus.is_empty() || (mode == BindMode::Auto && local_size > cpus.len()) {
            return Ok(false);
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpus[local_rank % cpus.len()], &mut one);
        // Best effort: a container may forbid it, and nothing depends on it.
        let pinned = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) == 0;
        Ok(pinned && local_size <= cpus.len())
    }
}

/// Known bytes whose address every local rank publishes, so its peers can
/// test whether they may read its memory.
static CMA_PROBE: &[u8; 16] = b"ferrocoll-cma-ok";

/// Bytes of the buffer timed to decide on the single-copy path.
const SPEED_PROBE_BYTES: usize = 4 << 20;

/// Bytes per second of reading [`SPEED_PROBE_BYTES`] at `addr` of process
/// `pid`, and of a local copy of as many bytes (best of 3 each; 0 if the
/// read fails). The single copy pays when it is clearly faster than the two
/// copies a ring makes: reading must beat 1/1.5 of one local copy, which
/// leaves room for its acknowledgement round trip.
fn single_copy_speeds(pid: u32, addr: u64) -> (f64, f64) {
    let mut dst = vec![0u8; SPEED_PROBE_BYTES];
    let src = vec![1u8; SPEED_PROBE_BYTES];
    let mut best_remote = f64::MAX;
    let mut best_local = f64::MAX;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        for (i, d) in dst.chunks_mut(256 << 10).enumerate() {
            if crate::transport::shm::cma_read(pid, addr + (i * (256 << 10)) as u64, d).is_err() {
                return (0.0, 1.0);
            }
        }
        best_remote = best_remote.min(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        best_local = best_local.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    let bytes = SPEED_PROBE_BYTES as f64;
    (bytes / best_remote, bytes / best_local)
}

/// Creates this rank's segment, attaches every local peer's, and removes
/// the files once all are mapped. Also returns whether every local rank
/// agreed to the small-call fast path (it must be all or none: both sides
/// of a call take the same path).
pub(super) fn setup_shm(
    spec: &WorldSpec,
    store: &mut dyn Rendezvous,
    locals: &[usize],
    debug: bool,
    node: usize,
    transport: &TransportConfig,
    settings: &LaunchSettings,
) -> Result<(ShmNode, bool)> {
    // The fast path (`FERROCOLL_SHM_FAST`) is off with checksums: they
    // guard the rings, so with them every message takes the rings.
    let fast_wanted = settings.shm_fast && !transport.checksums;
    let rank = spec.rank;
    let me = locals
        .iter()
        .position(|&r| r == rank)
        .expect("rank is local");
    let job = format!("{}-n{node}", spec.job_id);
    let shm_err = |what: String, e: std::io::Error| match settings.ring_bytes {
        // Rings sized by hand: the likely cause of a segment that does not fit.
        Some(bytes) => Error::Config {
            var: "FERROCOLL_SHM_RING_BYTES".into(),
            value: bytes.to_string(),
            reason: format!(
                "{what}: {e}; {} rings of {bytes} bytes per rank need about {} MiB of /dev/shm \
                 on this host: give a smaller power of two, or unset it (32 MiB per host in all)",
                locals.len(),
                (locals.len() * locals.len()).saturating_mul(bytes) >> 20
            ),
        },
        None => Error::Config {
            var: "FERROCOLL_TRANSPORT".into(),
            value: "shm".into(),
            reason: format!(
                "{what}: {e}; is /dev/shm mounted and large enough? (FERROCOLL_TRANSPORT=tcp \
                 avoids it)"
            ),
        },
    };
    let mut node_seg = ShmNode::create(
        &job,
        me,
        locals.len(),
        ring_bytes(locals.len(), settings.ring_bytes),
    )
    .map_err(|e| {
        shm_err(
            format!("rank {rank} cannot create its shared-memory segment"),
            e,
        )
    })?;
    store.set(&format!("shm/{node}/{me}"), node_seg.name().as_bytes())?;
    let probe_addr = CMA_PROBE.as_ptr() as u64;
    store.set(
        &format!("shm/{node}/{me}/probe"),
        probe_addr.to_string().as_bytes(),
    )?;
    // A buffer peers time reading, to judge whether the single copy pays.
    let speed_probe = vec![7u8; SPEED_PROBE_BYTES];
    // A shared buffer peers try to map, to know whether buffers from
    // `SharedBuffer::new` can be read in place.
    let mut map_probe = crate::shared::SharedBuffer::<u8>::new(4096)?;
    map_probe[..16].copy_from_slice(CMA_PROBE);
    let map_fd = crate::shared::locate(map_probe.as_ptr(), 16).map_or(u32::MAX, |l| l.fd);
    store.set(
        &format!("shm/{node}/{me}/mapfd"),
        map_fd.to_string().as_bytes(),
    )?;
    let speed_addr = speed_probe.as_ptr() as u64;
    store.set(
        &format!("shm/{node}/{me}/speed"),
        speed_addr.to_string().as_bytes(),
    )?;
    for (lp, &peer) in locals.iter().enumerate() {
        if peer == rank {
            continue;
        }
        let name = store
            .wait(&[&format!("shm/{node}/{lp}")])
            .map_err(|e| store_error(e, "exchanging shared-memory segment names"))?
            .remove(0);
        let name = String::from_utf8_lossy(&name).into_owned();
        node_seg.attach(lp, &name).map_err(|e| {
            shm_err(
                format!("rank {rank} cannot map rank {peer}'s segment {name}"),
                e,
            )
        })?;
    }
    // The single-copy path (the receiver reads the sender's memory with
    // process_vm_readv) is used only if every local rank can read every
    // other: the kernel, Yama's ptrace_scope or a seccomp filter may forbid
    // it, and then the rings carry everything.
    let mode = settings.single_copy;
    let mut can_read_all = mode != SingleCopy::Off;
    // Whether reading a peer's memory is fast enough to replace two copies
    // through a ring (as timed here): page pinning makes process_vm_readv
    // slow on some kernels and virtual machines. One read replaces two
    // copies and the ring's hand-offs (a sender waiting for room), so it
    // pays well below a copy's speed: on the project's VM allgather and
    // alltoall gained with reads timed here at 0.12-0.9 of a copy (the
    // ranks probe at once, and the local copy is timed in cache, so the
    // ratio is noisy and low). A tenth is the floor under which the
    // kernel's read is taken to be broken.
    let mut pays = true;
    for (lp, &peer) in locals.iter().enumerate() {
        if peer == rank || !can_read_all {
            continue;
        }
        let addr = store.wait(&[&format!("shm/{node}/{lp}/probe")])?.remove(0);
        let addr: u64 = String::from_utf8_lossy(&addr).parse().unwrap_or(0);
        let mut got = [0u8; 16];
        let ok = node_seg.peer_pid(lp).is_some_and(|pid| {
            crate::transport::shm::cma_read(pid, addr, &mut got).is_ok() && got == *CMA_PROBE
        });
        can_read_all &= ok;
        // Unit tests run many worlds of threads at once on few cores, where
        // the timing below says "does not pay" by chance: they take the
        // single copy wherever the kernel allows it, so that the paths they
        // check do not depend on the machine's load.
        if ok && mode == SingleCopy::Auto && pays && !cfg!(test) {
            let addr = store.wait(&[&format!("shm/{node}/{lp}/speed")])?.remove(0);
            let addr: u64 = String::from_utf8_lossy(&addr).parse().unwrap_or(0);
            let pid = node_seg.peer_pid(lp).expect("attached");
            let (remote, local) = single_copy_speeds(pid, addr);
            pays = remote > local / 10.0;
            if debug {
                eprintln!(
                    "ferrocoll: rank {rank}: reading rank {peer}'s memory (process_vm_readv) {:.1} GB/s, \
                     a local copy {:.1} GB/s: single-copy path {}",
                    remote / 1e9,
                    local / 1e9,
                    if pays { "pays" } else { "does not pay" }
                );
            }
        }
    }
    let can_read_all = can_read_all && (mode == SingleCopy::On || pays);
    // Whether every local peer's shared buffers can be mapped here.
    let mut can_map_all = true;
    for (lp, &peer) in locals.iter().enumerate() {
        if peer == rank || !can_map_all {
            continue;
        }
        let fd = store.wait(&[&format!("shm/{node}/{lp}/mapfd")])?.remove(0);
        let fd: u32 = String::from_utf8_lossy(&fd).parse().unwrap_or(u32::MAX);
        let pid = node_seg.peer_pid(lp).expect("attached");
        can_map_all = crate::shared::pidfd_open(pid)
            .and_then(|pidfd| crate::shared::PeerRegion::map(&pidfd, fd))
            .is_ok_and(|region| region.bytes(0, 16).is_ok_and(|b| b == CMA_PROBE));
    }
    let verdict = format!(
        "{}{}{}",
        u8::from(can_read_all),
        u8::from(can_map_all),
        u8::from(fast_wanted)
    );
    store.set(&format!("shm/{node}/{me}/cma"), verdict.as_bytes())?;
    let keys: Vec<String> = (0..locals.len())
        .map(|lp| format!("shm/{node}/{lp}/cma"))
        .collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let verdicts = store.wait(&refs)?;
    let which = if !verdicts.iter().all(|v| v.first() == Some(&b'1')) {
        SingleCopyUse::Off
    } else if mode == SingleCopy::On {
        SingleCopyUse::All
    } else if (1..locals.len()).contains(&crate::cost::online_cpus()) {
        SingleCopyUse::ExchangesBroadcastsAndReductions
    } else {
        SingleCopyUse::ExchangesAndBroadcasts
    };
    if debug {
        eprintln!("ferrocoll: rank {rank}: single copy for {which:?}");
    }
    node_seg.enable_single_copy(which);
    let map_all = verdicts.iter().all(|v| v.get(1) == Some(&b'1'));
    node_seg.enable_shared_buffers(map_all);
    let fast_all = verdicts.iter().all(|v| v.get(2) == Some(&b'1'));
    if debug {
        eprintln!(
            "ferrocoll: rank {rank}: small collectives {}",
            if fast_all {
                "take the shared-memory fast path"
            } else {
                "go through the rings (FERROCOLL_SHM_FAST=off or checksums on some rank)"
            }
        );
    }
    if debug {
        eprintln!(
            "ferrocoll: rank {rank}: peers' SharedBuffers {} in place",
            if map_all {
                "are read"
            } else {
                "cannot be read"
            }
        );
    }
    drop(map_probe);
    // Peers are done timing our buffer once every rank has published its
    // verdict (the wait above).
    drop(speed_probe);

    // Once every local rank has mapped every segment, the files can go: a
    // killed job then leaves nothing behind in /dev/shm.
    store
        .barrier(&format!("shm/{node}/mapped"), locals.len())
        .map_err(|e| store_error(e, "the shared-memory barrier"))?;
    node_seg.unlink();
    Ok((node_seg, fast_all))
}
