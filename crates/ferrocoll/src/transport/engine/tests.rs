//! Unit tests of the sans-IO core: no process, thread, channel or clock;
//! bytes are carried from one core to another by hand and time is a
//! made-up `now`.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::core::{Core, Route};
use super::ledger::Ledger;
use crate::error::Error;
use crate::plan::Collective;
use crate::transport::{CallKind, Header, Incoming, Outgoing, Signature, Sink};
use crate::types::{DType, ReduceOp};

/// Collects what is delivered, by receive index.
#[derive(Default)]
struct Got(Vec<Vec<u8>>);

impl Sink for Got {
    fn deliver(&mut self, index: usize, offset: usize, chunk: &[u8]) {
        if self.0.len() <= index {
            self.0.resize(index + 1, Vec::new());
        }
        let b = &mut self.0[index];
        assert_eq!(b.len(), offset, "chunks arrive in order");
        assert_eq!(offset % 8, 0, "deliveries start on a word");
        b.extend_from_slice(chunk);
    }
}

/// Rank `me` of `n`, connected to every peer.
fn core(me: usize, n: usize) -> Core {
    let connected: Vec<bool> = (0..n).map(|p| p != me).collect();
    Core::new(me, &connected, false, Arc::new(Mutex::new(Ledger::new())))
}

/// An allreduce of `count` f32 at point `seq`.
fn header(seq: u64, count: usize) -> Header {
    Header {
        comm: 7,
        seq,
        sig: Signature {
            kind: CallKind::Collective(Collective::AllReduce),
            dtype: DType::F32,
            op: Some(ReduceOp::Sum),
            count,
            root: None,
        },
    }
}

/// Moves every byte `from` has queued for `to` into `to`.
fn carry(from: &mut Core, to: &mut Core) {
    let (a, b) = (from.me, to.me);
    while let Some(bytes) = from.poll_transmit(b) {
        let bytes = bytes.to_vec();
        assert_eq!(to.handle_bytes(a, &bytes), bytes.len());
        from.handle_written(b, bytes.len());
    }
}

/// Registers a call through the stream.
///
/// # Safety
///
/// `sink` and the sends' memory outlive the call (the test retires it).
unsafe fn add(
    c: &mut Core,
    h: &Header,
    sends: &[Outgoing<'_>],
    recvs: &[Incoming],
    sink: &mut Got,
    now: Instant,
) -> crate::Result<usize> {
    // SAFETY: passed on to the caller.
    unsafe { add_routed(c, h, sends, recvs, sink, now, false) }
}

/// [`add`], the sends rendezvous sends or not.
///
/// # Safety
///
/// As [`add`].
unsafe fn add_routed(
    c: &mut Core,
    h: &Header,
    sends: &[Outgoing<'_>],
    recvs: &[Incoming],
    sink: &mut dyn Sink,
    now: Instant,
    rendezvous: bool,
) -> crate::Result<usize> {
    // SAFETY: passed on to the caller.
    unsafe {
        c.add_call(
            h,
            sends,
            recvs,
            sink,
            now,
            now + Duration::from_secs(1),
            |_| Route::Stream {
                flip: false,
                rendezvous,
            },
        )
    }
}

/// [`add`] with rendezvous sends.
///
/// # Safety
///
/// As [`add`].
unsafe fn add_rendezvous(
    c: &mut Core,
    h: &Header,
    sends: &[Outgoing<'_>],
    recvs: &[Incoming],
    sink: &mut Got,
    now: Instant,
) -> crate::Result<usize> {
    // SAFETY: passed on to the caller.
    unsafe { add_routed(c, h, sends, recvs, sink, now, true) }
}

#[test]
fn rendezvous_send_waits_until_the_receiver_takes_it() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let h = header(0, 64);
    let data = [5u8; 256];
    let mut none = Got::default();
    // SAFETY: `data` and the sinks live until the calls are retired.
    let s = unsafe {
        add_rendezvous(
            &mut a,
            &h,
            &[Outgoing {
                peer: 1,
                data: &data,
            }],
            &[],
            &mut none,
            now,
        )
    }
    .unwrap();
    // Written whole, but nobody has taken it: the send still waits.
    carry(&mut a, &mut b);
    assert!(a.poll_call(s).is_none(), "done before the receiver took it");
    carry(&mut b, &mut a);
    assert!(a.poll_call(s).is_none(), "acknowledged while unexpected");
    // The receive is posted and takes the held message: the acknowledgement
    // completes the send.
    let mut got = Got::default();
    let recvs = [Incoming { peer: 0, len: 256 }];
    // SAFETY: as above.
    let r = unsafe { add(&mut b, &h, &[], &recvs, &mut got, now) }.unwrap();
    assert!(matches!(b.poll_call(r), Some(Ok(()))));
    b.retire(r);
    assert_eq!(got.0, vec![data.to_vec()]);
    carry(&mut b, &mut a);
    assert!(matches!(a.poll_call(s), Some(Ok(()))));
    a.retire(s);
}

#[test]
fn rendezvous_acknowledgement_may_overtake_the_last_bytes() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let h = header(0, 64);
    let data = [7u8; 256];
    let mut got = Got::default();
    let recvs = [Incoming { peer: 0, len: 256 }];
    // The receive is posted first, so the receiver answers on the header.
    // SAFETY: `data` and the sinks live until the calls are retired.
    let r = unsafe { add(&mut b, &h, &[], &recvs, &mut got, now) }.unwrap();
    let mut none = Got::default();
    // SAFETY: as above.
    let s = unsafe {
        add_rendezvous(
            &mut a,
            &h,
            &[Outgoing {
                peer: 1,
                data: &data,
            }],
            &[],
            &mut none,
            now,
        )
    }
    .unwrap();
    // Only the header and part of the payload cross; the acknowledgement
    // comes back before the rest is written.
    let first = a.poll_transmit(1).unwrap().to_vec();
    let part = 64 + 128;
    assert!(first.len() >= part, "header and payload offered together");
    assert_eq!(b.handle_bytes(0, &first[..part]), part);
    a.handle_written(1, part);
    carry(&mut b, &mut a);
    assert!(a.poll_call(s).is_none(), "done with bytes unwritten");
    carry(&mut a, &mut b);
    assert!(matches!(a.poll_call(s), Some(Ok(()))));
    assert!(matches!(b.poll_call(r), Some(Ok(()))));
    a.retire(s);
    b.retire(r);
    assert_eq!(got.0, vec![data.to_vec()]);
}

#[test]
fn fifo_per_peer_and_call_and_unexpected_held() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let (first, second, other) = ([1u8; 8], [2u8; 8], [3u8; 8]);
    let (h0, h1) = (header(0, 2), header(1, 2));
    let mut none = Got::default();
    // Rank 0 sends call 1's message first, then call 0's two.
    // SAFETY: the buffers and sinks live until the calls are retired below.
    let s1 = unsafe {
        add(
            &mut a,
            &h1,
            &[Outgoing {
                peer: 1,
                data: &other,
            }],
            &[],
            &mut none,
            now,
        )
    };
    let s1 = s1.unwrap();
    let sends = [
        Outgoing {
            peer: 1,
            data: &first,
        },
        Outgoing {
            peer: 1,
            data: &second,
        },
    ];
    let mut none0 = Got::default();
    // SAFETY: as above.
    let s0 = unsafe { add(&mut a, &h0, &sends, &[], &mut none0, now) }.unwrap();
    carry(&mut a, &mut b);
    assert!(matches!(a.poll_call(s1), Some(Ok(()))));
    assert!(matches!(a.poll_call(s0), Some(Ok(()))));
    a.retire(s0);
    a.retire(s1);
    // Nothing posted yet: all three are held. Call 0 takes its two in
    // order, not call 1's.
    let recvs = [Incoming { peer: 0, len: 8 }, Incoming { peer: 0, len: 8 }];
    let mut got = Got::default();
    // SAFETY: as above.
    let r0 = unsafe { add(&mut b, &h0, &[], &recvs, &mut got, now) }.unwrap();
    assert!(matches!(b.poll_call(r0), Some(Ok(()))));
    b.retire(r0);
    assert_eq!(got.0, vec![first.to_vec(), second.to_vec()]);
    let mut got1 = Got::default();
    // SAFETY: as above.
    let r1 = unsafe { add(&mut b, &h1, &[], &recvs[..1], &mut got1, now) }.unwrap();
    assert!(matches!(b.poll_call(r1), Some(Ok(()))));
    b.retire(r1);
    assert_eq!(got1.0, vec![other.to_vec()]);
    b.finished(&h0);
    assert!(b.check_unclaimed(&h0).is_ok());
}

