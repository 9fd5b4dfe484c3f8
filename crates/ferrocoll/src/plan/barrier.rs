//! Barrier algorithms.
//!
//! Dissemination (Hensgen, Finkel and Manber): in round k every rank signals
//! rank r + 2^k and waits for rank r - 2^k. After ceil(log2 N) rounds each
//! rank has heard, directly or through others, from every rank. Works for any
//! N; messages carry no data.

use super::{Plan, PlanBuilder, PlanRequest, Span};

/// Dissemination barrier.
pub(super) fn dissemination(req: &PlanRequest) -> Plan {
    let (n, r) = (req.n, req.rank);
    let mut p = PlanBuilder::default();
    let mut dist = 1;
    while dist < n {
        p.round()
            .send((r + dist) % n, Span::input(0, 0))
            .recv((r + n - dist) % n, Span::output(0, 0));
        dist <<= 1;
    }
    p.finish()
}
