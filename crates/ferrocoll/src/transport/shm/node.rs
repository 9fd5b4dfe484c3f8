//! [`ShmNode`]: this rank's segment and the peers' it mapped.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use memmap2::{Advice, MmapOptions};

use super::doorbell::ShmDoorbell;
use super::process::{own_pid, pid_alive, SingleCopyUse};
use super::ring::ShmChannel;
use super::segment::*;
use super::wake;
use super::watch::Watcher;
use crate::transport::channel::{Channel, Doorbell};

/// This rank's segment: its doorbell and one inbound ring per local peer.
///
/// Dropping the node unlinks its file if [`ShmNode::unlink`] was not called
/// yet, so keep it until every peer has attached. Channels and doorbells
/// handed out keep the mappings alive on their own.
pub(crate) struct ShmNode {
    /// File name under `/dev/shm`.
    name: String,
    /// Full path of the file.
    path: PathBuf,
    /// This rank's index among the local ranks.
    local_rank: usize,
    /// Our own segment.
    own: Arc<Segment>,
    /// Peers' segments, by local rank (`own` at `local_rank`).
    peers: Vec<Option<Arc<Segment>>>,
    /// Which channels were handed out (each ring has one producer).
    taken: Vec<AtomicBool>,
    /// Whether the file was unlinked.
    unlinked: AtomicBool,
    /// Which calls channels made from now on send by the single-copy path.
    cma: SingleCopyUse,
    /// Channels made from now on map peers' shared buffers.
    shared: bool,
    /// The thread that learns of dead peers at once (started with the
    /// first channel to another process; `None` inside when it cannot
    /// run).
    watcher: OnceLock<Option<Arc<Watcher>>>,
}

