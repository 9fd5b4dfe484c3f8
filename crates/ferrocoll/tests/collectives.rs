//! The correctness matrix: every collective x algorithm x group size 1..=9 x
//! counts {0, 1, n-1, n, n+1, 999, ~1M} x every element type x every operator
//! (x in place and out of place, x first and last root), each result compared
//! with a naive sequential reference computed here.
//!
//! Inputs are small integers, so every reduction is exact in any order and
//! the comparison is exact for floats too (nccl-tests' "verifiable data"):
//! sums stay within +-18, products are +-2^k <= 512 for floats (integers wrap,
//! in the library and in the reference alike), min/max pick from -6..6.
//!
//! For the block collectives (allgather, reducescatter, alltoall, gather,
//! scatter) the count is the per-rank block, except for ~1M where the whole
//! buffer is ~1M elements, as nccl-tests sizes them.
//!
//! Groups of 10..=17 ranks and the topologies 1xN, 2xN/2, 4x2, 2x2x2, 3x3
//! run a lighter matrix (f32 and i32, sum and max, every algorithm).
//!
//! `FERROCOLL_TEST_ALGOS=hd,allgather:bruck` restricts the run to those
//! algorithms (a bare name selects it for every collective that has it), for
//! working on one algorithm at a time.

mod common;
use common::selected;

use ferrocoll::{
    bf16, f16, local, CallOptions, Collective, Communicator, Config, Element, ReduceOp, Topology,
};

const BIG: usize = 1_000_003;
/// Every value formula below repeats with this period in the element index.
const PERIOD: usize = 195;

trait TestElem: Element {
    const UNSIGNED: bool;
    /// Exact for the small values used; integers wrap like the library.
    fn from_i64(v: i64) -> Self;
    /// `Avg` as the library defines it: the exact sum, divided once.
    fn avg(sum: i64, n: usize) -> Self;
}

macro_rules! int_elem {
    ($($t:ty: $unsigned:expr),*) => {$(
        impl TestElem for $t {
            const UNSIGNED: bool = $unsigned;
            fn from_i64(v: i64) -> Self { v as $t }
            fn avg(sum: i64, n: usize) -> Self { (sum as $t) / (n as $t) }
        }
    )*};
}
int_elem!(i8: false, i32: false, i64: false, u8: true, u32: true, u64: true);

impl TestElem for f32 {
    const UNSIGNED: bool = false;
    fn from_i64(v: i64) -> Self {
        v as f32
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f32 / n as f32
    }
}
impl TestElem for f64 {
    const UNSIGNED: bool = false;
    fn from_i64(v: i64) -> Self {
        v as f64
    }
    fn avg(sum: i64, n: usize) -> Self {
        sum as f64 / n as f64
    }
}
macro_rules! half_elem {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            const UNSIGNED: bool = false;
            fn from_i64(v: i64) -> Self { <$t>::from_f32(v as f32) }
            fn avg(sum: i64, n: usize) -> Self { <$t>::from_f32(sum as f32 / n as f32) }
        }
    )*};
}
half_elem!(f16, bf16);

/// Input of `rank` at element `i` for a reduction with `op`.
fn red_value<T: TestElem>(op: ReduceOp, rank: usize, i: usize) -> i64 {
    let (r, i) = (rank as i64, i as i64);
    match op {
        ReduceOp::Sum | ReduceOp::Avg => (r * 7 + i * 3) % 5 - if T::UNSIGNED { 0 } else { 2 },
        ReduceOp::Prod => {
            let k = ((r + i) % 3) as usize;
            if T::UNSIGNED {
                [1, 2, 3][k]
            } else {
                [1, 2, -1][k]
            }
        }
        ReduceOp::Min | ReduceOp::Max => (r * 5 + i * 11) % 13 - if T::UNSIGNED { 0 } else { 6 },
    }
}

/// The reduction over ranks `0..n` of `red_value(op, rank, i)`.
fn red_expected<T: TestElem>(op: ReduceOp, n: usize, i: usize) -> T {
    let vals = (0..n).map(|r| red_value::<T>(op, r, i));
    match op {
        ReduceOp::Sum => T::from_i64(vals.sum()),
        ReduceOp::Avg => T::avg(vals.sum(), n),
        ReduceOp::Prod => T::from_i64(vals.fold(1i64, |a, v| a.wrapping_mul(v))),
        ReduceOp::Min => T::from_i64(vals.min().unwrap()),
        ReduceOp::Max => T::from_i64(vals.max().unwrap()),
    }
}

