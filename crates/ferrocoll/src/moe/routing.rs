//! The routing decision, without I/O: from the count matrix every rank holds
//! after the count exchange, how many of each source rank's (token, choice)
//! pairs every expert keeps.
//!
//! The matrix is `routed[(s·E + e)·k + j]`: the number of source rank s's
//! tokens whose choice j (0 = the router's first choice) is expert e. Every
//! rank holds the same matrix and runs the same pure function on it, so
//! every rank reaches the same decision with no further message: a source
//! knows which of its pairs travel, a destination how many rows arrive from
//! each source.

use std::ops::Sub;

/// Capacity of every expert under [`super::Policy::Drop`]: the seed's
/// Capacity_e = ⌈P·T·k/E · C⌉ with P·T the tokens of all ranks together
/// (`total_pairs` = P·T·k, the pairs routed in this call), computed in f64
/// as GShard and DeepSpeed compute it (`ceil` of a float).
///
/// With equal T on every rank this is exactly the seed's formula. With
/// uneven T, P·T is read as the global batch (the seed draws each expert's
/// load from Binomial(P·T, p_e), a distribution over all tokens): the
/// capacity follows the expected load, not the largest rank's batch (T =
/// max would inflate every expert's buffer by max/mean).
pub(crate) fn capacity(total_pairs: usize, experts: usize, factor: f64) -> usize {
    let exact = total_pairs as f64 * factor / experts as f64;
    // Finite and non-negative: the factor is checked by Dispatcher::new.
    exact.ceil() as usize
}

/// How many pairs of each (source rank, expert, choice) an expert keeps,
/// in the layout of `routed`: with `capacity` `None` (dropless) all of
/// them; otherwise each expert fills its `capacity` slots in the global
/// priority order (choice index, source rank, token position), GShard's
/// rule extended across ranks: every first choice of every rank before any
/// second choice, and among equal choices the lower rank, then the earlier
/// token. The position part is the source's to apply: it keeps the first
/// `kept[(s·E + e)·k + j]` of its choice-j pairs to e in token order.
///
/// Generic over the count type so that the cost model runs the same rule
/// on expected (fractional) counts.
pub(crate) fn keep_in_priority_order<N>(
    routed: &[N],
    ranks: usize,
    experts: usize,
    topk: usize,
    capacity: Option<N>,
) -> Vec<N>
where
    N: Copy + PartialOrd + Sub<Output = N>,
{
    let Some(capacity) = capacity else {
        return routed.to_vec();
    };
    let at = |s: usize, e: usize, j: usize| (s * experts + e) * topk + j;
    let mut kept = routed.to_vec();
    for e in 0..experts {
        let mut left = capacity;
        for j in 0..topk {
            for s in 0..ranks {
                let want = routed[at(s, e, j)];
                let take = if want < left { want } else { left };
                kept[at(s, e, j)] = take;
                left = left - take;
            }
        }
    }
    kept
}

/// The dispatcher's decision on the count matrix `routed` (see
/// [`keep_in_priority_order`] for the layout) of `ranks` ranks under
/// `policy`: every expert's capacity (`None`: dropless) and the pairs kept
/// per (source rank, expert, choice).
pub(crate) fn decide(
    routed: &[usize],
    ranks: usize,
    experts: usize,
    topk: usize,
    policy: super::Policy,
) -> (Option<usize>, Vec<usize>) {
    let capacity = match policy {
        super::Policy::Drop { capacity_factor } => {
            Some(capacity(routed.iter().sum(), experts, capacity_factor))
        }
        super::Policy::Dropless => None,
    };
    (
        capacity,
        keep_in_priority_order(routed, ranks, experts, topk, capacity),
    )
}

/// Rows every rank sends every rank, `[s·P + d]`, from the rows kept per
/// (source rank, expert) `kept[s·E + e]` (experts contiguous per rank).
pub(crate) fn rank_rows(kept: &[usize], ranks: usize, experts: usize) -> Vec<usize> {
    let l = experts / ranks;
    (0..ranks * ranks)
        .map(|q| {
            let (s, d) = (q / ranks, q % ranks);
            kept[s * experts + d * l..][..l].iter().sum()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_the_seeds_formula() {
        // Napkin Math 1.4: 4096 tokens, top-1, 64 experts, C = 1: 64 rows.
        assert_eq!(capacity(4096, 64, 1.0), 64);
        assert_eq!(capacity(4096, 64, 1.25), 80);
        // Top-2 doubles the pairs: 2·4096/64 = 128.
        assert_eq!(capacity(2 * 4096, 64, 1.0), 128);
        // Rounds up: 10 pairs over 4 experts at C = 1 is 2.5 -> 3.
        assert_eq!(capacity(10, 4, 1.0), 3);
        assert_eq!(capacity(0, 4, 1.5), 0);
    }

    #[test]
    fn first_choices_of_every_rank_come_before_second_choices() {
        // 2 ranks, 1 expert, top-2, capacity 5: rank 0 routes 3 first and
        // 2 second choices to it, rank 1 routes 1 first and 4 second.
        let routed = [3usize, 2, 1, 4];
        let kept = keep_in_priority_order(&routed, 2, 1, 2, Some(5));
        // First choices: 3 (rank 0) + 1 (rank 1); the one slot left goes to
        // rank 0's first second choice; rank 1's second choices all drop.
        assert_eq!(kept, vec![3, 1, 1, 0]);
        assert_eq!(keep_in_priority_order(&routed, 2, 1, 2, None), routed);
    }

    #[test]
    fn lower_ranks_win_among_equal_choices_and_experts_are_independent() {
        // 3 ranks, 2 experts, top-1, capacity 2.
        let routed = [2usize, 0, 1, 1, 3, 5];
        let kept = keep_in_priority_order(&routed, 3, 2, 1, Some(2));
        // Expert 0: rank 0's 2 fill it. Expert 1: rank 1's 1, then 1 of rank 2's 5.
        assert_eq!(kept, vec![2, 0, 0, 1, 0, 1]);
        // The same rule on expected counts (the cost model's use).
        let kept = keep_in_priority_order(&[1.5f64, 2.0], 2, 1, 1, Some(2.5));
        assert_eq!(kept, vec![1.5, 1.0]);
    }
}