impl ShmNode {
    /// Creates `/dev/shm/ferrocoll-{job}-{local_rank}` (`O_CREAT|O_EXCL`,
    /// mode 0600; a stale file of that name left by a dead run is removed and
    /// the creation retried once), sized for `local_size` inbound rings of
    /// `ring_bytes` each (`ring_bytes`: a power of two, at least 64 KiB),
    /// maps it and writes its header (magic, version, pid, local_size,
    /// ring_bytes). `job` is `[A-Za-z0-9_-]`.
    ///
    /// Fails with `AlreadyExists` if the file belongs to a live process.
    pub(crate) fn create(
        job: &str,
        local_rank: usize,
        local_size: usize,
        ring_bytes: usize,
    ) -> io::Result<ShmNode> {
        validate_job(job)?;
        if local_rank >= local_size {
            return Err(invalid_input(format!(
                "local rank {local_rank} out of range for {local_size} local ranks"
            )));
        }
        if !ring_bytes.is_power_of_two() || ring_bytes < MIN_RING_BYTES {
            return Err(invalid_input(format!(
                "shared-memory ring size {ring_bytes} must be a power of two of at least {MIN_RING_BYTES}"
            )));
        }
        let len = segment_len(local_size, ring_bytes).ok_or_else(|| {
            invalid_input(format!(
                "{local_size} shared-memory rings of {ring_bytes} bytes do not fit in memory"
            ))
        })?;
        let name = format!("{NAME_PREFIX}{job}-{local_rank}");
        let path = Path::new(SHM_DIR).join(&name);

        let file = match create_exclusive(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if let Some(pid) = header_pid(&path) {
                    if pid != own_pid() && pid_alive(pid) {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            format!(
                                "{} is in use by live process {pid} (two jobs with the same name?)",
                                path.display()
                            ),
                        ));
                    }
                }
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(context(
                            e,
                            format_args!("cannot remove stale {}", path.display()),
                        ))
                    }
                }
                create_exclusive(&path)
                    .map_err(|e| context(e, format_args!("cannot create {}", path.display())))?
            }
            Err(e) => return Err(context(e, format_args!("cannot create {}", path.display()))),
        };

        let setup = || -> io::Result<Segment> {
            allocate(&file, len, &path)?;
            let map = MmapOptions::new()
                .len(len)
                .populate()
                .map_raw(&file)
                .map_err(|e| context(e, format_args!("cannot map {}", path.display())))?;
            let seg = Segment {
                map,
                local_size,
                ring_bytes,
                pid: own_pid(),
                // Without one, a rank sleeping in poll(2) with sockets
                // beside its shared-memory peers polls in short slices.
                wake: wake::new_eventfd().ok(),
            };
            seg.write_header();
            Ok(seg)
        };
        let own = match setup() {
            Ok(seg) => Arc::new(seg),
            Err(e) => {
                let _ = fs::remove_file(&path);
                return Err(e);
            }
        };
        let mut peers = vec![None; local_size];
        peers[local_rank] = Some(Arc::clone(&own));
        Ok(ShmNode {
            name,
            path,
            local_rank,
            own,
            peers,
            taken: (0..local_size).map(|_| AtomicBool::new(false)).collect(),
            unlinked: AtomicBool::new(false),
            cma: SingleCopyUse::Off,
            shared: false,
            watcher: OnceLock::new(),
        })
    }

    /// The segment's file name (under `/dev/shm`), for peers to attach.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Maps peer `local_peer`'s segment (created by it, named `name`),
    /// checking magic, version and geometry (the same `local_size` and
    /// `ring_bytes` as ours) and that its creator is alive. Attaching our own
    /// rank under our own name is a no-op.
    pub(crate) fn attach(&mut self, local_peer: usize, name: &str) -> io::Result<()> {
        let local_size = self.own.local_size;
        let ring_bytes = self.own.ring_bytes;
        if local_peer >= local_size {
            return Err(invalid_input(format!(
                "local peer {local_peer} out of range for {local_size} local ranks"
            )));
        }
        if local_peer == self.local_rank {
            return if name == self.name {
                Ok(())
            } else {
                Err(invalid_input(format!(
                    "local rank {local_peer} is this rank, whose segment is {}, not {name}",
                    self.name
                )))
            };
        }
        if !name.starts_with(NAME_PREFIX) || name.contains('/') {
            return Err(invalid_input(format!(
                "{name:?} is not a ferrocoll shared-memory segment name"
            )));
        }
        let path = Path::new(SHM_DIR).join(name);
        let what = || format!("local rank {local_peer}'s segment {}", path.display());
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| context(e, format_args!("cannot open {}", what())))?;
        let len = segment_len(local_size, ring_bytes).expect("our own geometry fits");
        let file_len = file.metadata()?.len();
        if file_len != len as u64 {
            return Err(invalid_data(format!(
                "{} is {file_len} bytes, expected {len} ({local_size} rings of {ring_bytes} bytes)",
                what()
            )));
        }
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&file)
            .map_err(|e| context(e, format_args!("cannot map {}", what())))?;
        let mut seg = Segment {
            map,
            local_size,
            ring_bytes,
            pid: 0,
            wake: None,
        };
        if seg.u64_at(HDR_MAGIC).load(Ordering::Acquire) != MAGIC {
            return Err(invalid_data(format!("{} has no valid header", what())));
        }
        let version = seg.u32_at(HDR_VERSION).load(Ordering::Relaxed);
        if version != VERSION {
            return Err(invalid_data(format!(
                "{} has layout version {version}, expected {VERSION} (mixed ferrocoll versions?)",
                what()
            )));
        }
        let their_size = seg.u64_at(HDR_LOCAL_SIZE).load(Ordering::Relaxed);
        let their_ring = seg.u64_at(HDR_RING_BYTES).load(Ordering::Relaxed);
        let their_eager = seg.u64_at(HDR_EAGER_OFFSET).load(Ordering::Relaxed);
        if their_size != local_size as u64
            || their_ring != ring_bytes as u64
            || their_eager != seg.eager_offset(0) as u64
        {
            return Err(invalid_data(format!(
                "{} has {their_size} rings of {their_ring} bytes, expected {local_size} of {ring_bytes}",
                what()
            )));
        }
        seg.pid = seg.u32_at(HDR_PID).load(Ordering::Relaxed);
        if !pid_alive(seg.pid) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!(
                    "{} belongs to process {}, which has exited",
                    what(),
                    seg.pid
                ),
            ));
        }
        let wake_fd = seg.u32_at(HDR_WAKE_FD).load(Ordering::Relaxed);
        if wake_fd != u32::MAX {
            seg.wake = wake::duplicate_from(seg.pid, wake_fd as i32).ok();
            if seg.wake.is_none() {
                // Our rings cannot wake the peer in poll(2): it must keep
                // polling in slices.
                seg.deaf().store(1, Ordering::SeqCst);
            }
        }
        // Fault in the ring we write (ours, inside the peer's segment) now
        // rather than during the first messages; best effort (Linux >= 5.14).
        let _ = seg.map.advise_range(
            Advice::PopulateWrite,
            seg.ring_offset(self.local_rank),
            RING_DATA + ring_bytes,
        );
        let _ = seg.map.advise_range(
            Advice::PopulateWrite,
            seg.mailbox_offset(self.local_rank),
            MAILBOX_BYTES,
        );
        let _ = seg.map.advise_range(
            Advice::PopulateWrite,
            seg.eager_offset(self.local_rank),
            eager_pair_bytes(seg.local_size),
        );
        self.peers[local_peer] = Some(Arc::new(seg));
        Ok(())
    }

    /// Removes this rank's file from `/dev/shm` (the mapping stays valid).
    /// The caller calls it once every peer has attached, so a killed job
    /// leaves nothing behind. Later calls do nothing.
    pub(crate) fn unlink(&self) {
        if !self.unlinked.swap(true, Ordering::AcqRel) {
            let _ = fs::remove_file(&self.path);
        }
    }

    /// The channel to `local_peer` (attached before): sends write into the
    /// ring for us inside the peer's segment, receives read the ring for that
    /// peer inside our segment. The channel to our own rank is a loopback.
    ///
    /// # Panics
    ///
    /// If `local_peer` was not attached, or its channel was already taken
    /// (a ring has exactly one producer and one consumer).
    pub(crate) fn channel(&self, local_peer: usize) -> Box<dyn Channel> {
        let peer = self
            .peers
            .get(local_peer)
            .cloned()
            .flatten()
            .unwrap_or_else(|| {
                panic!("shm channel to local rank {local_peer}, which is not attached")
            });
        assert!(
            !self.taken[local_peer].swap(true, Ordering::Relaxed),
            "shm channel to local rank {local_peer} requested twice"
        );
        let me = self.local_rank;
        let own = Arc::clone(&self.own);
        let ring_bytes = own.ring_bytes;
        // Nobody has used the rings yet, but start from whatever they hold.
        let head = peer.head(me).load(Ordering::Acquire);
        let tail_seen = peer.tail(me).load(Ordering::Acquire);
        let tail = own.tail(local_peer).load(Ordering::Acquire);
        let head_seen = own.head(local_peer).load(Ordering::Acquire);
        // A peer in another process is watched (one in this process, as in
        // tests, dies with us).
        let (dead, watcher) = if peer.pid != own_pid() {
            let watcher = self
                .watcher
                .get_or_init(|| Watcher::start(Arc::clone(&self.own)).ok().map(Arc::new))
                .clone();
            let dead = watcher.as_ref().and_then(|w| w.watch(peer.pid).ok());
            (dead, watcher)
        } else {
            (None, None)
        };
        Box::new(ShmChannel {
            peer,
            own,
            me,
            them: local_peer,
            cap: ring_bytes as u64,
            mask: ring_bytes - 1,
            piece: (ring_bytes / 4).min(MAX_PIECE),
            head,
            tail_seen,
            tail,
            head_seen,
            cma: self.cma,
            shared: self.shared,
            pidfd: None,
            regions: Vec::new(),
            dead,
            _watcher: watcher,
        })
    }

    /// Lets channels made from now on map their peer's
    /// [`crate::SharedBuffer`]s (the caller has checked that it works).
    pub(crate) fn enable_shared_buffers(&mut self, on: bool) {
        self.shared = on;
    }

    /// The pid of local peer `local_peer` (attached before).
    pub(crate) fn peer_pid(&self, local_peer: usize) -> Option<u32> {
        self.peers.get(local_peer)?.as_ref().map(|seg| seg.pid)
    }

    /// Lets channels made from now on have their peer read the large
    /// messages of the calls `which` carries from our memory (the caller has
    /// checked with [`cma_read`](super::cma_read) that the kernel allows it).
    pub(crate) fn enable_single_copy(&mut self, which: SingleCopyUse) {
        self.cma = which;
    }

    /// The process ids of every local rank, by local rank, when the job
    /// lets its ranks read each other's memory
    /// ([`ShmNode::enable_single_copy`], decided alike on every local rank)
    /// and every peer is attached; else `None`.
    pub(crate) fn pids_if_single_copy(&self) -> Option<Vec<u32>> {
        if self.cma == SingleCopyUse::Off {
            return None;
        }
        self.peers
            .iter()
            .map(|seg| seg.as_ref().map(|seg| seg.pid))
            .collect()
    }

    /// Every local rank's segment, by local rank (ours at
    /// [`ShmNode::local_rank`]); `None` until every local peer is attached.
    /// The fast path's mailboxes (`fastpath::mailbox`) live in them.
    pub(crate) fn segments(&self) -> Option<Vec<Arc<Segment>>> {
        self.peers.iter().cloned().collect()
    }

    /// This rank's index among the local ranks.
    pub(crate) fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// This rank's doorbell (in its own segment).
    pub(crate) fn doorbell(&self) -> Arc<dyn Doorbell> {
        Arc::new(ShmDoorbell {
            seg: Arc::clone(&self.own),
        })
    }
}

impl Drop for ShmNode {
    fn drop(&mut self) {
        self.unlink();
    }
}
