//! The engine's data on its way in and out: frames queued for a peer
//! ([`Outbound`]), the receive state of a peer's stream ([`Rx`]), messages
//! nobody had asked for yet ([`Unexpected`]), matched remote-data messages
//! still to be read ([`RemoteRead`]), and the control frames.

use std::collections::VecDeque;

use crate::transport::wire::{Frame, FrameKind, HEADER_BYTES};
use crate::transport::{Header, Sink};

/// Payloads up to this size are copied next to their header so a small
/// message leaves in one write (one system call on TCP).
pub(super) const INLINE_BYTES: usize = 16 * 1024;

/// Flag in a data frame's address field marking a CRC32C in its low bits.
pub(super) const CRC_PRESENT: u64 = 1 << 32;

const ZEROS: [u8; 8] = [0; 8];

/// A raw pointer to a caller's sink, valid while its call is registered.
#[derive(Clone, Copy)]
pub(super) struct SinkPtr(pub(super) *mut (dyn Sink + 'static));

// SAFETY: the sink belongs to a thread blocked inside `exchange` for as long
// as the pointer is registered (it is removed before `exchange` returns), and
// it is only used while holding the engine's mutex, so exactly one thread uses
// it at a time. The executor's sink holds raw pointers into buffers that the
// blocked caller keeps borrowed for the duration of the call.
unsafe impl Send for SinkPtr {}

/// A frame queued for one peer.
pub(super) struct Outbound {
    /// The call that sent it (`None` for control frames and for data whose
    /// call has already returned with an error, see `detach`).
    pub(super) call: Option<usize>,
    /// Header, followed by the whole payload and padding when it is small.
    pub(super) prefix: Vec<u8>,
    /// Payload not in `prefix`: caller memory, or `owned` after a detach.
    pub(super) data: *const u8,
    pub(super) len: usize,
    /// Keeps a detached payload alive.
    pub(super) owned: Vec<u8>,
    /// Bytes written so far out of `prefix.len() + len + pad`.
    pub(super) done: usize,
    pub(super) pad: usize,
    /// A remote-data frame: the send completes when the peer acknowledges
    /// having read `remote_addr`, not when the frame is written.
    pub(super) remote_addr: Option<u64>,
    /// A control notice (mismatch, lost rank, abort): once written, alert
    /// the peer (`Channel::alert`), which may be busy on the fast path.
    pub(super) alert: bool,
}

// SAFETY: `data` points into the sending caller's buffer, which that caller
// keeps borrowed while `call` is registered (it is blocked in `exchange`), or
// into `owned`. Only the thread holding the engine mutex reads through it.
unsafe impl Send for Outbound {}

impl Outbound {
    /// A frame that is all header (control frames, remote and shared data):
    /// `remote_addr` set when its send completes on the peer's
    /// acknowledgement.
    pub(super) fn header_only(
        call: Option<usize>,
        prefix: Vec<u8>,
        remote_addr: Option<u64>,
    ) -> Outbound {
        Outbound {
            call,
            prefix,
            data: std::ptr::null(),
            len: 0,
            owned: Vec::new(),
            done: 0,
            pad: 0,
            remote_addr,
            alert: false,
        }
    }

    /// A control notice: a header-only frame of no call, whose peer is
    /// alerted once it is written.
    pub(super) fn notice(prefix: Vec<u8>) -> Outbound {
        Outbound {
            alert: true,
            ..Outbound::header_only(None, prefix, None)
        }
    }

    pub(super) fn total(&self) -> usize {
        self.prefix.len() + self.len + self.pad
    }

    /// The next bytes to write (a prefix of what is left).
    pub(super) fn remaining(&self) -> &[u8] {
        let p = self.prefix.len();
        if self.done < p {
            &self.prefix[self.done..]
        } else if self.done < p + self.len {
            // SAFETY: `data..data+len` is valid for reads (see `unsafe impl
            // Send for Outbound`), and `done - p < len`.
            unsafe {
                std::slice::from_raw_parts(self.data.add(self.done - p), p + self.len - self.done)
            }
        } else {
            &ZEROS[..self.total() - self.done]
        }
    }

    /// Copies the unwritten payload into `owned`, so the frame can finish
    /// after its caller has returned (a half-written frame cannot be taken
    /// back from a stream).
    pub(super) fn detach(&mut self) {
        let p = self.prefix.len();
        if self.len > 0 {
            let from = self.done.saturating_sub(p).min(self.len);
            // SAFETY: as in `remaining`; the caller is still inside exchange.
            let rest = unsafe { std::slice::from_raw_parts(self.data.add(from), self.len - from) };
            let mut owned = vec![0u8; self.len];
            owned[from..].copy_from_slice(rest);
            self.owned = owned;
            self.data = self.owned.as_ptr();
        }
        self.call = None;
    }
}

/// Where the payload of the frame being received goes.
pub(super) enum Target {
    /// Receive `idx` of call `call`.
    Posted { call: usize, idx: usize },
    /// Nobody has asked for it yet.
    Unexpected(Vec<u64>),
    /// Its call failed or left: drop the bytes.
    Discard,
    /// The payload of a control frame (a mismatch verdict, a position),
    /// read whole before it is handled.
    Control(Vec<u64>),
}

/// Receive side of one peer's stream.
pub(super) enum Rx {
    Header {
        buf: [u8; HEADER_BYTES],
        have: usize,
    },
    Body {
        frame: Frame,
        target: Target,
        got: usize,
        /// Running CRC32C of the payload so far (checked at the end when
        /// the frame carries one).
        crc: u32,
        /// The bytes of a word begun in the unexpected buffer of a message
        /// a reducing receive took while it arrived ([`Core::take_arriving`]):
        /// they go to the receive with the bytes that complete the word.
        ///
        /// [`Core::take_arriving`]: super::core::Core
        carry: Carry,
    },
}

/// Up to 7 bytes that begin a word of a payload, held until the rest of
/// the word arrives (see `Rx::Body::carry`).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Carry {
    pub(super) bytes: [u8; 8],
    pub(super) len: usize,
}

impl Rx {
    /// Waiting for the first byte of the next frame's header.
    pub(super) fn next_header() -> Rx {
        Rx::Header {
            buf: [0; HEADER_BYTES],
            have: 0,
        }
    }
}

/// A complete message nobody had asked for when it arrived.
pub(super) struct Unexpected {
    pub(super) header: Header,
    pub(super) len: usize,
    pub(super) data: Vec<u64>,
    /// A remote or shared-data message: `data` is empty and the bytes are
    /// still in the sender's memory at this address (or offset of this
    /// shared buffer).
    pub(super) remote: Option<(u64, Option<u64>)>,
    /// Its checksum did not match: the receive that takes it fails.
    pub(super) corrupt: bool,
    /// A rendezvous send: the token to acknowledge once a receive takes it
    /// (the sender's call waits for that).
    pub(super) ack: Option<u64>,
}

/// A remote-data message matched to a receive, to be read from the sender.
pub(super) struct RemoteRead {
    pub(super) header: Header,
    pub(super) call: usize,
    pub(super) idx: usize,
    pub(super) addr: u64,
    pub(super) len: usize,
    /// In the sender's shared buffer `region` (at offset `addr`) rather
    /// than at address `addr` of its memory.
    pub(super) region: Option<u64>,
}

/// A control frame (no call, no payload) carrying `value` in its address
/// field: a lost rank, or nothing.
pub(super) fn control_frame(kind: FrameKind, value: u64) -> Vec<u8> {
    Frame {
        kind,
        header: Header {
            comm: 0,
            seq: 0,
            sig: crate::transport::Signature {
                kind: crate::transport::CallKind::PointToPoint,
                dtype: crate::types::DType::U8,
                op: None,
                count: 0,
                root: None,
            },
        },
        len: 0,
        addr: value,
        region: 0,
    }
    .encode()
    .to_vec()
}

/// Queues control frame `bytes` right after the frame being written (a
/// half-written frame cannot be interrupted), ahead of the data behind it.
pub(super) fn push_between_frames(sendq: &mut VecDeque<Outbound>, bytes: &[u8]) {
    let at = usize::from(sendq.front().is_some_and(|o| o.done > 0));
    sendq.insert(at, Outbound::notice(bytes.to_vec()));
}