#[test]
fn posted_receive_gets_bytes_as_they_arrive() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let h = header(0, 2);
    let mut got = Got::default();
    // SAFETY: `got` lives until the call is retired.
    let r = unsafe {
        add(
            &mut b,
            &h,
            &[],
            &[Incoming { peer: 0, len: 8 }],
            &mut got,
            now,
        )
    };
    let r = r.unwrap();
    assert!(b.poll_call(r).is_none(), "waits for its message");
    let data = [9u8; 8];
    let mut none = Got::default();
    // SAFETY: `data` and `none` live until the call is retired.
    let s = unsafe {
        add(
            &mut a,
            &h,
            &[Outgoing {
                peer: 1,
                data: &data,
            }],
            &[],
            &mut none,
            now,
        )
    };
    assert!(a.poll_call(s.unwrap()).is_none(), "not written yet");
    carry(&mut a, &mut b);
    assert!(matches!(b.poll_call(r), Some(Ok(()))));
    b.retire(r);
    assert_eq!(got.0, vec![data.to_vec()]);
}

#[test]
fn mismatch_is_found_on_both_sides() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let data = [0u8; 8];
    let (mut s_sink, mut r_sink) = (Got::default(), Got::default());
    // Rank 0 calls allreduce(count=2), rank 1 allreduce(count=3), and each
    // expects the other's contribution.
    let (ha, hb) = (header(0, 2), header(0, 3));
    let recv_a = [Incoming { peer: 1, len: 8 }];
    // SAFETY: buffers and sinks live until the calls are retired.
    let ca = unsafe {
        add(
            &mut a,
            &ha,
            &[Outgoing {
                peer: 1,
                data: &data,
            }],
            &recv_a,
            &mut s_sink,
            now,
        )
    };
    let ca = ca.unwrap();
    let recv_b = [Incoming { peer: 0, len: 12 }];
    // SAFETY: as above.
    let cb = unsafe { add(&mut b, &hb, &[], &recv_b, &mut r_sink, now) }.unwrap();
    carry(&mut a, &mut b);
    let Some(Err(Error::Mismatch {
        rank: 1, peer: 0, ..
    })) = b.poll_call(cb)
    else {
        panic!("rank 1 sees the mismatch")
    };
    // Its notice fails rank 0's call too, instead of a wait until timeout.
    carry(&mut b, &mut a);
    let Some(Err(Error::Mismatch {
        rank: 0,
        peer: 1,
        local,
        ..
    })) = a.poll_call(ca)
    else {
        panic!("rank 0 is told")
    };
    assert!(local.contains("count=2"), "{local}");
    a.retire(ca);
    b.retire(cb);
}

