//! The utilization timeline: a fixed-size histogram of link busy time per
//! link class, folded into [`TIMELINE_BUCKETS`] equal buckets at the end of
//! a run (see the engine's module docs, "Timeline").

/// Number of equal time buckets of
/// [`Trace::timeline`](super::Trace::timeline) (and of
/// `SimResult::timeline`), spanning the run from 0 to its end.
pub const TIMELINE_BUCKETS: usize = 200;

/// Fine bins of the timeline histogram per class (see the engine's module
/// docs).
pub(super) const FINE: usize = TIMELINE_BUCKETS * 16;

/// The timeline histogram of one group: per class, [`FINE`] bins of
/// `width` seconds (0 until the first interval).
pub(crate) struct Histogram {
    width: f64,
    bins: Vec<f64>,
}

impl Histogram {
    pub(crate) fn new(classes: usize) -> Histogram {
        Histogram {
            width: 0.0,
            bins: vec![0.0; classes * FINE],
        }
    }

    /// Adds busy time over `[s, e]`, `weight` times, to class `class`.
    pub(crate) fn add(&mut self, class: usize, s: f64, e: f64, weight: f64) {
        if e <= s || !e.is_finite() {
            return;
        }
        if self.width == 0.0 {
            self.width = e / FINE as f64;
        }
        while e > self.width * FINE as f64 {
            // Twice as wide: merge neighbouring bins.
            for row in self.bins.chunks_mut(FINE) {
                for i in 0..FINE / 2 {
                    row[i] = row[2 * i] + row[2 * i + 1];
                }
                row[FINE / 2..].fill(0.0);
            }
            self.width *= 2.0;
        }
        let w = self.width;
        let row = &mut self.bins[class * FINE..(class + 1) * FINE];
        let first = ((s / w) as usize).min(FINE - 1);
        let last = ((e / w) as usize).min(FINE - 1);
        if first == last {
            row[first] += (e - s) * weight;
            return;
        }
        row[first] += ((first + 1) as f64 * w - s) * weight;
        for b in &mut row[first + 1..last] {
            *b += w * weight;
        }
        row[last] += (e - last as f64 * w) * weight;
    }

    /// [`TIMELINE_BUCKETS`] utilizations per class over `[0, t]`;
    /// `sizes[c]` is the number of links of class c.
    pub(crate) fn finish(&self, t: f64, sizes: &[usize]) -> Vec<Vec<f64>> {
        let nb = TIMELINE_BUCKETS;
        let cw = t / nb as f64;
        sizes
            .iter()
            .enumerate()
            .map(|(c, &size)| {
                let mut out = vec![0.0; nb];
                if t.is_nan() || t <= 0.0 || self.width == 0.0 {
                    return out;
                }
                let w = self.width;
                for (i, &v) in self.bins[c * FINE..(c + 1) * FINE].iter().enumerate() {
                    if v == 0.0 {
                        continue;
                    }
                    let (a, hi) = (i as f64 * w, ((i + 1) as f64 * w).min(t));
                    if hi <= a {
                        out[nb - 1] += v;
                        continue;
                    }
                    let j0 = ((a / cw) as usize).min(nb - 1);
                    let j1 = ((hi / cw) as usize).min(nb - 1);
                    for (j, o) in out.iter_mut().enumerate().take(j1 + 1).skip(j0) {
                        let lo = a.max(j as f64 * cw);
                        let up = if j == nb - 1 {
                            hi
                        } else {
                            hi.min((j + 1) as f64 * cw)
                        };
                        if up > lo {
                            *o += v * (up - lo) / (hi - a);
                        }
                    }
                }
                let cap = cw * size.max(1) as f64;
                // Rounding leaves a full bucket a few ulps above 1.
                out.iter_mut().for_each(|o| {
                    *o /= cap;
                    if *o > 1.0 && *o < 1.0 + 1e-9 {
                        *o = 1.0;
                    }
                });
                out
            })
            .collect()
    }
}