/// Data that is moved, not reduced: distinct for every (tag, i mod 97).
fn move_value<T: TestElem>(tag: usize, i: usize) -> T {
    T::from_i64(((tag * 13 + i * 7) % 97) as i64)
}

/// `len` values of `f(start + i)`, where `f` has period [`PERIOD`] (or a
/// divisor of it): computed once per period and tiled.
fn tiled<T: TestElem>(start: usize, len: usize, f: impl Fn(usize) -> T) -> Vec<T> {
    let period: Vec<T> = (0..PERIOD.min(len)).map(|i| f(start + i)).collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = (len - out.len()).min(period.len());
        out.extend_from_slice(&period[..take]);
    }
    out
}

/// As [`tiled`] for the period-97 movement data.
fn moved<T: TestElem>(tag: usize, len: usize) -> Vec<T> {
    let period: Vec<T> = (0..97.min(len)).map(|i| move_value(tag, i)).collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = (len - out.len()).min(period.len());
        out.extend_from_slice(&period[..take]);
    }
    out
}

struct Checker<'a> {
    comm: &'a Communicator,
    failures: Vec<String>,
    checks: usize,
}

impl Checker<'_> {
    fn expect<T: TestElem>(&mut self, what: &str, got: &[T], want: &[T]) {
        self.checks += 1;
        if got != want {
            let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count()
                + got.len().abs_diff(want.len());
            let first = got.iter().zip(want).position(|(g, w)| g != w);
            self.failures.push(format!(
                "rank {} {what}: {wrong} wrong of {} (first at {first:?}: got {:?}, want {:?})",
                self.comm.rank(),
                want.len(),
                first.map(|i| got[i]),
                first.map(|i| want[i]),
            ));
        }
    }

    fn ok(&mut self, what: &str, r: ferrocoll::Result<()>) -> bool {
        match r {
            Ok(()) => true,
            Err(e) => {
                self.failures
                    .push(format!("rank {} {what}: error {e}", self.comm.rank()));
                false
            }
        }
    }
}

fn counts(n: usize) -> Vec<usize> {
    let mut c = vec![0, 1, n.saturating_sub(1), n, n + 1, 999, BIG];
    c.sort_unstable();
    c.dedup();
    c
}

/// Per-rank block for the block collectives.
fn block_count(n: usize, count: usize) -> usize {
    if count == BIG {
        BIG / n
    } else {
        count
    }
}

fn roots(n: usize) -> Vec<usize> {
    let mut r = vec![0, n - 1];
    r.dedup();
    r
}

/// Which part of the matrix a run covers.
#[derive(Clone, Copy, PartialEq)]
enum Depth {
    /// Every element type, every operator.
    Full,
    /// f32 and i32 with the operators in `LIGHT_OPS`.
    Light,
}

const LIGHT_OPS: [ReduceOp; 2] = [ReduceOp::Sum, ReduceOp::Max];