#[test]
fn a_verdict_reaches_every_rank_wherever_it_is() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 4), core(1, 4));
    let (mut waiting, mut behind, mut ahead) = (core(2, 4), core(3, 4), core(3, 4));
    let data = [0u8; 8];
    let (ha, hb) = (header(5, 2), header(5, 3));
    let (mut sa, mut sb, mut sw) = (Got::default(), Got::default(), Got::default());
    let send = [Outgoing {
        peer: 1,
        data: &data,
    }];
    // SAFETY: buffers and sinks live until the calls are retired.
    let ca = unsafe { add(&mut a, &ha, &send, &[], &mut sa, now) }.unwrap();
    // SAFETY: as above.
    let cb = unsafe {
        add(
            &mut b,
            &hb,
            &[],
            &[Incoming { peer: 0, len: 12 }],
            &mut sb,
            now,
        )
    }
    .unwrap();
    // Rank 2 waits for rank 1 in its call at that point; it never hears
    // from either of the two otherwise.
    // SAFETY: as above.
    let cw = unsafe {
        add(
            &mut waiting,
            &ha,
            &[],
            &[Incoming { peer: 1, len: 8 }],
            &mut sw,
            now,
        )
    }
    .unwrap();
    // One rank 3 finished that call already, another is not there yet.
    ahead.finished(&ha);
    carry(&mut a, &mut b);
    assert!(matches!(
        b.poll_call(cb),
        Some(Err(Error::Mismatch {
            rank: 1,
            peer: 0,
            ..
        }))
    ));
    carry(&mut b, &mut waiting);
    let Some(Err(Error::Mismatch {
        rank: 1,
        peer: 0,
        local,
        remote,
    })) = waiting.poll_call(cw)
    else {
        panic!("the third rank fails with the verdict of the pair")
    };
    assert!(
        local.contains("count=3") && remote.contains("count=2"),
        "{local} / {remote}"
    );
    // A rank past that call fails every call from now on; one behind fails
    // when it gets there.
    let mut from_b = Vec::new();
    while let Some(bytes) = b.poll_transmit(3) {
        let bytes = bytes.to_vec();
        b.handle_written(3, bytes.len());
        from_b.extend_from_slice(&bytes);
    }
    assert_eq!(ahead.handle_bytes(1, &from_b), from_b.len());
    assert!(matches!(
        ahead.precheck(&[], &[]),
        Err(Error::Mismatch { rank: 1, .. })
    ));
    assert_eq!(behind.handle_bytes(1, &from_b), from_b.len());
    assert!(
        behind.precheck(&[], &[]).is_ok(),
        "calls before that point go on"
    );
    let mut sh = Got::default();
    // SAFETY: as above.
    let r = unsafe { add(&mut behind, &ha, &[], &[], &mut sh, now) };
    assert!(
        matches!(
            r,
            Err(Error::Mismatch {
                rank: 1,
                peer: 0,
                ..
            })
        ),
        "{r:?}"
    );
    // The rank that sent the disagreeing message is told too, from its side.
    carry(&mut b, &mut a);
    assert!(matches!(
        a.poll_call(ca),
        Some(Err(Error::Mismatch {
            rank: 0,
            peer: 1,
            ..
        }))
    ));
    // Rank 0 passes it on once (to ranks 2 and 3, which may have no
    // channel to rank 1 over TCP); the copy rank 2 passes on to it is not
    // echoed again.
    for p in [2, 3] {
        let n = a.poll_transmit(p).map(<[u8]>::len).expect("passed on");
        a.handle_written(p, n);
        assert!(a.poll_transmit(p).is_none());
    }
    carry(&mut waiting, &mut a);
    assert!((1..4).all(|p| a.poll_transmit(p).is_none()), "no echo");
    a.retire(ca);
    b.retire(cb);
    waiting.retire(cw);
}

#[test]
fn late_mismatch_after_a_call_finished() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    // Rank 1 ran a barrier-like call at point 0 that expects nothing from
    // rank 0 and finished it; rank 0 sends at point 0.
    let hb = header(0, 0);
    b.finished(&hb);
    let data = [0u8; 8];
    let mut none = Got::default();
    let ha = header(0, 2);
    // SAFETY: `data` and `none` live until the call is retired.
    let ca = unsafe {
        add(
            &mut a,
            &ha,
            &[Outgoing {
                peer: 1,
                data: &data,
            }],
            &[],
            &mut none,
            now,
        )
    };
    let ca = ca.unwrap();
    carry(&mut a, &mut b);
    // Rank 1 fails from now on, and tells rank 0.
    let Err(Error::Mismatch { rank: 1, .. }) = b.precheck(&[], &[]) else {
        panic!("every later call fails")
    };
    assert!(b.broken_flag().load(Ordering::SeqCst));
    carry(&mut b, &mut a);
    assert!(matches!(a.poll_call(ca), Some(Err(Error::Mismatch { .. }))));
    a.retire(ca);

    // The same found when the call ends: a message of it nobody took.
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let mut none = Got::default();
    // SAFETY: as above.
    let ca = unsafe {
        add(
            &mut a,
            &ha,
            &[Outgoing {
                peer: 1,
                data: &data,
            }],
            &[],
            &mut none,
            now,
        )
    };
    carry(&mut a, &mut b);
    b.finished(&hb);
    assert!(matches!(
        b.check_unclaimed(&hb),
        Err(Error::Mismatch { rank: 1, .. })
    ));
    a.retire(ca.unwrap());
}

