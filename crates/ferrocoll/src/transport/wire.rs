//! The frame format of the multi-process transports.
//!
//! Every message on a shared-memory ring or a TCP stream is a 64-byte frame
//! header followed by the payload, padded to a multiple of 8 bytes so the
//! next header (and every payload) starts 8-byte aligned on the stream:
//!
//! | bytes  | field                                                        |
//! |--------|--------------------------------------------------------------|
//! | 0..4   | magic `FCW3`                                                 |
//! | 4      | frame kind: 0 data, 1 abort, 2 remote data, 3 acknowledgement, 4 shared data, 5 lost rank, 6 goodbye, 7 mismatch verdict, 8 probe, 9 position |
//! | 5      | call kind: collective index, or 0xFE for send/recv           |
//! | 6      | element type index                                           |
//! | 7      | reduction operator index, 0xFF for none                      |
//! | 8..16  | communicator id                                              |
//! | 16..24 | call sequence number (or p2p tag with [`Header::P2P_BIT`])   |
//! | 24..32 | element count the caller passed                              |
//! | 32..40 | root, `u64::MAX` for none                                    |
//! | 40..48 | payload length in bytes                                      |
//! | 48..56 | data: the payload's CRC32C with bit 32 set, when checksums are on (else 0); remote data and acknowledgements: the payload's address in the sender; shared data: its offset in the buffer |
//! | 56..64 | shared data: the buffer (descriptor << 32 \| generation); data: zero, or a rendezvous token (bit 63 set) that the receiver acknowledges once it has matched the message; else zero |
//!
//! *Remote data* is the single-copy path between processes of one host: no
//! payload follows; the receiver reads `len` bytes at the address straight
//! from the sender's memory (`process_vm_readv`) and answers with an
//! acknowledgement carrying the same call key and address, after which the
//! sender may reuse its buffer. A *rendezvous* data frame (longer than
//! `FERROCOLL_EAGER_BYTES`) streams its payload as usual, but its send
//! completes only on an acknowledgement carrying its token, which the
//! receiver sends once a receive has taken the message: so a sender runs
//! at most one matched message ahead of its receiver. *Shared data* is the same for a payload in
//! a [`crate::SharedBuffer`]: the receiver maps that buffer once and reads
//! it in place.
//!
//! Integers are little-endian. The signature travels with every message so
//! the receiver can tell "the peer called something else" from "the peer is
//! late" (see [`crate::Error::Mismatch`]).

use super::{CallKind, Header, Signature};
use crate::plan::Collective;
use crate::types::{DType, ReduceOp};

/// Size of a frame header on the wire.
pub(crate) const HEADER_BYTES: usize = 64;

/// `FCW3` since data frames beyond the eager limit carry a rendezvous
/// token to acknowledge (`FCW2`: mismatch notices became verdicts with a
/// payload): ranks of different builds fail at once with "bad frame magic"
/// instead of misreading each other (an older receiver would never
/// acknowledge, and the sender would wait for its deadline).
const MAGIC: [u8; 4] = *b"FCW3";
const P2P_CODE: u8 = 0xFE;
const NONE_OP: u8 = 0xFF;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// A message of a call; `len` payload bytes follow.
    Data,
    /// The sender's communicator was aborted; no payload.
    Abort,
    /// A message whose `len` bytes the receiver reads from the sender's
    /// memory at `addr`; no payload.
    Remote,
    /// The receiver has read the remote message at `addr` of the call.
    Ack,
    /// A message in the sender's shared buffer `region`, at offset `addr`;
    /// no payload.
    Shared,
    /// Rank `addr` crashed (went away without a goodbye); no payload.
    Lost,
    /// The sender's transport is closing normally; no payload.
    Bye,
    /// A mismatch verdict for the call of the header: `len` payload bytes
    /// name the two ranks and their calls (`engine/verdict.rs`).
    Verdict,
    /// "I have waited long in the call of the header; where are you?": the
    /// receiver compares the call with its own at that point (a mismatch
    /// that no message revealed, such as two ranks that only receive) and
    /// answers with a position; no payload.
    Probe,
    /// Where the sender is on the header's communicator: `len` payload bytes
    /// of text (`in all_reduce(...) #183`), for the desync report of a
    /// timeout.
    Position,
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Frame {
    pub kind: FrameKind,
    pub header: Header,
    /// Payload bytes (before padding).
    pub len: usize,
    /// For [`FrameKind::Data`]: the payload's CRC32C with bit 32 set, or 0
    /// without checksums. For [`FrameKind::Remote`] and [`FrameKind::Ack`]:
    /// the payload's address in the sender's memory (for [`FrameKind::Shared`], the
    /// offset in its buffer).
    pub addr: u64,
    /// For [`FrameKind::Shared`]: which buffer (descriptor << 32 |
    /// generation).
    pub region: u64,
}

/// Payload length rounded up to the 8-byte stream alignment.
pub(crate) fn padded(len: usize) -> usize {
    len.next_multiple_of(8)
}

fn index_of<T: PartialEq>(all: &[T], x: &T) -> u8 {
    all.iter()
        .position(|a| a == x)
        .expect("value is in its ALL list") as u8
}

impl Frame {
    /// A data frame for `len` payload bytes of the call `header`.
    pub(crate) fn data(header: Header, len: usize) -> Frame {
        Frame {
            kind: FrameKind::Data,
            header,
            len,
            addr: 0,
            region: 0,
        }
    }

