//! Mismatch verdicts: which two ranks disagree at which call, as the rank
//! that found it words it, and how a verdict travels.
//!
//! The rank that finds a mismatch (a message whose signature or length
//! differs from its own call's) fails its call, and sends the verdict to
//! every peer it has a channel to when the call is a collective (only to the
//! other rank for point-to-point): every rank of the communicator must fail,
//! also a third rank waiting on one of the two, which otherwise would wait
//! for a message that never comes until its deadline. A rank that learns of
//! a verdict first passes it on once (over TCP a rank may have no channel to
//! the detector yet), so it floods the graph of open channels.

use crate::error::Error;
use crate::transport::wire::{padded, Frame, FrameKind, HEADER_BYTES};
use crate::transport::{CallKind, Header};

/// Longest control payload (a verdict, a position) accepted from a peer:
/// call descriptions are a few hundred bytes; more is a corrupt stream.
pub(super) const MAX_CONTROL_BYTES: usize = 16 * 1024;

/// A mismatch, found by rank `a` between its call and rank `b`'s message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The call of rank `a` at that point (communicator, sequence number
    /// and signature).
    pub(crate) header: Header,
    /// The rank that found the mismatch.
    pub(crate) a: usize,
    /// Its call, described.
    pub(crate) a_call: String,
    /// The rank whose message disagreed.
    pub(crate) b: usize,
    /// That rank's call, described (with the lengths when only they differ).
    pub(crate) b_call: String,
}

impl Verdict {
    /// The call's key, which the verdict fails on every rank.
    pub(crate) fn key(&self) -> (u64, u64) {
        self.header.key()
    }

    /// Whether every rank must learn of it (a collective) or only the two
    /// ranks involved (point-to-point).
    pub(crate) fn is_collective(&self) -> bool {
        matches!(self.header.sig.kind, CallKind::Collective(_))
    }

    /// The error rank `me` fails with: from its own side when it is one of
    /// the two, else as the finder saw it.
    pub(crate) fn error_for(&self, me: usize) -> Error {
        if me == self.b {
            Error::Mismatch {
                rank: self.b,
                local: self.b_call.clone(),
                peer: self.a,
                remote: self.a_call.clone(),
            }
        } else {
            Error::Mismatch {
                rank: self.a,
                local: self.a_call.clone(),
                peer: self.b,
                remote: self.b_call.clone(),
            }
        }
    }

    /// The frame (header and payload) that carries it: the header names the
    /// call; the payload holds the two ranks and descriptions as
    /// `a: u64, b: u64, len(a_call): u32, len(b_call): u32, a_call, b_call`,
    /// little-endian, padded to 8 bytes.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(24 + self.a_call.len() + self.b_call.len());
        payload.extend_from_slice(&(self.a as u64).to_le_bytes());
        payload.extend_from_slice(&(self.b as u64).to_le_bytes());
        payload.extend_from_slice(&(self.a_call.len() as u32).to_le_bytes());
        payload.extend_from_slice(&(self.b_call.len() as u32).to_le_bytes());
        payload.extend_from_slice(self.a_call.as_bytes());
        payload.extend_from_slice(self.b_call.as_bytes());
        let frame = Frame {
            kind: FrameKind::Verdict,
            header: self.header,
            len: payload.len(),
            addr: 0,
            region: 0,
        };
        let mut bytes = Vec::with_capacity(HEADER_BYTES + padded(payload.len()));
        bytes.extend_from_slice(&frame.encode());
        bytes.extend_from_slice(&payload);
        bytes.resize(HEADER_BYTES + padded(payload.len()), 0);
        bytes
    }

    /// Reads a verdict from its frame's header and payload; `Err` says what
    /// is wrong with a payload that is not one.
    pub(super) fn decode(header: Header, payload: &[u8]) -> Result<Verdict, String> {
        let word = |at: usize, n: usize| -> Result<u64, String> {
            let b = payload
                .get(at..at + n)
                .ok_or_else(|| format!("verdict of {} bytes is too short", payload.len()))?;
            let mut w = [0u8; 8];
            w[..n].copy_from_slice(b);
            Ok(u64::from_le_bytes(w))
        };
        let (a, b) = (word(0, 8)? as usize, word(8, 8)? as usize);
        let (la, lb) = (word(16, 4)? as usize, word(20, 4)? as usize);
        let text = |from: usize, len: usize| -> Result<String, String> {
            let bytes = payload
                .get(from..from + len)
                .ok_or("verdict text runs past its payload")?;
            String::from_utf8(bytes.to_vec()).map_err(|_| "verdict text is not UTF-8".to_string())
        };
        Ok(Verdict {
            header,
            a,
            a_call: text(24, la)?,
            b,
            b_call: text(24 + la, lb)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Collective;
    use crate::transport::Signature;
    use crate::types::DType;

    #[test]
    fn a_verdict_survives_the_wire_and_reads_from_each_side() {
        let header = Header {
            comm: 7,
            seq: 183,
            sig: Signature {
                kind: CallKind::Collective(Collective::AllReduce),
                dtype: DType::F32,
                op: None,
                count: 256,
                root: None,
            },
        };
        let v = Verdict {
            header,
            a: 1,
            a_call: "all_reduce(count=256, f32, sum)".into(),
            b: 0,
            b_call: "broadcast(count=256, f32, root=0)".into(),
        };
        let bytes = v.encode();
        assert_eq!(bytes.len() % 8, 0);
        let frame = Frame::decode(&bytes).unwrap();
        assert_eq!(frame.kind, FrameKind::Verdict);
        let back = Verdict::decode(frame.header, &bytes[HEADER_BYTES..][..frame.len]).unwrap();
        assert_eq!(back, v);
        assert!(back.is_collective());
        // The other rank of the pair speaks from its side; a third rank
        // reports the pair as the finder saw it.
        assert_eq!(
            back.error_for(0),
            Error::Mismatch {
                rank: 0,
                local: v.b_call.clone(),
                peer: 1,
                remote: v.a_call.clone()
            }
        );
        assert_eq!(
            back.error_for(2),
            Error::Mismatch {
                rank: 1,
                local: v.a_call.clone(),
                peer: 0,
                remote: v.b_call.clone()
            }
        );
        assert!(Verdict::decode(header, &bytes[HEADER_BYTES..HEADER_BYTES + 10]).is_err());
    }
}