#[test]
fn goodbye_is_not_a_crash_but_loss_is() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 3), core(1, 3));
    let h = header(0, 2);
    let recvs = [Incoming { peer: 0, len: 8 }, Incoming { peer: 2, len: 8 }];
    // Rank 0 says goodbye while nothing here waits on it, then its channel
    // closes: a clean exit.
    a.say_goodbye();
    carry(&mut a, &mut b);
    b.handle_lost(0, "closed".into());
    assert_eq!(b.culprit(), None, "a clean exit");
    assert!(b.precheck(&[], &[Incoming { peer: 2, len: 8 }]).is_ok());
    // Rank 2 vanishes without one: every call fails naming it.
    let mut got = Got::default();
    // SAFETY: `got` lives until the call is retired.
    let cb = unsafe { add(&mut b, &h, &[], &recvs[1..], &mut got, now) }.unwrap();
    b.handle_lost(2, "killed".into());
    assert_eq!(b.culprit(), Some(2));
    assert!(matches!(
        b.poll_call(cb),
        Some(Err(Error::PeerLost { rank: 2 }))
    ));
    b.retire(cb);
    assert!(matches!(
        b.precheck(&[], &[]),
        Err(Error::PeerLost { rank: 2 })
    ));
}

#[test]
fn a_goodbye_while_a_call_waits_is_the_origin_of_the_failure() {
    let now = Instant::now();
    let (mut a, mut b, mut c) = (core(0, 3), core(1, 3), core(2, 3));
    let h = header(0, 2);
    let mut got = Got::default();
    // SAFETY: `got` lives until the call is retired.
    let cb = unsafe {
        add(
            &mut b,
            &h,
            &[],
            &[Incoming { peer: 0, len: 8 }],
            &mut got,
            now,
        )
    }
    .unwrap();
    // Rank 0 returns early: goodbye, then its channel closes, while rank 1
    // still waits on it.
    a.say_goodbye();
    carry(&mut a, &mut b);
    b.handle_lost(0, "closed".into());
    assert!(matches!(
        b.poll_call(cb),
        Some(Err(Error::PeerLost { rank: 0 }))
    ));
    b.retire(cb);
    assert_eq!(b.culprit(), Some(0), "it left while needed");
    // Rank 2 hears it from rank 1 before rank 1's own goodbye, so it blames
    // rank 0 even after rank 1 exits too.
    b.say_goodbye();
    carry(&mut b, &mut c);
    c.handle_lost(1, "closed".into());
    c.apply_reported_losses();
    assert_eq!(c.culprit(), Some(0));
    assert!(matches!(
        c.precheck(&[], &[Incoming { peer: 1, len: 8 }]),
        Err(Error::PeerLost { rank: 0 })
    ));
}

#[test]
fn a_bypass_call_that_has_a_departed_peers_message_declares_nothing() {
    let (mut a, mut b, mut c) = (core(0, 3), core(1, 3), core(2, 3));
    let h = header(0, 2);
    // Rank 0 writes its message for the bypass call (in shared memory, not
    // seen here), says goodbye and exits: its last call is done.
    a.say_goodbye();
    carry(&mut a, &mut b);
    b.handle_lost(0, "closed".into());
    assert_eq!(b.culprit(), None, "a clean exit");
    // The call waits on rank 0, and its message is here: it goes on, and
    // no rank hears of a crash.
    assert!(b.bypass_checkup(&h, &[0], &|| false).is_ok());
    assert_eq!(b.culprit(), None, "nothing declared");
    carry(&mut b, &mut c);
    c.apply_reported_losses();
    assert_eq!(c.culprit(), None, "nothing told");
    assert!(c.precheck(&[], &[Incoming { peer: 1, len: 8 }]).is_ok());
    // Without the message, rank 0 left while needed: the call fails naming
    // it, and every rank is told.
    assert!(matches!(
        b.bypass_checkup(&h, &[0], &|| true),
        Err(Error::PeerLost { rank: 0 })
    ));
    assert_eq!(b.culprit(), Some(0), "it left while needed");
    carry(&mut b, &mut c);
    c.apply_reported_losses();
    assert_eq!(c.culprit(), Some(0));
}

#[test]
fn loss_is_told_to_the_other_peers() {
    let (mut a, mut b) = (core(0, 3), core(1, 3));
    // Rank 1 sees rank 2 crash; rank 0, which waits on nothing from 2,
    // learns it from rank 1's notice.
    b.handle_lost(2, "killed".into());
    carry(&mut b, &mut a);
    // Acted on once the driver has read what rank 2 sent before it left.
    assert_eq!(a.culprit(), None);
    a.apply_reported_losses();
    assert_eq!(a.culprit(), Some(2));
}

