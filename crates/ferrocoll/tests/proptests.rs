//! Property tests: random group sizes, counts, roots, algorithms and data,
//! each result against a sequential reference.

use ferrocoll::{local, CallOptions, Collective, Config, ReduceOp};
use proptest::prelude::*;

/// Deterministic per-rank data from a seed (values small enough that i64
/// sums never overflow).
fn data(seed: u64, rank: usize, len: usize) -> Vec<i64> {
    let mut x = seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 2001) as i64 - 1000
        })
        .collect()
}

fn reduce_ref(op: ReduceOp, n: usize, seed: u64, len: usize) -> Vec<i64> {
    let all: Vec<Vec<i64>> = (0..n).map(|r| data(seed, r, len)).collect();
    (0..len)
        .map(|i| {
            let col = all.iter().map(|v| v[i]);
            match op {
                ReduceOp::Sum => col.sum(),
                ReduceOp::Min => col.min().unwrap(),
                ReduceOp::Max => col.max().unwrap(),
                _ => unreachable!(),
            }
        })
        .collect()
}

fn pick<T: Copy>(options: &[T], k: usize) -> T {
    options[k % options.len()]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn reductions_match_the_reference(
        n in 1usize..=8, count in 0usize..3000, root_k in 0usize..8, algo_k in 0usize..4,
        op_k in 0usize..3, seed in any::<u64>(),
    ) {
        let op = pick(&[ReduceOp::Sum, ReduceOp::Min, ReduceOp::Max], op_k);
        let root = root_k % n;
        let want = reduce_ref(op, n, seed, count);
        let got = local::run_with(n, Config::default(), |comm| {
            let me = comm.rank();
            let input = data(seed, me, count);
            let ar = comm.with_options(CallOptions::algorithm(pick(Collective::AllReduce.algorithms(), algo_k)));
            let mut all = vec![0i64; count];
            ar.all_reduce(&input, &mut all, op).unwrap();
            let rd = comm.with_options(CallOptions::algorithm(pick(Collective::Reduce.algorithms(), algo_k)));
            let mut at_root = vec![0i64; if me == root { count } else { 0 }];
            rd.reduce(&input, &mut at_root, op, root).unwrap();
            // Reduce-scatter over the first n*(count/n) elements.
            let b = count / n;
            let mut block = vec![0i64; b];
            comm.reduce_scatter(&input[..n * b], &mut block, op).unwrap();
            (all, at_root, block)
        }).unwrap();
        for (me, (all, at_root, block)) in got.into_iter().enumerate() {
            prop_assert_eq!(&all, &want);
            if me == root {
                prop_assert_eq!(&at_root, &want);
            }
            let b = count / n;
            prop_assert_eq!(&block[..], &want[me * b..(me + 1) * b]);
        }
    }

    #[test]
    fn data_movement_matches_the_reference(
        n in 1usize..=8, count in 0usize..700, root_k in 0usize..8, algo_k in 0usize..4,
        seed in any::<u64>(),
    ) {
        let root = root_k % n;
        let got = local::run_with(n, Config::default(), |comm| {
            let me = comm.rank();
            let mine = data(seed, me, count);
            let with = |c: Collective| comm.with_options(CallOptions::algorithm(pick(c.algorithms(), algo_k)));
            let mut bcast = if me == root { mine.clone() } else { vec![0; count] };
            with(Collective::Broadcast).broadcast_in_place(&mut bcast, root).unwrap();
            let mut gathered = vec![0i64; n * count];
            with(Collective::AllGather).all_gather(&mine, &mut gathered).unwrap();
            let mut at_root = vec![0i64; if me == root { n * count } else { 0 }];
            with(Collective::Gather).gather(&mine, &mut at_root, root).unwrap();
            let scattered_src = if me == root { data(seed ^ 1, root, n * count) } else { vec![] };
            let mut piece = vec![0i64; count];
            with(Collective::Scatter).scatter(&scattered_src, &mut piece, root).unwrap();
            let mut exchanged = vec![0i64; n * count];
            comm.all_to_all(&data(seed ^ 2, me, n * count), &mut exchanged).unwrap();
            (bcast, gathered, at_root, piece, exchanged)
        }).unwrap();
        let everyone: Vec<i64> = (0..n).flat_map(|r| data(seed, r, count)).collect();
        let scatter_src = data(seed ^ 1, root, n * count);
        for (me, (bcast, gathered, at_root, piece, exchanged)) in got.into_iter().enumerate() {
            prop_assert_eq!(&bcast, &data(seed, root, count));
            prop_assert_eq!(&gathered, &everyone);
            if me == root {
                prop_assert_eq!(&at_root, &everyone);
            }
            prop_assert_eq!(&piece[..], &scatter_src[me * count..(me + 1) * count]);
            let want: Vec<i64> = (0..n)
                .flat_map(|s| data(seed ^ 2, s, n * count)[me * count..(me + 1) * count].to_vec())
                .collect();
            prop_assert_eq!(&exchanged, &want);
        }
    }
}
