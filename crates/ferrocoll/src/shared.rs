//! Buffers that ranks on the same host can read in place.
//!
//! A [`SharedBuffer`] is memory ferrocoll allocates in an anonymous
//! shared-memory file (`memfd_create`), as MPI's `MPI_Alloc_mem` or NCCL's
//! `ncclMemAlloc` do. When a collective sends from such a buffer to a rank
//! on the same host, the shared-memory transport sends only where the bytes
//! are; the receiving rank maps the file once (`pidfd_getfd`) and reduces or
//! copies straight out of the sender's pages. That removes the two copies
//! through a ring, which is what bounds large shared-memory collectives (see
//! bench/RESULTS.md, issue 4). Everywhere else (threads, TCP, a kernel that
//! forbids `pidfd_getfd`) a shared buffer is ordinary memory and everything
//! works as with a `Vec`.
//!
//! ```
//! use ferrocoll::{local, ReduceOp, SharedBuffer};
//! local::run(2, |comm| {
//!     let mut grads = SharedBuffer::<f32>::new(1 << 16).unwrap();
//!     grads.fill(1.0);
//!     comm.all_reduce_in_place(&mut grads, ReduceOp::Sum).unwrap();
//!     assert!(grads.iter().all(|g| *g == 2.0));
//! }).unwrap();
//! ```

use std::io;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::types::Element;

/// A live shared region of this process.
#[derive(Clone, Copy, Debug)]
struct Region {
    start: usize,
    len: usize,
    fd: i32,
    generation: u32,
}

/// Every live shared buffer of this process, for the transports to look up.
static REGIONS: Mutex<Vec<Region>> = Mutex::new(Vec::new());

/// Tells a re-used file descriptor number from the region it used to name.
static GENERATION: AtomicU32 = AtomicU32::new(1);

/// Where a byte range lies in a shared buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SharedLocation {
    /// The buffer's file descriptor in this process.
    pub fd: u32,
    /// Distinguishes buffers that had the same descriptor number.
    pub generation: u32,
    /// Offset of the range in the buffer.
    pub offset: u64,
}

/// The shared buffer holding all of `ptr..ptr + len`, if any.
pub(crate) fn locate(ptr: *const u8, len: usize) -> Option<SharedLocation> {
    let at = ptr as usize;
    let regions = REGIONS.lock().unwrap_or_else(|e| e.into_inner());
    regions
        .iter()
        .find(|r| at >= r.start && at + len <= r.start + r.len)
        .map(|r| SharedLocation {
            fd: r.fd as u32,
            generation: r.generation,
            offset: (at - r.start) as u64,
        })
}

/// `len` elements of `T` in memory that ranks on this host can read in
/// place (see the [module documentation](self)). Dereferences to `[T]`;
/// starts zeroed.
pub struct SharedBuffer<T: Element> {
    map: memmap2::MmapMut,
    fd: OwnedFd,
    len: usize,
    _elements: PhantomData<T>,
}

impl<T: Element> SharedBuffer<T> {
    /// Allocates `len` zeroed elements.
    pub fn new(len: usize) -> Result<SharedBuffer<T>> {
        let bytes = (len * std::mem::size_of::<T>()).max(1);
        let fail = |what: &str, e: io::Error| {
            Error::invalid(format!(
                "cannot allocate a shared buffer of {bytes} bytes ({what}: {e}); use a Vec instead"
            ))
        };
        // SAFETY: the name is a valid NUL-terminated string; the returned
        // descriptor, if valid, is ours alone and is owned from here on.
        let raw = unsafe { libc::memfd_create(c"ferrocoll-buffer".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(fail("memfd_create", io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let file = std::fs::File::from(fd.try_clone().map_err(|e| fail("dup", e))?);
        file.set_len(bytes as u64)
            .map_err(|e| fail("ftruncate", e))?;
        // SAFETY: the file is ours and sized above; other processes only
        // ever map it read-only (see the transport), so nothing outside this
        // process writes the mapping behind our back.
        let map = unsafe { memmap2::MmapOptions::new().len(bytes).map_mut(&file) }
            .map_err(|e| fail("mmap", e))?;
        let buffer = SharedBuffer {
            map,
            fd,
            len,
            _elements: PhantomData,
        };
        REGIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Region {
                start: buffer.map.as_ptr() as usize,
                len: bytes,
                fd: buffer.fd.as_raw_fd(),
                generation: GENERATION.fetch_add(1, Ordering::Relaxed),
            });
        Ok(buffer)
    }
}

impl<T: Element> Deref for SharedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the mapping is page-aligned (so aligned for every element
        // type), at least `len * size_of::<T>()` bytes long, zero-initialised
        // by the kernel, and every bit pattern is a valid `T` (Element types
        // are plain numbers); the borrow of `self` keeps it mapped.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast(), self.len) }
    }
}

impl<T: Element> DerefMut for SharedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, with the exclusive borrow of `self`.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast(), self.len) }
    }
}