#[test]
fn abort_reaches_the_peer_and_fails_calls() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let h = header(0, 2);
    let mut got = Got::default();
    // SAFETY: `got` lives until the call is retired.
    let cb = unsafe {
        add(
            &mut b,
            &h,
            &[],
            &[Incoming { peer: 0, len: 8 }],
            &mut got,
            now,
        )
    };
    let cb = cb.unwrap();
    a.abort_peers();
    carry(&mut a, &mut b);
    assert!(b.aborted_flag().load(Ordering::SeqCst));
    assert!(matches!(b.poll_call(cb), Some(Err(Error::Aborted))));
    b.retire(cb);
    a.abort_here();
    assert!(matches!(a.precheck(&[], &[]), Err(Error::Aborted)));
}

#[test]
fn deadline_passes_on_the_given_clock() {
    let start = Instant::now();
    let mut b = core(1, 3);
    let h = header(4, 2);
    let mut got = Got::default();
    let recvs = [Incoming { peer: 2, len: 8 }];
    // SAFETY: `got` lives until the call is retired.
    let cb = unsafe { add(&mut b, &h, &[], &recvs, &mut got, start) }.unwrap();
    assert!(b
        .handle_timeout(cb, start + Duration::from_millis(999))
        .is_none());
    let Some(Error::Timeout {
        peer, seq, waited, ..
    }) = b.handle_timeout(cb, start + Duration::from_secs(2))
    else {
        panic!("the deadline has passed")
    };
    assert_eq!((peer, seq, waited), (2, 4, Duration::from_secs(2)));
    b.retire(cb);
}

#[test]
fn reported_verdict_fails_the_call_when_it_starts() {
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    // Rank 0 finds rank 1's message of the wrong length and reports it;
    // rank 1's call has already left (it only sent), so the verdict is
    // kept until rank 1 reaches that point again.
    let data = [0u8; 8];
    let mut none = Got::default();
    // SAFETY: as in the other tests.
    let ca = unsafe {
        add(
            &mut a,
            &header(0, 2),
            &[],
            &[Incoming { peer: 1, len: 12 }],
            &mut none,
            now,
        )
    };
    let ca = ca.unwrap();
    let mut none1 = Got::default();
    // SAFETY: as above.
    let cb = unsafe {
        add(
            &mut b,
            &header(0, 3),
            &[Outgoing {
                peer: 0,
                data: &data,
            }],
            &[],
            &mut none1,
            now,
        )
    };
    carry(&mut b, &mut a);
    assert!(matches!(a.poll_call(ca), Some(Err(Error::Mismatch { .. }))));
    a.retire(ca);
    // Rank 1's call already left (it only sent): the verdict waits for it.
    b.retire(cb.unwrap());
    carry(&mut a, &mut b);
    let mut none2 = Got::default();
    // SAFETY: as above.
    let again = unsafe { add(&mut b, &header(0, 3), &[], &[], &mut none2, now) };
    assert!(matches!(
        again,
        Err(Error::Mismatch {
            rank: 1,
            peer: 0,
            ..
        })
    ));
}

/// A sink that stores each message in place and says where
/// ([`Sink::destination`]), as the executor's plain copies do.
struct Place(Vec<Vec<u8>>);

impl Sink for Place {
    fn deliver(&mut self, index: usize, offset: usize, chunk: &[u8]) {
        self.0[index][offset..offset + chunk.len()].copy_from_slice(chunk);
    }

    fn destination(&mut self, index: usize, offset: usize, len: usize) -> Option<&mut [u8]> {
        Some(&mut self.0[index][offset..offset + len])
    }
}

/// Byte `i` of test message `k`.
fn pattern(k: usize, i: usize) -> u8 {
    (i.wrapping_mul(31) + k * 7 + (i >> 9)) as u8
}

/// Posts a call of receives only, into any sink (the stream's route).
///
/// # Safety
///
/// As [`add`].
unsafe fn receive_into(
    c: &mut Core,
    h: &Header,
    recvs: &[Incoming],
    sink: &mut dyn Sink,
    now: Instant,
) -> crate::Result<usize> {
    // SAFETY: passed on to the caller.
    unsafe { add_routed(c, h, &[], recvs, sink, now, false) }
}

/// Everything `from` has queued for `to`, as written on the wire.
fn written(from: &mut Core, to: usize) -> Vec<u8> {
    let mut wire = Vec::new();
    while let Some(bytes) = from.poll_transmit(to) {
        let n = bytes.len();
        wire.extend_from_slice(bytes);
        from.handle_written(to, n);
    }
    wire
}

/// Feeds `wire` to `core` from peer 0 as the driver's pump does over a
/// channel that reads straight into place: [`Core::receive_direct`] where
/// the core says so, [`Core::handle_bytes`] otherwise, both given at most
/// the next of `steps` bytes at a time (odd sizes, so that reads stop
/// anywhere).
fn pump_wire(core: &mut Core, wire: &[u8], steps: &[usize]) -> usize {
    let (mut pos, mut direct, mut turn) = (0, 0, 0);
    while pos < wire.len() {
        let step = steps[turn % steps.len()];
        turn += 1;
        let avail = step.min(wire.len() - pos);
        let mut read = |dst: &mut [u8]| {
            let n = dst.len().min(avail);
            dst[..n].copy_from_slice(&wire[pos..pos + n]);
            Ok(n)
        };
        let n = match core.receive_direct(0, &mut read).unwrap() {
            Some(n) => {
                direct += n;
                n
            }
            None => {
                // Offers end where the stream is whole words, as a
                // channel's do unless the stream stops short of one.
                let end = if pos + avail == wire.len() {
                    wire.len()
                } else {
                    (pos + avail) & !7
                };
                let end = if end <= pos {
                    wire.len().min(pos + 8)
                } else {
                    end
                };
                core.handle_bytes(0, &wire[pos..end])
            }
        };
        pos += n;
        assert!(n > 0 || turn < 100_000, "no progress at byte {pos}");
    }
    direct
}

