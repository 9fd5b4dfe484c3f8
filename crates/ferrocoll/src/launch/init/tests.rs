//! Tests of the start-up: worlds of threads over TCP and shared memory, a
//! world over a store the caller hands in, and the helpers' tables.

use super::hosts::topology_of;
use super::*;
use crate::launch::node::ring_bytes;
use crate::launch::waits::rank_list;
use crate::ReduceOp;

/// `n` ranks as threads, each with its own engine (TCP or shared memory)
/// as if they were processes.
pub(crate) fn world<R: Send>(
    n: usize,
    kind: TransportKind,
    f: impl Fn(Communicator) -> R + Sync,
) -> Vec<R> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let job = format!("t{}x{port}", std::process::id());
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let spec = WorldSpec {
                    rank,
                    size: n,
                    local_rank: None,
                    local_size: None,
                    store_addr: format!("127.0.0.1:{port}"),
                    secret: "s3cret".into(),
                    job_id: job.clone(),
                    launcher: Launcher::Ferrocoll,
                };
                let f = &f;
                s.spawn(move || {
                    let config = Config::default().with_timeout(Duration::from_secs(20));
                    f(init_as(&spec, config, kind).unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn allreduce_sizes(kind: TransportKind) {
    for n in [1, 2, 3, 4] {
        let out = world(n, kind, |comm| {
            let mut sums = Vec::new();
            for count in [0usize, 1, 7, 1000, 300_000, 1 << 21] {
                let mine: Vec<f64> = (0..count).map(|i| (i % 97 + comm.rank()) as f64).collect();
                let mut out = vec![0.0; count];
                comm.all_reduce(&mine, &mut out, ReduceOp::Sum).unwrap();
                let nn = comm.size();
                let ok = out
                    .iter()
                    .enumerate()
                    .all(|(i, v)| *v == (nn * (i % 97) + nn * (nn - 1) / 2) as f64);
                sums.push(ok);
            }
            sums
        });
        for (rank, oks) in out.iter().enumerate() {
            assert!(oks.iter().all(|o| *o), "n={n} rank {rank}: {oks:?}");
        }
    }
}

#[test]
fn allreduce_over_tcp_between_threads() {
    allreduce_sizes(TransportKind::Tcp);
}

#[test]
fn allreduce_over_shm_between_threads() {
    allreduce_sizes(TransportKind::Shm);
}

/// A store shared by threads: what a framework's store looks like to
/// `init_with_rendezvous`.
type Entries = std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>;
#[derive(Clone, Default)]
struct SharedMap(Arc<(Entries, std::sync::Condvar)>);

impl Rendezvous for SharedMap {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let (map, cv) = &*self.0;
        map.lock().unwrap().insert(key.into(), value.into());
        cv.notify_all();
        Ok(())
    }
    fn wait(&mut self, keys: &[&str]) -> Result<Vec<Vec<u8>>> {
        let (map, cv) = &*self.0;
        let mut m = map.lock().unwrap();
        loop {
            if keys.iter().all(|k| m.contains_key(*k)) {
                return Ok(keys.iter().map(|k| m[*k].clone()).collect());
            }
            let (next, timeout) = cv.wait_timeout(m, Duration::from_secs(20)).unwrap();
            if timeout.timed_out() {
                return Err(Error::invalid(format!("{keys:?} never set")));
            }
            m = next;
        }
    }
    fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let (map, cv) = &*self.0;
        let mut m = map.lock().unwrap();
        let now = m
            .get(key)
            .map_or(0, |v| String::from_utf8_lossy(v).parse::<i64>().unwrap())
            + delta;
        m.insert(key.into(), now.to_string().into_bytes());
        cv.notify_all();
        Ok(now)
    }
    fn describe(&self) -> String {
        "a map shared by threads".into()
    }
}

#[test]
fn a_world_over_a_store_the_caller_hands_in() {
    for kind in [TransportKind::Shm, TransportKind::Tcp] {
        let store = SharedMap::default();
        let out: Vec<(f32, &'static str)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let store = store.clone();
                    s.spawn(move || {
                        let config = Config::default().with_timeout(Duration::from_secs(20));
                        let comm = init_with_rendezvous(
                            rank,
                            3,
                            Box::new(store),
                            Some("127.0.0.1:1"),
                            config,
                            kind,
                        )
                        .unwrap();
                        let mut v = vec![comm.rank() as f32 + 1.0; 1000];
                        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                        let launcher = comm.placement().unwrap().launcher.name();
                        (v[999], launcher)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(out, vec![(6.0, "caller"); 3], "{kind:?}");
    }
    let bad = init_with_rendezvous(
        3,
        3,
        Box::new(SharedMap::default()),
        None,
        Config::default(),
        TransportKind::Tcp,
    )
    .unwrap_err()
    .to_string();
    assert!(bad.contains("below the size"), "{bad}");
}

#[test]
fn ring_sizes_fit_the_budget() {
    assert_eq!(ring_bytes(2, None), 4 << 20);
    assert_eq!(ring_bytes(4, None), 2 << 20);
    assert_eq!(ring_bytes(8, None), 512 << 10);
    assert_eq!(ring_bytes(64, None), 64 << 10);
    assert_eq!(ring_bytes(64, Some(1 << 20)), 1 << 20);
    assert_eq!(rank_list(&[1, 3, 4, 5, 6, 9, 10]), "1, 3-6, 9, 10");
}

#[test]
fn nodes_of_equal_blocks_give_a_two_level_topology() {
    assert_eq!(topology_of(&[0, 0, 1, 1]).levels(), &[2, 2]);
    assert_eq!(topology_of(&[0, 1, 0, 1]).levels(), &[4]);
    assert_eq!(topology_of(&[0, 0, 0]).levels(), &[3]);
    assert_eq!(topology_of(&[0, 0, 0, 1]).levels(), &[4]);
}