impl<T: Element> Drop for SharedBuffer<T> {
    fn drop(&mut self) {
        let start = self.map.as_ptr() as usize;
        REGIONS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|r| r.start != start);
    }
}

impl<T: Element> std::fmt::Debug for SharedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBuffer")
            .field("len", &self.len)
            .finish()
    }
}

/// A read-only view of another process's shared buffer, mapped through a
/// duplicate of its file descriptor.
pub(crate) struct PeerRegion {
    map: memmap2::Mmap,
}

impl PeerRegion {
    /// Maps the buffer that is descriptor `fd` in the process `pidfd` refers
    /// to (`pidfd_getfd`: needs the same permission as ptrace).
    pub(crate) fn map(pidfd: &OwnedFd, fd: u32) -> io::Result<PeerRegion> {
        // SAFETY: plain system call on a pidfd we own; the result, if valid,
        // is a new descriptor owned by us.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as i32, 0) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(raw as i32) });
        // SAFETY: mapped read-only; the owner may write it while we are not
        // reading (the protocol only reads between the sender posting a
        // message and our acknowledgement, while the sender keeps it still).
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(PeerRegion { map })
    }

    /// Bytes `offset..offset + len`, if inside the mapping.
    pub(crate) fn bytes(&self, offset: u64, len: usize) -> io::Result<&[u8]> {
        let start = offset as usize;
        self.map.get(start..start + len).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "shared buffer range outside the peer's buffer",
            )
        })
    }
}

/// A pidfd for process `pid` (`pidfd_open`).
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain system call; the result, if valid, is ours.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_register_locate_and_unregister() {
        let mut a = SharedBuffer::<u32>::new(1000).unwrap();
        a[999] = 7;
        let base = a.as_ptr() as *const u8;
        let loc = locate(base.wrapping_add(400), 100).unwrap();
        assert_eq!(loc.offset, 400);
        assert!(locate(base.wrapping_add(3999), 2).is_none(), "past the end");
        let v = [0u8; 16];
        assert!(
            locate(v.as_ptr(), 16).is_none(),
            "heap memory is not shared"
        );
        drop(a);
        assert!(locate(base, 4).is_none(), "dropped buffers are forgotten");
    }

    #[test]
    fn a_peer_maps_the_same_pages() {
        let mut a = SharedBuffer::<u64>::new(512).unwrap();
        for (i, x) in a.iter_mut().enumerate() {
            *x = i as u64 * 3;
        }
        let loc = locate(a.as_ptr().cast(), 4096).unwrap();
        // This process plays the peer: the descriptor is looked up through
        // our own pid, exactly as another process would.
        let pidfd = pidfd_open(std::process::id()).unwrap();
        let peer = PeerRegion::map(&pidfd, loc.fd).unwrap();
        let bytes = peer.bytes(8 * 10, 8).unwrap();
        assert_eq!(u64::from_le_bytes(bytes.try_into().unwrap()), 30);
        a[10] = 99;
        let bytes = peer.bytes(8 * 10, 8).unwrap();
        assert_eq!(
            u64::from_le_bytes(bytes.try_into().unwrap()),
            99,
            "same pages"
        );
        assert!(peer.bytes(4090, 16).is_err());
    }
}