/// Messages at and around the word, header and direct-read boundaries, in
/// one stream: posted before they arrive or not (unexpected), into a sink
/// that takes them in place or one that only takes deliveries (as a
/// reduction), with checksums on or off. Each arrives whole, and the large
/// ones mostly straight into place.
#[test]
fn direct_receive_at_every_boundary() {
    let lens = [
        0usize,
        1,
        7,
        8,
        9,
        63,
        64,
        65,
        4095,
        65_535,
        65_536,
        65_537,
        65_543,
        5,
        200_003,
        3,
        1 << 20 | 3,
        16,
        300_000,
    ];
    for checksums in [false, true] {
        for steps in [&[1usize << 20][..], &[1, 3, 8, 61, 4096, 65_541, 1 << 20]] {
            let now = Instant::now();
            let ledger = || Arc::new(Mutex::new(Ledger::new()));
            let mut a = Core::new(0, &[false, true], checksums, ledger());
            let mut b = Core::new(1, &[true, false], checksums, ledger());
            let data: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(k, &len)| (0..len).map(|i| pattern(k, i)).collect())
                .collect();
            let mut none = Got::default();
            let mut sends = Vec::new();
            for (k, d) in data.iter().enumerate() {
                let out = [Outgoing { peer: 1, data: d }];
                // SAFETY: `data` and `none` outlive the calls (retired below).
                let s = unsafe { add(&mut a, &header(k as u64, 1), &out, &[], &mut none, now) };
                sends.push(s.unwrap());
            }
            let wire = written(&mut a, 1);
            for s in sends {
                assert!(matches!(a.poll_call(s), Some(Ok(()))));
                a.retire(s);
            }
            // Even messages are posted first; odd ones arrive unexpected.
            // Messages 0 mod 4 and 1 mod 4 go to a sink that takes them in
            // place, the others to one that takes deliveries only.
            let mut places: Vec<Place> = lens.iter().map(|&l| Place(vec![vec![0; l]])).collect();
            let mut gots: Vec<Got> = lens.iter().map(|_| Got::default()).collect();
            let mut calls = vec![None; lens.len()];
            let post = |b: &mut Core, k: usize, place: &mut Place, got: &mut Got| {
                let recvs = [Incoming {
                    peer: 0,
                    len: lens[k],
                }];
                let sink: &mut dyn Sink = if k % 4 < 2 { place } else { got };
                // SAFETY: the sinks outlive the calls (retired below).
                unsafe { receive_into(b, &header(k as u64, 1), &recvs, sink, now) }.unwrap()
            };
            for k in (0..lens.len()).step_by(2) {
                calls[k] = Some(post(&mut b, k, &mut places[k], &mut gots[k]));
            }
            let direct = pump_wire(&mut b, &wire, steps);
            assert!(
                direct >= 300_000,
                "only {direct} bytes went straight into place"
            );
            for k in (1..lens.len()).step_by(2) {
                calls[k] = Some(post(&mut b, k, &mut places[k], &mut gots[k]));
            }
            for (k, call) in calls.into_iter().enumerate() {
                let call = call.unwrap();
                let what = format!("message {k} ({} B), checksums {checksums}", lens[k]);
                assert!(matches!(b.poll_call(call), Some(Ok(()))), "{what}");
                b.retire(call);
                let got = if k % 4 < 2 {
                    std::mem::take(&mut places[k].0[0])
                } else {
                    gots[k].0.pop().unwrap_or_default()
                };
                assert!(got == data[k], "{what}: wrong bytes");
            }
        }
    }
}

/// A payload bit flipped on the way fails the receive that read it
/// straight into place, as it fails one that took it through deliveries.
#[test]
fn direct_receive_checks_the_checksum() {
    let now = Instant::now();
    let ledger = || Arc::new(Mutex::new(Ledger::new()));
    let mut a = Core::new(0, &[false, true], true, ledger());
    let mut b = Core::new(1, &[true, false], true, ledger());
    let len = 300_001;
    let data: Vec<u8> = (0..len).map(|i| pattern(1, i)).collect();
    let mut none = Got::default();
    let out = [Outgoing {
        peer: 1,
        data: &data,
    }];
    // SAFETY: `data` and `none` outlive the call (retired below).
    let s = unsafe { add(&mut a, &header(0, 1), &out, &[], &mut none, now) }.unwrap();
    let mut wire = written(&mut a, 1);
    a.retire(s);
    wire[64 + 250_000] ^= 0x10;
    let mut place = Place(vec![vec![0; len]]);
    let recvs = [Incoming { peer: 0, len }];
    // SAFETY: `place` outlives the call (retired below).
    let r = unsafe { receive_into(&mut b, &header(0, 1), &recvs, &mut place, now) }.unwrap();
    // The first read takes the header and some payload through the offer;
    // the rest goes straight into place.
    assert!(pump_wire(&mut b, &wire, &[4096, 1 << 20]) > 250_000);
    assert!(
        matches!(b.poll_call(r), Some(Err(Error::Corrupted { .. }))),
        "a flipped bit went unnoticed"
    );
    b.retire(r);
}

