//! The micro-benchmark of the rings and doorbell (ignored by default).

use super::*;

/// How a benchmark loop idles when nothing moved: `spin` busy polls,
/// then `yields` polls that yield the CPU (so a peer sharing the core
/// runs), then sleeps on the doorbell.
#[derive(Clone, Copy, Debug)]
struct Idle {
    spin: u32,
    yields: u32,
}

impl Idle {
    /// Called after the `count`-th consecutive empty poll.
    fn pause(self, count: &mut u32, bell: &dyn Doorbell, token: u64) {
        *count += 1;
        if *count <= self.spin {
            std::hint::spin_loop();
        } else if *count <= self.spin + self.yields {
            thread::yield_now();
        } else {
            bell.wait(token, Duration::from_secs(1));
        }
    }
}

/// Sends 8-byte messages back and forth `round_trips` times; returns the
/// mean one-way latency.
fn ping_pong(round_trips: usize, idle: Idle) -> Duration {
    let (a, b) = pair("pingpong", MIN_RING_BYTES);
    let (ca, ba) = (a.channel(1), a.doorbell());
    let (cb, bb) = (b.channel(0), b.doorbell());
    let side = move |mut ch: Box<dyn Channel>, bell: Arc<dyn Doorbell>, first: bool| {
        let start = Instant::now();
        let mut buf = 0u64;
        for i in 0..round_trips as u64 {
            if first {
                assert_eq!(ch.send_some(&i.to_le_bytes()).unwrap(), 8);
            }
            let mut empty = 0;
            loop {
                let token = bell.token();
                let n = ch
                    .recv_some(&mut |b: &[u8]| {
                        if b.len() < 8 {
                            return 0;
                        }
                        buf = u64::from_le_bytes(b[..8].try_into().unwrap());
                        8
                    })
                    .unwrap();
                if n == 8 {
                    break;
                }
                idle.pause(&mut empty, &*bell, token);
            }
            assert_eq!(buf, i);
            if !first {
                assert_eq!(ch.send_some(&i.to_le_bytes()).unwrap(), 8);
            }
        }
        start.elapsed()
    };
    let t = thread::spawn(move || side(cb, bb, false));
    let elapsed = side(ca, ba, true);
    t.join().unwrap();
    elapsed / (2 * round_trips as u32)
}

/// Streams `total` bytes from a source buffer into a destination buffer
/// in `msg`-byte messages; returns bytes per second.
fn stream(ring_bytes: usize, msg: usize, total: usize, idle: Idle) -> f64 {
    let (a, b) = pair("bw", ring_bytes);
    let (mut tx, tx_bell) = (a.channel(1), a.doorbell());
    let (mut rx, rx_bell) = (b.channel(0), b.doorbell());
    // Both buffers written once up front, so no page faults are timed.
    let src = vec![3u8; msg];
    let mut dst = vec![1u8; msg];
    let rounds = total / msg;
    let receiver = thread::spawn(move || {
        for _ in 0..rounds {
            let (mut got, mut empty) = (0, 0);
            while got < msg {
                let token = rx_bell.token();
                let n = rx
                    .recv_some(&mut |b: &[u8]| {
                        let n = b.len().min(msg - got);
                        dst[got..got + n].copy_from_slice(&b[..n]);
                        n
                    })
                    .unwrap();
                got += n;
                if n == 0 {
                    idle.pause(&mut empty, &*rx_bell, token);
                } else {
                    empty = 0;
                }
            }
        }
        dst[0]
    });
    let start = Instant::now();
    for _ in 0..rounds {
        let (mut sent, mut empty) = (0, 0);
        while sent < msg {
            let token = tx_bell.token();
            let n = tx.send_some(&src[sent..]).unwrap();
            sent += n;
            if n == 0 {
                idle.pause(&mut empty, &*tx_bell, token);
            } else {
                empty = 0;
            }
        }
    }
    assert_eq!(receiver.join().unwrap(), 3);
    (rounds * msg) as f64 / start.elapsed().as_secs_f64()
}

#[test]
#[ignore = "micro-benchmark; run with --release -- --ignored --nocapture"]
fn shm_micro_benchmark() {
    // Best of three everywhere: the machine may be shared.
    let polls = Idle {
        spin: 100,
        yields: 1000,
    };
    let policies = [
        ("spin 100, yield 1000, then sleep", polls),
        ("sleep at once (futex wake)", Idle { spin: 0, yields: 0 }),
    ];
    for (what, idle) in policies {
        let lat = (0..3).map(|_| ping_pong(100_000, idle)).min().unwrap();
        println!("shm ping-pong, 8 B, {what}: {lat:?} one-way");
    }
    let total = 256 << 20;
    for ring in [64 << 10, 256 << 10, 1 << 20, 4 << 20] {
        for msg in [512 << 10, 4 << 20, 64 << 20] {
            let bw = (0..3)
                .map(|_| stream(ring, msg, total, polls))
                .fold(0.0, f64::max);
            println!(
                "shm stream, ring {:>5} KiB, messages {:>6} KiB: {:6.2} GB/s",
                ring >> 10,
                msg >> 10,
                bw / 1e9
            );
        }
    }
    let src = vec![1u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    let t = Instant::now();
    for _ in 0..16 {
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
    }
    println!(
        "reference: single-thread memcpy of 64 MiB buffers: {:.2} GB/s",
        (16 << 26) as f64 / t.elapsed().as_secs_f64() / 1e9
    );
}
