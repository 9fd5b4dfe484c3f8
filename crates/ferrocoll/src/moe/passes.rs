//! Flat exchanges run expert by expert, so that no copy regroups the rows.
//!
//! An all-to-all-v delivers each source's rows together, but the experts
//! read theirs together: with E/P = L > 1 experts a rank, dispatch then
//! copies every received row once more into expert-major order, and
//! combine copies the experts' outputs back to source-major order before
//! sending. Run instead as L all-to-all-v calls, one per local expert index
//! x (each rank sends every destination d its rows for d's expert x, packed
//! by destination), the rows of expert x arrive packed by source: exactly
//! expert x's part of [`super::ExpertInputs`]; combine sends each expert's
//! contiguous rows back and the weighted sum reads the arrivals in their
//! expert-major order. The price is L-1 more rounds of start-ups, so a flat
//! schedule runs this way only when the copy saved costs more than they do
//! on the communicator's profile: (L-1)·r·α < δ·bytes, with r the rounds of
//! one all-to-all-v (1 direct, P-1 pairwise), α the larger link latency, δ
//! the copy cost per byte and bytes the most any rank receives. Every input
//! is the same on every rank, so every rank decides alike. The hierarchical
//! schedules keep one exchange and the regrouping copy.

use crate::error::Result;
use crate::types::Element;

use super::{Dispatcher, Handle, Schedule};

impl Dispatcher {
    /// Whether the exchange of `rows` (`[s·P + d]`) by `schedule` runs
    /// expert by expert.
    pub(super) fn by_expert(&self, schedule: Schedule, rows: &[usize], row_bytes: f64) -> bool {
        let (p, l) = (self.comm.size(), self.local_experts());
        let rounds = match schedule {
            Schedule::Direct | Schedule::Flat => 1,
            Schedule::Pairwise => p - 1,
            _ => return false,
        };
        if p == 1 || l == 1 {
            return false;
        }
        let profile = self.comm.profile();
        let most = (0..p)
            .map(|d| (0..p).map(|s| rows[s * p + d]).sum::<usize>())
            .max()
            .unwrap_or(0) as f64
            * row_bytes;
        let alpha = profile.intra.alpha.max(profile.inter.alpha);
        ((l - 1) * rounds) as f64 * alpha < profile.copy * most
    }

    /// Dispatch's rows expert by expert: `send` in expert-major order
    /// ([`Handle::by_expert_positions`]), into `rows` (the experts' inputs).
    pub(super) fn dispatch_by_expert<T: Element>(
        &self,
        schedule: Schedule,
        send: &[T],
        handle: &Handle,
        rows: &mut [T],
    ) -> Result<()> {
        let (p, me, l, h) = self.shape();
        let comm = self.flat_comm(schedule);
        let (mut sent, mut got) = (0, 0);
        for x in 0..l {
            // To d: its expert x's rows; from s: s's rows for my expert x.
            let out: Vec<usize> = (0..p).map(|d| handle.kept(me, d * l + x) * h).collect();
            let inn: Vec<usize> = (0..p).map(|s| handle.kept(s, me * l + x) * h).collect();
            let (a, b) = (out.iter().sum::<usize>(), inn.iter().sum::<usize>());
            comm.all_to_all_v(&send[sent..sent + a], &out, &mut rows[got..got + b], &inn)?;
            sent += a;
            got += b;
        }
        Ok(())
    }

    /// Combine's rows expert by expert: each expert's contiguous outputs
    /// back to their sources, arriving in expert-major order in `returned`.
    pub(super) fn combine_by_expert<T: Element>(
        &self,
        schedule: Schedule,
        outputs: &[T],
        handle: &Handle,
        returned: &mut [T],
    ) -> Result<()> {
        let (p, me, l, h) = self.shape();
        let comm = self.flat_comm(schedule);
        let (mut sent, mut got) = (0, 0);
        for x in 0..l {
            let out: Vec<usize> = (0..p).map(|s| handle.kept(s, me * l + x) * h).collect();
            let inn: Vec<usize> = (0..p).map(|d| handle.kept(me, d * l + x) * h).collect();
            let (a, b) = (out.iter().sum::<usize>(), inn.iter().sum::<usize>());
            comm.all_to_all_v(
                &outputs[sent..sent + a],
                &out,
                &mut returned[got..got + b],
                &inn,
            )?;
            sent += a;
            got += b;
        }
        Ok(())
    }

    /// (ranks, this rank, experts per rank, hidden).
    fn shape(&self) -> (usize, usize, usize, usize) {
        (
            self.comm.size(),
            self.comm.rank(),
            self.local_experts(),
            self.spec.hidden,
        )
    }
}