/// The unexpected-message backlog keeps its per-call counts with its
/// queue: a call's messages come out oldest first, and a call with none
/// left is not reported as waiting (which would hold back later messages
/// of that call, FIFO, or report a late mismatch).
#[test]
fn backlog_counts_follow_the_queue() {
    use super::core::Backlog;
    use super::frames::Unexpected;
    let message = |seq: u64, len: usize| Unexpected {
        header: header(seq, len),
        len,
        data: Vec::new(),
        remote: None,
        corrupt: false,
        ack: None,
    };
    let mut b = Backlog::default();
    for (seq, len) in [(1, 10), (2, 20), (1, 11), (3, 30), (2, 21)] {
        b.push_back(message(seq, len));
    }
    assert!(b.has(header(1, 0).key()) && b.has(header(3, 0).key()));
    assert!(!b.has(header(4, 0).key()));
    assert_eq!(b.position(header(3, 0).key()), Some(3));
    let lens = |b: &mut Backlog, seq: u64| {
        std::iter::from_fn(|| b.take_first(header(seq, 0).key()).map(|u| u.len)).collect::<Vec<_>>()
    };
    assert_eq!(lens(&mut b, 2), vec![20, 21]);
    assert!(!b.has(header(2, 0).key()));
    assert_eq!(b.position(header(3, 0).key()), Some(2));
    let at = b.position(header(1, 0).key()).unwrap();
    assert_eq!(b.remove(at).map(|u| u.len), Some(10));
    assert!(b.has(header(1, 0).key()));
    assert_eq!(lens(&mut b, 1), vec![11]);
    assert_eq!(lens(&mut b, 3), vec![30]);
    assert!(!b.has(header(1, 0).key()) && b.position(header(3, 0).key()).is_none());
}

/// A run of eager collective messages to one peer ends in one that waits
/// for its match: the sender can be at most `EAGER_RUN` calls ahead of a
/// receiver that has not asked for them (and so buffers them). Point to
/// point sends never wait.
#[test]
fn a_run_of_eager_messages_ends_in_one_that_waits() {
    use super::core::EAGER_RUN;
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let data = [3u8; 8];
    let runs = EAGER_RUN as u64;
    let mut sinks: Vec<Got> = (0..2 * runs).map(|_| Got::default()).collect();
    let mut sent = Vec::new();
    for (seq, sink) in (0..2 * runs).zip(sinks.iter_mut()) {
        let send = [Outgoing {
            peer: 1,
            data: &data,
        }];
        // SAFETY: `data` and the sinks live until the calls are retired.
        let id = unsafe { add(&mut a, &header(seq, 2), &send, &[], sink, now) }.unwrap();
        carry(&mut a, &mut b);
        sent.push(id);
    }
    // Every call done at once but the run's last (and the next run's).
    let waiting: Vec<u64> = sent
        .iter()
        .zip(0u64..)
        .filter(|(&id, _)| a.poll_call(id).is_none())
        .map(|(_, seq)| seq)
        .collect();
    assert_eq!(waiting, vec![runs - 1, 2 * runs - 1]);
    // The receiver reaches those calls: they complete.
    for seq in 0..2 * runs {
        let mut got = Got::default();
        let recvs = [Incoming { peer: 0, len: 8 }];
        // SAFETY: as above.
        let r = unsafe { add(&mut b, &header(seq, 2), &[], &recvs, &mut got, now) }.unwrap();
        assert!(matches!(b.poll_call(r), Some(Ok(()))));
        b.retire(r);
    }
    carry(&mut b, &mut a);
    for id in sent {
        assert!(matches!(a.poll_call(id), Some(Ok(()))));
        a.retire(id);
    }
    // Point to point: never waits, however long the run.
    let mut p2p: Vec<Got> = (0..runs + 1).map(|_| Got::default()).collect();
    for (k, sink) in (0..runs + 1).zip(p2p.iter_mut()) {
        let mut h = header(k, 2);
        h.seq |= Header::P2P_BIT;
        let send = [Outgoing {
            peer: 1,
            data: &data,
        }];
        // SAFETY: as above.
        let id = unsafe { add(&mut a, &h, &send, &[], sink, now) }.unwrap();
        carry(&mut a, &mut b);
        assert!(
            matches!(a.poll_call(id), Some(Ok(()))),
            "p2p send {k} waits"
        );
        a.retire(id);
    }
}

