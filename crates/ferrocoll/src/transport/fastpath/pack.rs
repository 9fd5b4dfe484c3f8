//! A fast-path call's signature packed into one word, so that a mailbox
//! slot carries it beside the payload and the receiver checks that both
//! sides make the same call.

use crate::plan::Collective;
use crate::transport::{CallKind, Signature};
use crate::types::{DType, ReduceOp};

/// Marks a packed signature (top byte), so that a slot never written (all
/// zero) or garbage does not unpack.
const PACK_MARK: u64 = 0xFC << 56;

/// Marks a packed signature of a *remote-read* message (top byte): the
/// slot carries the address of the sender's buffer, which the receiver
/// reads with `process_vm_readv` ([`pack_remote`]).
const REMOTE_MARK: u64 = 0xFD << 56;

/// Marks a packed signature of an *address* message (top byte): the slot
/// carries the address of a buffer of the sender's, which the receiver
/// reads or writes as the call's protocol says (a 2-rank broadcast split
/// between both ends), and which a call that takes the message out for
/// another one copies as it is ([`pack_address`]).
const ADDRESS_MARK: u64 = 0xFE << 56;

/// The payload of a remote-read message: an address (8 bytes).
pub(crate) const REMOTE_PAYLOAD: usize = 8;

/// The payload of an address message: an address and a word the call's
/// protocol gives a meaning to (16 bytes).
pub(crate) const ADDRESS_PAYLOAD: usize = 16;

/// The position of `x` in `all`, which holds it.
fn index_of<T: PartialEq>(all: &[T], x: &T) -> u64 {
    all.iter()
        .position(|a| a == x)
        .expect("value is in its list") as u64
}

/// The bytes of every fast-path message of a call with signature `sig`:
/// one rank's contribution (allgather: its block), `count` elements.
pub(crate) fn message_len(sig: &Signature) -> usize {
    sig.count.saturating_mul(sig.dtype.size())
}

/// Packs a signature into one word: count (16 bits), root (8, 0xFF for
/// none), collective (8), element type (8), operator (8, 0xFF for none),
/// 8 bits left for [`with_parts`], and a mark. The message length is not
/// stored: it is count x element size ([`packed_len`]), so a receiver
/// checks the length of a payload in an eager buffer as it checks the rest
/// of the signature. `None` when it
/// does not fit, which no fast-path call does (their counts and roots are
/// bounded by [`EAGER_BYTES`](crate::transport::shm::EAGER_BYTES) and
/// [`FAST_MAX_RANKS`](super::FAST_MAX_RANKS)).
pub(crate) fn pack(sig: &Signature) -> Option<u64> {
    let CallKind::Collective(coll) = sig.kind else {
        return None;
    };
    let count = u16::try_from(sig.count).ok()?;
    let root = match sig.root {
        Some(r) => u8::try_from(r).ok().filter(|r| *r != 0xFF)?,
        None => 0xFF,
    };
    let op = sig.op.map_or(0xFF, |op| index_of(&ReduceOp::ALL, &op));
    Some(
        u64::from(count)
            | u64::from(root) << 16
            | index_of(&Collective::ALL, &coll) << 24
            | index_of(&DType::ALL, &sig.dtype) << 32
            | op << 40
            | PACK_MARK,
    )
}

/// Packs the signature of a remote-read message (`small::reads_remote`):
/// as [`pack`], but with a count beyond 16 bits: count bits 0-15 in bits
/// 0-15, bits 16-31 in bits 40-55 (32 bits in all), the root's byte holding
/// the root of a collective that has one and the operator of one that
/// does not, and its own mark, so that a remote-read message never matches
/// an eager one. A reduce, which has both a root and an operator, keeps
/// the root there, the operator in bits 48-55, and 24 bits of count. `None`
/// for a count of 2^32 or more (2^24 for a reduce), or a root that does not
/// fit.
pub(crate) fn pack_remote(sig: &Signature) -> Option<u64> {
    let CallKind::Collective(coll) = sig.kind else {
        return None;
    };
    let count = u64::from(u32::try_from(sig.count).ok()?);
    let root = |r: usize| u8::try_from(r).ok().filter(|r| *r != 0xFF).map(u64::from);
    let (root_or_op, high) = match (sig.root, sig.op) {
        (Some(r), Some(op)) if count < 1 << 24 => {
            (root(r)?, count >> 16 | index_of(&ReduceOp::ALL, &op) << 8)
        }
        (Some(_), Some(_)) => return None,
        (Some(r), None) => (root(r)?, count >> 16),
        (None, Some(op)) => (index_of(&ReduceOp::ALL, &op), count >> 16),
        (None, None) => (0xFF, count >> 16),
    };
    Some(
        (count & 0xFFFF)
            | root_or_op << 16
            | index_of(&Collective::ALL, &coll) << 24
            | index_of(&DType::ALL, &sig.dtype) << 32
            | high << 40
            | REMOTE_MARK,
    )
}