    /// The bytes of this header.
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        let sig = &self.header.sig;
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = match self.kind {
            FrameKind::Data => 0,
            FrameKind::Abort => 1,
            FrameKind::Remote => 2,
            FrameKind::Ack => 3,
            FrameKind::Shared => 4,
            FrameKind::Lost => 5,
            FrameKind::Bye => 6,
            FrameKind::Verdict => 7,
            FrameKind::Probe => 8,
            FrameKind::Position => 9,
        };
        b[5] = match sig.kind {
            CallKind::Collective(c) => index_of(&Collective::ALL, &c),
            CallKind::PointToPoint => P2P_CODE,
        };
        b[6] = index_of(&DType::ALL, &sig.dtype);
        b[7] = sig.op.map_or(NONE_OP, |op| index_of(&ReduceOp::ALL, &op));
        b[8..16].copy_from_slice(&self.header.comm.to_le_bytes());
        b[16..24].copy_from_slice(&self.header.seq.to_le_bytes());
        b[24..32].copy_from_slice(&(sig.count as u64).to_le_bytes());
        let root = sig.root.map_or(u64::MAX, |r| r as u64);
        b[32..40].copy_from_slice(&root.to_le_bytes());
        b[40..48].copy_from_slice(&(self.len as u64).to_le_bytes());
        b[48..56].copy_from_slice(&self.addr.to_le_bytes());
        b[56..64].copy_from_slice(&self.region.to_le_bytes());
        b
    }

    /// Parses a header; `Err` says what is wrong with it (a corrupted or
    /// foreign stream).
    pub(crate) fn decode(b: &[u8]) -> Result<Frame, String> {
        let b: &[u8; HEADER_BYTES] = b
            .get(..HEADER_BYTES)
            .and_then(|s| s.try_into().ok())
            .ok_or("short frame header")?;
        if b[0..4] != MAGIC {
            return Err(format!("bad frame magic {:02x?}", &b[0..4]));
        }
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let kind = match b[4] {
            0 => FrameKind::Data,
            1 => FrameKind::Abort,
            2 => FrameKind::Remote,
            3 => FrameKind::Ack,
            4 => FrameKind::Shared,
            5 => FrameKind::Lost,
            6 => FrameKind::Bye,
            7 => FrameKind::Verdict,
            8 => FrameKind::Probe,
            9 => FrameKind::Position,
            k => return Err(format!("unknown frame kind {k}")),
        };
        let call = match b[5] {
            P2P_CODE => CallKind::PointToPoint,
            c => CallKind::Collective(
                *Collective::ALL
                    .get(c as usize)
                    .ok_or_else(|| format!("unknown collective code {c}"))?,
            ),
        };
        let dtype = *DType::ALL
            .get(b[6] as usize)
            .ok_or_else(|| format!("unknown element type code {}", b[6]))?;
        let op = match b[7] {
            NONE_OP => None,
            o => Some(
                *ReduceOp::ALL
                    .get(o as usize)
                    .ok_or_else(|| format!("unknown operator code {o}"))?,
            ),
        };
        let root = word(32);
        Ok(Frame {
            kind,
            header: Header {
                comm: word(8),
                seq: word(16),
                sig: Signature {
                    kind: call,
                    dtype,
                    op,
                    count: word(24) as usize,
                    root: (root != u64::MAX).then_some(root as usize),
                },
            },
            len: word(40) as usize,
            addr: word(48),
            region: word(56),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        for (i, c) in Collective::ALL.iter().enumerate() {
            let header = Header {
                comm: 0xdead_beef_0000 + i as u64,
                seq: 17 + i as u64,
                sig: Signature {
                    kind: CallKind::Collective(*c),
                    dtype: DType::ALL[i % DType::ALL.len()],
                    op: (i % 2 == 0).then_some(ReduceOp::ALL[i % ReduceOp::ALL.len()]),
                    count: 1 << i,
                    root: (i % 3 == 0).then_some(i),
                },
            };
            let frame = Frame::data(header, 12345 + i);
            assert_eq!(Frame::decode(&frame.encode()), Ok(frame));
        }
        let p2p = Header {
            comm: 1,
            seq: Header::P2P_BIT | 7,
            sig: Signature {
                kind: CallKind::PointToPoint,
                dtype: DType::U8,
                op: None,
                count: 0,
                root: None,
            },
        };
        for kind in [
            FrameKind::Abort,
            FrameKind::Remote,
            FrameKind::Ack,
            FrameKind::Shared,
            FrameKind::Lost,
            FrameKind::Bye,
            FrameKind::Verdict,
            FrameKind::Probe,
            FrameKind::Position,
        ] {
            let frame = Frame {
                kind,
                header: p2p,
                len: 1 << 20,
                addr: 0x7fff_1234_5678,
                region: 5 << 32 | 9,
            };
            assert_eq!(Frame::decode(&frame.encode()), Ok(frame));
        }
    }

    #[test]
    fn garbage_is_rejected_with_a_reason() {
        let mut b = Frame::data(
            Header {
                comm: 0,
                seq: 0,
                sig: Signature {
                    kind: CallKind::PointToPoint,
                    dtype: DType::F32,
                    op: None,
                    count: 0,
                    root: None,
                },
            },
            0,
        )
        .encode();
        b[6] = 200;
        assert!(Frame::decode(&b).unwrap_err().contains("element type"));
        b[0] = b'X';
        assert!(Frame::decode(&b).unwrap_err().contains("magic"));
        assert!(Frame::decode(&b[..10]).is_err());
        assert_eq!(padded(0), 0);
        assert_eq!(padded(1), 8);
        assert_eq!(padded(16), 16);
    }
}