fn check_type<T: TestElem>(ck: &mut Checker<'_>, depth: Depth) {
    let comm = ck.comm;
    let (n, me) = (comm.size(), comm.rank());
    let dt = T::DTYPE;
    for coll in Collective::ALL {
        for &algo in coll.algorithms().iter().filter(|&&a| selected(coll, a)) {
            let c = comm.with_options(CallOptions::algorithm(algo));
            let ops: &[ReduceOp] = match (coll.reduces(), depth) {
                (false, _) => &[ReduceOp::Sum],
                (true, Depth::Full) => &ReduceOp::ALL,
                (true, Depth::Light) => &LIGHT_OPS,
            };
            for count in counts(n) {
                for &op in ops {
                    let what =
                        |extra: &str| format!("{coll}/{algo} {dt} {op} count={count} {extra}");
                    match coll {
                        Collective::AllReduce => {
                            let input = tiled(0, count, |i| T::from_i64(red_value::<T>(op, me, i)));
                            let want = tiled(0, count, |i| red_expected::<T>(op, n, i));
                            let mut out = vec![T::zeroed(); count];
                            if ck.ok(&what("oop"), c.all_reduce(&input, &mut out, op)) {
                                ck.expect(&what("oop"), &out, &want);
                            }
                            let mut buf = input.clone();
                            if ck.ok(&what("in place"), c.all_reduce_in_place(&mut buf, op)) {
                                ck.expect(&what("in place"), &buf, &want);
                            }
                        }
                        Collective::Reduce => {
                            for root in roots(n) {
                                let w = what(&format!("root={root}"));
                                let input =
                                    tiled(0, count, |i| T::from_i64(red_value::<T>(op, me, i)));
                                let want = tiled(0, count, |i| red_expected::<T>(op, n, i));
                                let mut out = vec![T::zeroed(); if me == root { count } else { 0 }];
                                if ck.ok(&w, c.reduce(&input, &mut out, op, root)) && me == root {
                                    ck.expect(&w, &out, &want);
                                }
                                let mut buf = input.clone();
                                if ck.ok(&w, c.reduce_in_place(&mut buf, op, root)) {
                                    ck.expect(
                                        &(w + " in place"),
                                        &buf,
                                        if me == root { &want } else { &input },
                                    );
                                }
                            }
                        }
                        Collective::ReduceScatter => {
                            let b = block_count(n, count);
                            let input = tiled(0, n * b, |i| T::from_i64(red_value::<T>(op, me, i)));
                            let want = tiled(me * b, b, |i| red_expected::<T>(op, n, i));
                            let mut out = vec![T::zeroed(); b];
                            if ck.ok(&what("oop"), c.reduce_scatter(&input, &mut out, op)) {
                                ck.expect(&what("oop"), &out, &want);
                            }
                            let mut buf = input.clone();
                            if ck.ok(&what("in place"), c.reduce_scatter_in_place(&mut buf, op)) {
                                ck.expect(&what("in place"), &buf[me * b..(me + 1) * b], &want);
                            }
                        }
                        Collective::Broadcast => {
                            for root in roots(n) {
                                let w = what(&format!("root={root}"));
                                let want: Vec<T> = moved(root, count);
                                let mine: Vec<T> = moved(me, count);
                                let mut out = vec![T::zeroed(); count];
                                let send: &[T] = if me == root { &mine } else { &[] };
                                if ck.ok(&w, c.broadcast(send, &mut out, root)) {
                                    ck.expect(&w, &out, &want);
                                }
                                let mut buf = mine.clone();
                                if ck.ok(&w, c.broadcast_in_place(&mut buf, root)) {
                                    ck.expect(&(w + " in place"), &buf, &want);
                                }
                            }
                        }
                        Collective::AllGather => {
                            let b = block_count(n, count);
                            let mine: Vec<T> = moved(me, b);
                            let want: Vec<T> = (0..n).flat_map(|p| moved::<T>(p, b)).collect();
                            let mut out = vec![T::zeroed(); n * b];
                            if ck.ok(&what("oop"), c.all_gather(&mine, &mut out)) {
                                ck.expect(&what("oop"), &out, &want);
                            }
                            let mut buf = vec![T::zeroed(); n * b];
                            buf[me * b..(me + 1) * b].copy_from_slice(&mine);
                            if ck.ok(&what("in place"), c.all_gather_in_place(&mut buf)) {
                                ck.expect(&what("in place"), &buf, &want);
                            }
                        }
                        Collective::AllToAll => {
                            let b = block_count(n, count);
                            let send: Vec<T> =
                                (0..n).flat_map(|p| moved::<T>(me * n + p, b)).collect();
                            let want: Vec<T> =
                                (0..n).flat_map(|p| moved::<T>(p * n + me, b)).collect();
                            let mut out = vec![T::zeroed(); n * b];
                            if ck.ok(&what(""), c.all_to_all(&send, &mut out)) {
                                ck.expect(&what(""), &out, &want);
                            }
                        }
                        Collective::AllToAllV => {
                            // Uneven: rank s sends (s + 2d + count) % 7 (times
                            // count/1000 for the big case) elements to rank d.
                            let scale = if count == BIG { BIG / (7 * n) } else { 1 };
                            let amount = |s: usize, d: usize| ((s + 2 * d + count) % 7) * scale;
                            let send_counts: Vec<usize> = (0..n).map(|d| amount(me, d)).collect();
                            let recv_counts: Vec<usize> = (0..n).map(|s| amount(s, me)).collect();
                            let send: Vec<T> = (0..n)
                                .flat_map(|d| moved::<T>(me * n + d, amount(me, d)))
                                .collect();
                            let want: Vec<T> = (0..n)
                                .flat_map(|s| moved::<T>(s * n + me, amount(s, me)))
                                .collect();
                            let mut out = vec![T::zeroed(); want.len()];
                            if ck.ok(
                                &what(""),
                                c.all_to_all_v(&send, &send_counts, &mut out, &recv_counts),
                            ) {
                                ck.expect(&what(""), &out, &want);
                            }
                        }
                        Collective::Gather => {
                            for root in roots(n) {
                                let w = what(&format!("root={root}"));
                                let b = block_count(n, count);
                                let mine: Vec<T> = moved(me, b);
                                let mut out = vec![T::zeroed(); if me == root { n * b } else { 0 }];
                                if ck.ok(&w, c.gather(&mine, &mut out, root)) && me == root {
                                    let want: Vec<T> =
                                        (0..n).flat_map(|p| moved::<T>(p, b)).collect();
                                    ck.expect(&w, &out, &want);
                                }
                            }
                        }
                        Collective::Scatter => {
                            for root in roots(n) {
                                let w = what(&format!("root={root}"));
                                let b = block_count(n, count);
                                let send: Vec<T> = if me == root {
                                    (0..n).flat_map(|p| moved::<T>(p + 5, b)).collect()
                                } else {
                                    Vec::new()
                                };
                                let mut out = vec![T::zeroed(); b];
                                if ck.ok(&w, c.scatter(&send, &mut out, root)) {
                                    ck.expect(&w, &out, &moved::<T>(me + 5, b));
                                }
                            }
                        }
                        Collective::Barrier => {
                            if count == 0 {
                                ck.checks += 1;
                                ck.ok(&what(""), c.barrier());
                            }
                        }
                    }
                }
            }
        }
    }
}