/// Packs the signature of an address message as [`pack_remote`] does,
/// under its own mark.
pub(crate) fn pack_address(sig: &Signature) -> Option<u64> {
    pack_remote(sig).map(|word| word & !(0xFF << 56) | ADDRESS_MARK)
}

/// Whether `word` packs an address message's signature.
pub(crate) fn is_address(word: u64) -> bool {
    word & (0xFF << 56) == ADDRESS_MARK
}

/// Whether `word` packs a remote-read message's signature.
pub(crate) fn is_remote(word: u64) -> bool {
    word & (0xFF << 56) == REMOTE_MARK
}

/// Bits 48-55 of a packed signature: how many messages a streamed call
/// sends each peer (0 for a call of one message).
const PARTS_SHIFT: u32 = 48;

/// `word` (a [`pack`]ed signature of one message) marked as one of the
/// `parts` messages of a streamed call (`parts` >= 2; 255 stands for 255
/// or more; see `small::streams`). Both sides of a call mark alike, so a
/// streamed call against a whole one, or one of another length of fewer
/// than 255 parts, differs already in its first message; longer ones
/// differ in their last part's length, or are told apart by the probes of
/// a call that waits long, as every silent mismatch.
pub(crate) fn with_parts(word: u64, parts: usize) -> u64 {
    debug_assert!(parts >= 2);
    word | (parts.min(0xFF) as u64) << PARTS_SHIFT
}

/// The parts [`with_parts`] marked in `word` (1 for a whole call, 255 for
/// 255 or more).
pub(crate) fn parts_of(word: u64) -> usize {
    (((word >> PARTS_SHIFT) & 0xFF) as usize).max(1)
}

/// The signature [`pack`] packed, if `word` is one (for a part of a
/// streamed call: that message's signature, its count the part's).
pub(crate) fn unpack(word: u64) -> Option<Signature> {
    let byte = |shift: u32| ((word >> shift) & 0xFF) as usize;
    if is_remote(word) || is_address(word) {
        let coll = *Collective::ALL.get(byte(24))?;
        let low = (word & 0xFFFF) as usize;
        let high = ((word >> 40) & 0xFFFF) as usize;
        let (root, op, count) = match byte(16) {
            // A reduce: root, operator and 24 bits of count.
            b if coll.has_root() && coll.reduces() => (
                Some(b),
                Some(*ReduceOp::ALL.get(byte(48))?),
                low | byte(40) << 16,
            ),
            0xFF => (None, None, low | high << 16),
            b if coll.has_root() => (Some(b), None, low | high << 16),
            o => (None, Some(*ReduceOp::ALL.get(o)?), low | high << 16),
        };
        return Some(Signature {
            kind: CallKind::Collective(coll),
            dtype: *DType::ALL.get(byte(32))?,
            op,
            count,
            root,
        });
    }
    if word & (0xFF << 56) != PACK_MARK {
        return None;
    }
    let kind = CallKind::Collective(*Collective::ALL.get(byte(24))?);
    let dtype = *DType::ALL.get(byte(32))?;
    let op = match byte(40) {
        0xFF => None,
        o => Some(*ReduceOp::ALL.get(o)?),
    };
    Some(Signature {
        kind,
        dtype,
        op,
        count: (word & 0xFFFF) as usize,
        root: (byte(16) != 0xFF).then_some(byte(16)),
    })
}

/// The payload length of a message with packed signature `word`: count x
/// element size, [`REMOTE_PAYLOAD`] for a remote-read message,
/// [`ADDRESS_PAYLOAD`] for an address message (0 for a word
/// that does not unpack).
pub(super) fn packed_len(word: u64) -> usize {
    match unpack(word) {
        Some(_) if is_remote(word) => REMOTE_PAYLOAD,
        Some(_) if is_address(word) => ADDRESS_PAYLOAD,
        Some(sig) => message_len(&sig),
        None => 0,
    }
}

/// The bytes a message with packed signature `word` brings: its payload's,
/// or for a remote-read message those read from the sender's memory.
pub(super) fn message_bytes(word: u64) -> usize {
    unpack(word).map_or(0, |sig| message_len(&sig))
}

