//! The sizes of a sweep and what the bandwidths are scaled by: [`sweep`]
//! turns `--minbytes`, `--maxbytes` and `--stepfactor` into whole buffers of
//! the collective (all n blocks for the block collectives, the average send
//! buffer for alltoallv), and [`bus_factor`] is nccl-tests' busbw / algbw.

use ferrocoll::Collective;

use crate::verify;

/// One size of the sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    /// The whole buffer, nccl-tests style (all n blocks for the block
    /// collectives; the average send buffer for alltoallv).
    pub bytes: usize,
    /// Elements per rank buffer (per block for the block collectives, the
    /// average block `b` of the count formula for alltoallv).
    pub count: usize,
}

/// True for the collectives whose size counts all n blocks (n average
/// blocks for alltoallv).
pub(super) fn is_block(coll: Collective) -> bool {
    matches!(
        coll,
        Collective::AllGather
            | Collective::ReduceScatter
            | Collective::AllToAll
            | Collective::AllToAllV
            | Collective::Gather
            | Collective::Scatter
    )
}

/// Sizes from `min` to `max` bytes, multiplying by `factor`, and `max`
/// itself when the steps miss it (8 B by 4 reaches 32 MiB, then 64 MiB
/// ends the sweep), rounded down to whole elements (whole n-block buffers
/// for the block collectives); sizes that round to nothing are skipped.
/// For alltoallv each size fixes the average block and reports the average
/// send buffer (see the module docs).
pub fn sweep(
    coll: Collective,
    n: usize,
    elem: usize,
    min: usize,
    max: usize,
    factor: usize,
) -> Vec<Size> {
    let unit = elem * if is_block(coll) { n } else { 1 };
    let mut sizes: Vec<Size> = Vec::new();
    let mut bytes = Some(min);
    let mut last = false;
    while let Some(b) = bytes {
        let b = if b > max {
            // Past the end: the sweep ends at `max` itself.
            if last {
                break;
            }
            max
        } else {
            b
        };
        last |= b == max;
        let count = b / unit;
        let reported = if coll == Collective::AllToAllV {
            verify::alltoallv_mean(n, count).saturating_mul(elem)
        } else {
            count * unit
        };
        if reported > 0 && sizes.last().map_or(true, |s| s.count != count) {
            sizes.push(Size {
                bytes: reported,
                count,
            });
        }
        bytes = match b.checked_mul(factor) {
            Some(next) => Some(next),
            // Overflow: only `max` remains to do.
            None if !last => Some(max),
            None => None,
        };
    }
    sizes
}

/// busbw / algbw for `coll` on `n` ranks (nccl-tests' factors).
pub fn bus_factor(coll: Collective, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::Broadcast | Collective::Reduce => 1.0,
        _ => (n - 1.0) / n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_rounds_to_whole_blocks_and_skips_empty_ones() {
        let s = sweep(Collective::AllReduce, 4, 4, 8, 64 << 20, 4);
        assert_eq!(s.first(), Some(&Size { bytes: 8, count: 2 }));
        // The steps of 4 miss 64 MiB: the sweep ends there anyway.
        let tail: Vec<usize> = s[s.len() - 2..].iter().map(|z| z.bytes).collect();
        assert_eq!(tail, [32 << 20, 64 << 20]);
        // A sweep the steps end exactly on has no extra size.
        let s = sweep(Collective::AllReduce, 4, 4, 8, 32 << 20, 4);
        assert_eq!(s.last().unwrap().bytes, 32 << 20);
        assert_eq!(s.len(), 12);
        // 3 ranks of f32: 12-byte units; 8 B holds none.
        let s = sweep(Collective::AllGather, 3, 4, 8, 512, 4);
        assert_eq!(
            s,
            vec![
                Size {
                    bytes: 24,
                    count: 2
                },
                Size {
                    bytes: 120,
                    count: 10
                },
                Size {
                    bytes: 504,
                    count: 42
                },
            ]
        );
        assert!(sweep(Collective::AllToAll, 8, 8, 8, 32, 2).is_empty());
        // No overflow at the top of the range.
        assert!(!sweep(Collective::AllReduce, 2, 1, usize::MAX / 2, usize::MAX, 4).is_empty());
    }

    #[test]
    fn alltoallv_sizes_report_the_average_send_buffer() {
        // 3 ranks of f32: 12-byte units of one average element per block.
        let s = sweep(Collective::AllToAllV, 3, 4, 8, 512, 4);
        let blocks: Vec<usize> = s.iter().map(|z| z.count).collect();
        assert_eq!(blocks, [2, 10, 42]);
        for z in &s {
            let total: usize = (0..3)
                .map(|r| {
                    verify::alltoallv_counts(3, r, z.count)
                        .0
                        .iter()
                        .sum::<usize>()
                })
                .sum();
            assert_eq!(z.bytes, total / 3 * 4, "{z:?}");
        }
        // With b a multiple of 4, 3 ranks' weights average exactly 4.
        assert_eq!(sweep(Collective::AllToAllV, 3, 4, 48, 48, 4)[0].bytes, 48);
        // One rank sending itself b/4 elements: nothing below b = 4.
        assert_eq!(
            sweep(Collective::AllToAllV, 1, 1, 1, 8, 2),
            vec![Size { bytes: 1, count: 4 }, Size { bytes: 2, count: 8 }]
        );
        assert!(!sweep(Collective::AllToAllV, 2, 1, usize::MAX / 2, usize::MAX, 4).is_empty());
    }

    #[test]
    fn bus_factors_match_nccl_tests() {
        assert_eq!(bus_factor(Collective::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Collective::AllGather, 4), 0.75);
        assert_eq!(bus_factor(Collective::AllToAllV, 4), 0.75);
        assert_eq!(bus_factor(Collective::Broadcast, 4), 1.0);
    }
}