fn run_matrix(n: usize, topology: Option<&str>, depth: Depth) {
    let mut config = Config::default();
    if let Some(t) = topology {
        config = config.with_topology(t.parse::<Topology>().unwrap());
    }
    let results = local::run_with(n, config, |comm| {
        let mut ck = Checker {
            comm: &comm,
            failures: Vec::new(),
            checks: 0,
        };
        check_type::<f32>(&mut ck, depth);
        check_type::<i32>(&mut ck, depth);
        if depth == Depth::Full {
            check_type::<f64>(&mut ck, depth);
            check_type::<f16>(&mut ck, depth);
            check_type::<bf16>(&mut ck, depth);
            check_type::<i8>(&mut ck, depth);
            check_type::<i64>(&mut ck, depth);
            check_type::<u8>(&mut ck, depth);
            check_type::<u32>(&mut ck, depth);
            check_type::<u64>(&mut ck, depth);
        }
        (ck.checks, ck.failures)
    })
    .unwrap();
    let what = format!("n={n} topology={topology:?}");
    let failures: Vec<&String> = results.iter().flat_map(|(_, f)| f).take(20).collect();
    assert!(failures.is_empty(), "{what}: {failures:#?}");
    // Every rank checked something (all algorithms unless filtered).
    assert!(results.iter().all(|(checks, _)| *checks > 0), "{what}");
}

macro_rules! matrix_tests {
    ($($name:ident: $n:expr, $topo:expr, $depth:expr;)*) => {$(
        #[test]
        fn $name() {
            run_matrix($n, $topo, $depth);
        }
    )*};
}

matrix_tests!(
    matrix_n1: 1, None, Depth::Full;
    matrix_n2: 2, None, Depth::Full;
    matrix_n3: 3, None, Depth::Full;
    matrix_n4: 4, None, Depth::Full;
    matrix_n5: 5, None, Depth::Full;
    matrix_n6: 6, None, Depth::Full;
    matrix_n7: 7, None, Depth::Full;
    matrix_n8: 8, None, Depth::Full;
    matrix_n9: 9, None, Depth::Full;
    light_n10: 10, None, Depth::Light;
    light_n11: 11, None, Depth::Light;
    light_n12: 12, None, Depth::Light;
    light_n13: 13, None, Depth::Light;
    light_n14: 14, None, Depth::Light;
    light_n15: 15, None, Depth::Light;
    light_n16: 16, None, Depth::Light;
    light_n17: 17, None, Depth::Light;
    topo_1x4: 4, Some("1x4"), Depth::Light;
    topo_2x2: 4, Some("2x2"), Depth::Light;
    topo_2x3: 6, Some("2x3"), Depth::Light;
    topo_2x4: 8, Some("2x4"), Depth::Full;
    topo_4x2: 8, Some("4x2"), Depth::Light;
    topo_2x2x2: 8, Some("2x2x2"), Depth::Light;
    topo_3x3: 9, Some("3x3"), Depth::Light;
    topo_2x2x3: 12, Some("2x2x3"), Depth::Light;
);