/// A packed signature for error messages.
pub(crate) fn describe(word: u64) -> String {
    unpack(word).map_or_else(
        || format!("an unreadable call (signature {word:#x})"),
        |s| match parts_of(word) {
            // A two-step allreduce's span (`small::two_step`), whose root
            // byte holds the elements its count leaves past equal blocks.
            _ if s.root.is_some() && matches!(s.kind, CallKind::Collective(c) if !c.has_root()) => {
                let tail = s.root.unwrap_or(0);
                let s = Signature { root: None, ..s };
                format!(
                    "{s} (a span of a two-step call whose count leaves {tail} past equal blocks)"
                )
            }
            _ if is_remote(word) => format!("{s} (read from the sender's memory)"),
            _ if is_address(word) => format!("{s} (split between both ends)"),
            1 => s.to_string(),
            0xFF => format!("{s} (a part of a call sent in 255 or more parts)"),
            parts => format!("{s} (a part of a call sent in {parts} parts)"),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_pack_and_unpack() {
        for coll in Collective::ALL {
            for dtype in DType::ALL {
                for op in [None, Some(ReduceOp::Sum), Some(ReduceOp::Avg)] {
                    for root in [None, Some(0), Some(15)] {
                        let sig = Signature {
                            kind: CallKind::Collective(coll),
                            dtype,
                            op,
                            count: 24,
                            root,
                        };
                        let word = pack(&sig).unwrap();
                        assert_eq!(unpack(word), Some(sig));
                        assert_eq!(packed_len(word), 24 * dtype.size());
                        // The largest eager payload's count packs too.
                        let big = Signature {
                            count: crate::transport::shm::EAGER_BYTES,
                            ..sig
                        };
                        assert_eq!(unpack(pack(&big).unwrap()), Some(big));
                    }
                }
            }
        }
        let p2p = Signature {
            kind: CallKind::PointToPoint,
            dtype: DType::U8,
            op: None,
            count: 1,
            root: None,
        };
        assert_eq!(pack(&p2p), None);
        // A streamed call's part: the same signature, its parts marked and
        // told.
        let part = Signature {
            kind: CallKind::Collective(Collective::Broadcast),
            dtype: DType::F32,
            op: None,
            count: 4096,
            root: Some(1),
        };
        let whole = pack(&part).unwrap();
        let marked = with_parts(whole, 16);
        assert_ne!(marked, whole);
        assert_eq!((parts_of(whole), parts_of(marked)), (1, 16));
        assert_eq!(unpack(marked), Some(part));
        assert_eq!(packed_len(marked), 16384);
        assert!(describe(marked).ends_with("(a part of a call sent in 16 parts)"));
        assert!(!describe(whole).contains("parts"));
        let long = with_parts(whole, 4096);
        assert_eq!(parts_of(long), 255);
        assert!(describe(long).ends_with("in 255 or more parts)"));
        // A remote-read message: counts past 16 bits, roots, its own mark.
        let counts = [(0, None), (1, Some(3)), (0xFFFF, None), (0x1_0000, Some(0))];
        for (count, root) in counts
            .into_iter()
            .chain([(0x12_3456, Some(15)), ((1 << 32) - 1, None)])
        {
            // A root only where the collective has one.
            let coll = if root.is_some() {
                Collective::Broadcast
            } else {
                Collective::AllGather
            };
            let sig = Signature {
                kind: CallKind::Collective(coll),
                dtype: DType::BF16,
                op: None,
                count,
                root,
            };
            let word = pack_remote(&sig).unwrap();
            assert!(is_remote(word) && !is_remote(pack(&Signature { count: 1, ..sig }).unwrap()));
            assert_eq!(unpack(word), Some(sig));
            assert_eq!(packed_len(word), REMOTE_PAYLOAD);
            assert_eq!(message_bytes(word), count * 2);
            assert!(describe(word).ends_with("(read from the sender's memory)"));
            if count <= 0xFFFF {
                assert_ne!(Some(word), pack(&sig));
            }
        }
        let huge = Signature {
            kind: CallKind::Collective(Collective::AllToAll),
            dtype: DType::U8,
            op: None,
            count: 1 << 32,
            root: None,
        };
        assert_eq!(pack_remote(&huge), None);
        // An address message: the same fields under its own mark.
        let split = Signature {
            kind: CallKind::Collective(Collective::Broadcast),
            dtype: DType::F32,
            op: None,
            count: 1 << 18,
            root: Some(1),
        };
        let word = pack_address(&split).unwrap();
        assert!(is_address(word) && !is_remote(word));
        assert_ne!(Some(word), pack_remote(&split));
        assert_eq!(unpack(word), Some(split));
        assert_eq!(packed_len(word), ADDRESS_PAYLOAD);
        assert!(describe(word).ends_with("(split between both ends)"));
        // An operator where there is no root (an allreduce); a reduce has
        // both, which does not pack.
        for op in ReduceOp::ALL {
            let with_op = Signature {
                kind: CallKind::Collective(Collective::AllReduce),
                op: Some(op),
                count: 1 << 20,
                ..huge
            };
            assert_eq!(unpack(pack_address(&with_op).unwrap()), Some(with_op));
        }
        // A reduce: root, operator and up to 24 bits of count.
        for (count, op) in [(1, ReduceOp::Sum), ((1 << 24) - 1, ReduceOp::Max)] {
            let reduce = Signature {
                kind: CallKind::Collective(Collective::Reduce),
                op: Some(op),
                root: Some(1),
                count,
                ..huge
            };
            assert_eq!(unpack(pack_address(&reduce).unwrap()), Some(reduce));
        }
        let reduce = Signature {
            kind: CallKind::Collective(Collective::Reduce),
            op: Some(ReduceOp::Sum),
            root: Some(0),
            count: 1 << 24,
            ..huge
        };
        assert_eq!(pack_remote(&reduce), None);
        assert_eq!(unpack(0), None);
        assert_eq!(packed_len(0), 0);
        assert!(describe(0).contains("unreadable"));
    }
}