/// A receive posted while its message is arriving unexpected takes what
/// came so far from the buffer and the rest as it arrives, straight into
/// place where the sink allows: at every cut (header only, inside a word,
/// past the buffer's first size and its growths, one word short of the
/// end), into a sink that takes bytes in place and one that takes
/// deliveries only, with and without checksums (a bit flipped after the
/// cut is still caught). A rendezvous sender is acknowledged when the
/// receive is posted; a receive of another length is a mismatch, not a
/// corruption.
#[test]
fn a_receive_posted_while_its_message_arrives_takes_the_rest() {
    let ledger = || Arc::new(Mutex::new(Ledger::new()));
    for len in [8usize, 100_000, 300_001] {
        let data: Vec<u8> = (0..len).map(|i| pattern(3, i)).collect();
        let words = len.div_ceil(8) * 8;
        let cuts = [
            64,
            64 + 8,
            64 + 65_536 + 3,
            64 + 65_536 + 8,
            64 + 200_000,
            64 + words - 8,
        ];
        for cut in cuts.into_iter().filter(|&c| c < 64 + words) {
            for (checksums, flip) in [(false, false), (true, false), (true, true)] {
                for in_place in [true, false] {
                    let what = format!(
                        "{len} B, posted after {cut} B, checksums {checksums}, \
                         flipped {flip}, in place {in_place}"
                    );
                    let now = Instant::now();
                    let mut a = Core::new(0, &[false, true], checksums, ledger());
                    let mut b = Core::new(1, &[true, false], checksums, ledger());
                    let mut none = Got::default();
                    let out = [Outgoing {
                        peer: 1,
                        data: &data,
                    }];
                    // SAFETY: `data` and `none` outlive the call (retired below).
                    let s =
                        unsafe { add_rendezvous(&mut a, &header(0, 1), &out, &[], &mut none, now) }
                            .unwrap();
                    let mut wire = written(&mut a, 1);
                    if flip {
                        // After the cut, so that it arrives posted.
                        wire[cut + (64 + len - cut) / 2] ^= 0x10;
                    }
                    pump_wire(&mut b, &wire[..cut], &[4096, 65_541, 1 << 20]);
                    assert!(a.poll_call(s).is_none(), "{what}: done before it was taken");
                    let mut place = Place(vec![vec![0; len]]);
                    let mut got = Got::default();
                    let sink: &mut dyn Sink = if in_place { &mut place } else { &mut got };
                    let recvs = [Incoming { peer: 0, len }];
                    // SAFETY: the sinks outlive the call (retired below).
                    let r =
                        unsafe { receive_into(&mut b, &header(0, 1), &recvs, sink, now) }.unwrap();
                    // Taken on posting, and its sender released before the
                    // rest arrives (into a sink that takes deliveries only,
                    // whole words, even where the bytes so far end inside
                    // one: Got checks).
                    carry(&mut b, &mut a);
                    assert!(
                        matches!(a.poll_call(s), Some(Ok(()))),
                        "{what}: not released on posting"
                    );
                    assert!(b.poll_call(r).is_none(), "{what}: done before its bytes");
                    pump_wire(&mut b, &wire[cut..], &[1, 3, 8, 61, 4096, 65_541]);
                    carry(&mut b, &mut a);
                    assert!(
                        matches!(a.poll_call(s), Some(Ok(()))),
                        "{what}: the sender was not released"
                    );
                    a.retire(s);
                    let outcome = b.poll_call(r);
                    b.retire(r);
                    if flip {
                        assert!(
                            matches!(outcome, Some(Err(Error::Corrupted { .. }))),
                            "{what}: a flipped bit went unnoticed"
                        );
                        continue;
                    }
                    assert!(matches!(outcome, Some(Ok(()))), "{what}: {outcome:?}");
                    let bytes = if in_place {
                        std::mem::take(&mut place.0[0])
                    } else {
                        got.0.pop().unwrap_or_default()
                    };
                    assert!(bytes == data, "{what}: wrong bytes");
                }
            }
        }
    }
    // A receive of another length takes the arriving message as a mismatch.
    let now = Instant::now();
    let (mut a, mut b) = (core(0, 2), core(1, 2));
    let data = vec![1u8; 100_000];
    let mut none = Got::default();
    let out = [Outgoing {
        peer: 1,
        data: &data,
    }];
    // SAFETY: `data` and the sinks outlive the calls (retired below).
    let s = unsafe { add(&mut a, &header(0, 1), &out, &[], &mut none, now) }.unwrap();
    let wire = written(&mut a, 1);
    assert_eq!(b.handle_bytes(0, &wire[..64 + 4096]), 64 + 4096);
    let mut got = Got::default();
    let recvs = [Incoming {
        peer: 0,
        len: 100_008,
    }];
    // SAFETY: as above.
    let r = unsafe { add(&mut b, &header(0, 1), &[], &recvs, &mut got, now) }.unwrap();
    assert!(
        matches!(b.poll_call(r), Some(Err(Error::Mismatch { .. }))),
        "a message of another length was taken"
    );
    b.retire(r);
    a.retire(s);
}

#[test]
fn a_position_names_whom_a_call_waits_for_also_once_it_timed_out() {
    let start = Instant::now();
    let mut b = core(1, 4);
    let h = header(4, 2);
    let comm = h.comm;
    let mut got = Got::default();
    let recvs = [Incoming { peer: 3, len: 8 }, Incoming { peer: 2, len: 8 }];
    // SAFETY: `got` lives until the call is retired.
    let cb = unsafe { add(&mut b, &h, &[], &recvs, &mut got, start) }.unwrap();
    let call = h.describe_call();
    assert_eq!(
        b.position_text(comm),
        format!("in {call} (waiting for world ranks 2, 3)")
    );
    // Timed out and retired, as the driver does before the report asks
    // every rank where it is: a peer asking now learns of the timed-out
    // call, not "in no call".
    assert!(b
        .handle_timeout(cb, start + Duration::from_secs(2))
        .is_some());
    b.note_timeout(cb);
    b.retire(cb);
    assert_eq!(
        b.position_text(comm),
        format!("in {call} (timed out waiting for world ranks 2, 3)")
    );
    // A later call on the communicator that finishes ends that.
    b.finished(&header(5, 2));
    assert!(
        b.position_text(comm)
            .starts_with("in no call on this communicator; last finished"),
        "{}",
        b.position_text(comm)
    );
}
