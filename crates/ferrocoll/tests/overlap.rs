//! A plan's overlapped local ops (listed after a round's messages) run while
//! those messages are in flight: the thread transport calls
//! `Sink::overlap` once its sends are posted, so a receiver can finish
//! while the sender is still inside it; and a broadcast whose root copies
//! its input that way delivers the same bytes, in place or not.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ferrocoll::transport::thread::ThreadFabric;
use ferrocoll::transport::{CallKind, Header, Incoming, Outgoing, Signature, Sink, Transport};
use ferrocoll::{local, Algorithm, CallOptions, Collective, DType};

/// A sender's sink: in `overlap`, waits (at most 10 s) for `received`.
struct WaitsInOverlap<'a> {
    received: &'a AtomicBool,
    /// Whether `overlap` ran, and saw the receiver done.
    overlapped: Option<bool>,
}

impl Sink for WaitsInOverlap<'_> {
    fn deliver(&mut self, _index: usize, _offset: usize, _chunk: &[u8]) {
        unreachable!("the sender receives nothing");
    }

    fn overlap(&mut self) {
        let until = Instant::now() + Duration::from_secs(10);
        while !self.received.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.overlapped = Some(self.received.load(Ordering::SeqCst));
    }
}

/// Stores what arrives.
struct Stores(Vec<u8>);

impl Sink for Stores {
    fn deliver(&mut self, _index: usize, offset: usize, chunk: &[u8]) {
        self.0.resize(offset + chunk.len(), 0);
        self.0[offset..].copy_from_slice(chunk);
    }
}

#[test]
fn the_thread_transport_overlaps_local_work_with_its_messages() {
    let fabric = ThreadFabric::new(2);
    let (t0, t1) = (fabric.transport(0), fabric.transport(1));
    let header = Header {
        comm: 0,
        seq: 0,
        sig: Signature {
            kind: CallKind::Collective(Collective::Broadcast),
            dtype: DType::U8,
            op: None,
            count: 4096,
            root: Some(0),
        },
    };
    let data: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    let received = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (root, child) = std::thread::scope(|s| {
        let child = s.spawn(|| {
            let mut sink = Stores(Vec::new());
            let r = t1.exchange(
                &header,
                &[],
                &[Incoming { peer: 0, len: 4096 }],
                &mut sink,
                deadline,
            );
            received.store(true, Ordering::SeqCst);
            r.map(|()| sink.0)
        });
        let mut sink = WaitsInOverlap {
            received: &received,
            overlapped: None,
        };
        let r = t0.exchange(
            &header,
            &[Outgoing {
                peer: 1,
                data: &data,
            }],
            &[],
            &mut sink,
            deadline,
        );
        (r.map(|()| sink.overlapped), child.join().unwrap())
    });
    // The root's overlap ran once, and the child had its message by then:
    // the send was posted before the local work started.
    assert_eq!(root.unwrap(), Some(true));
    assert_eq!(child.unwrap(), data);
}

#[test]
fn broadcasts_whose_root_copies_while_sending_deliver_every_byte() {
    for algo in [Algorithm::Tree, Algorithm::Direct] {
        for n in [1, 2, 3, 5] {
            for count in [0, 1, 7, 100_003] {
                let out = local::run(n, move |comm| -> ferrocoll::Result<_> {
                    let comm = comm.with_options(CallOptions::algorithm(algo));
                    let root = comm.size() - 1;
                    let send: Vec<u32> = (0..count as u32).map(|i| i * 3 + 1).collect();
                    let mut recv = vec![u32::MAX; count];
                    comm.broadcast(&send, &mut recv, root)?;
                    let mut buf = if comm.rank() == root {
                        send.clone()
                    } else {
                        vec![0; count]
                    };
                    comm.broadcast_in_place(&mut buf, root)?;
                    Ok((recv, buf))
                })
                .unwrap();
                let want: Vec<u32> = (0..count as u32).map(|i| i * 3 + 1).collect();
                for (rank, got) in out.into_iter().enumerate() {
                    let (recv, buf) = got.unwrap();
                    assert_eq!(recv, want, "{algo:?} n={n} count={count} rank {rank}");
                    assert_eq!(
                        buf, want,
                        "{algo:?} n={n} count={count} rank {rank} in place"
                    );
                }
            }
        }
    }
}
