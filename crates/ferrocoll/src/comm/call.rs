//! The call runner: what every collective does once its arguments are
//! checked. It takes the next sequence number, runs small calls on the
//! shared-memory fast path, and otherwise chooses the algorithm
//! ([`crate::select`]), builds the plan (cut into cache-sized slices for
//! large elementwise calls), runs it with [`exec::execute`], ends the call
//! on the transport and reports errors in this group's ranks.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{coll_bit, Communicator};
use crate::error::{Error, Result};
use crate::exec::{self, Call, Memory};
use crate::plan::{self, Algorithm, Collective, Layout, Op, Plan, PlanRequest, Round};
use crate::transport::{CallKind, Header, Signature, SmallBuffers, SmallCall, SmallCollectives};
use crate::types::{DType, ReduceOp};

/// How long a timeout waits for the peers to say where they are (the
/// desync report): they answer within microseconds when they are in a call.
const DESYNC_WAIT: Duration = Duration::from_millis(100);

/// A collective call resolved once ([`Communicator::prepare`]): what
/// persistent collectives keep between runs.
pub(super) struct Prepared {
    pub(super) spec: Spec,
    /// `None`: the call takes the transport's small-collective path.
    planned: Option<Planned>,
}

impl Prepared {
    /// Whether runs take the small-collective fast path.
    pub(super) fn is_fast(&self) -> bool {
        self.planned.is_none()
    }

    /// The algorithm runs use (`None` on the fast path).
    pub(super) fn algorithm(&self) -> Option<Algorithm> {
        self.planned.as_ref().map(|p| p.algo)
    }
}

/// The algorithm and plans of a call that runs as plans.
struct Planned {
    algo: Algorithm,
    /// Why `algo` was chosen (for `FERROCOLL_DEBUG`).
    why: String,
    /// The size choice looked at.
    bytes: usize,
    /// `(offset, len)` in elements of each consecutive piece
    /// ([`exec::slices`]).
    slices: Vec<(usize, usize)>,
    /// The plan for each distinct slice length (there are at most two, see
    /// [`crate::plan::block`]; an array keeps the plain call free of a second
    /// allocation).
    plans: [Option<(usize, Plan)>; 2],
}

/// Everything that describes one collective call.
pub(super) struct Spec {
    pub(super) coll: Collective,
    pub(super) dtype: DType,
    pub(super) op: Option<ReduceOp>,
    pub(super) count: usize,
    pub(super) root: usize,
    pub(super) send_counts: Vec<usize>,
    pub(super) recv_counts: Vec<usize>,
    pub(super) in_place: bool,
}

impl Spec {
    pub(super) fn new(coll: Collective, dtype: DType, count: usize) -> Spec {
        Spec {
            coll,
            dtype,
            op: None,
            count,
            root: 0,
            send_counts: Vec::new(),
            recv_counts: Vec::new(),
            in_place: false,
        }
    }
    pub(super) fn op(mut self, op: ReduceOp) -> Spec {
        self.op = Some(op);
        self
    }
    pub(super) fn root(mut self, root: usize) -> Spec {
        self.root = root;
        self
    }
    pub(super) fn in_place(mut self) -> Spec {
        self.in_place = true;
        self
    }
    pub(super) fn signature(&self) -> Signature {
        Signature {
            kind: CallKind::Collective(self.coll),
            dtype: self.dtype,
            op: self.op,
            count: self.count,
            root: self.coll.has_root().then_some(self.root),
        }
    }
}

impl Communicator {
    /// The transport's small-collective path to run a call on, if the
    /// call qualifies.
    pub(super) fn small_path(
        &self,
        coll: Collective,
        count: usize,
        dtype: DType,
    ) -> Option<&dyn SmallCollectives> {
        if !self.shared.fast
            || self.options.algorithm.is_some()
            || self.shared.fast_colls & coll_bit(coll) == 0
        {
            return None;
        }
        let small = self.shared.transport.small_collectives()?;
        small
            .eligible(coll, count, dtype, self.size())
            .then_some(small)
    }

    /// Runs a small call on the fast path.
    fn run_fast(
        &self,
        small: &dyn SmallCollectives,
        spec: &Spec,
        mem: &mut Memory<'_>,
    ) -> Result<()> {
        let seq = self.next_seq();
        if self.shared.config.debug && self.rank() == 0 {
            eprintln!(
                "ferrocoll: {} #{seq} {} B on {} ranks -> shared-memory fast path",
                spec.coll,
                self.call_bytes(spec.coll, spec.count, spec.dtype),
                self.size()
            );
        }
        let call = SmallCall {
            group: &self.shared.group,
            rank: self.rank(),
            coll: spec.coll,
            dtype: spec.dtype,
            op: spec.op.unwrap_or(ReduceOp::Sum),
            root: spec.root,
            count: spec.count,
            header: Header {
                comm: self.shared.id,
                seq,
                sig: spec.signature(),
            },
            timeout: self.options.timeout.unwrap_or(self.shared.config.timeout),
        };
        small
            .run(&call, SmallBuffers { mem })
            .map_err(|e| self.group_error(e))?;
        // What this rank wrote into the mailboxes for the others: its
        // contribution (nothing for a broadcast's receivers, a reduce's
        // root or a barrier; the others' blocks for the block collectives).
        let bytes = match spec.coll {
            Collective::Broadcast if self.rank() != spec.root => 0,
            Collective::Reduce if self.rank() == spec.root => 0,
            Collective::Barrier => 0,
            // One block for each other rank.
            Collective::AllToAll | Collective::ReduceScatter => {
                (self.size() - 1) * spec.count * spec.dtype.size()
            }
            _ if self.size() > 1 => spec.count * spec.dtype.size(),
            _ => 0,
        };
        if bytes > 0 {
            // Skipped when zero: a locked add (~6 ns here, and it waits
            // for the call's stores to drain) is not free on a ~0.1 us
            // broadcast receiver's call.
            self.shared.sent.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    pub(super) fn next_seq(&self) -> u64 {
        self.reserved_seq
            .unwrap_or_else(|| self.shared.next_seq.fetch_add(1, Ordering::Relaxed))
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.options.timeout.unwrap_or(self.shared.config.timeout)
    }

    /// Rewrites transport (world) ranks in an error into this group's ranks.
    fn group_error(&self, err: Error) -> Error {
        let g = |w: usize| self.shared.group.iter().position(|&x| x == w).unwrap_or(w);
        match err {
            Error::Timeout {
                collective,
                seq,
                rank,
                peer,
                waited,
                report,
            } => {
                let report = if report.is_empty() {
                    self.desync_report(&collective, seq, g(peer))
                } else {
                    report
                };
                if self.shared.config.debug && !report.is_empty() {
                    eprintln!(
                        "ferrocoll: rank {} timed out; where every rank is: {report}",
                        g(rank)
                    );
                }
                Error::Timeout {
                    collective,
                    seq,
                    rank: g(rank),
                    peer: g(peer),
                    waited,
                    report,
                }
            }
            Error::Mismatch {
                rank,
                local,
                peer,
                remote,
            } => Error::Mismatch {
                rank: g(rank),
                local,
                peer: g(peer),
                remote,
            },
            Error::PeerLost { rank } => Error::PeerLost { rank: g(rank) },
            other => other,
        }
    }

    /// Where every rank of this group is, as far as the transport can ask
    /// within [`DESYNC_WAIT`] (`rank 0: in all_reduce(...) #5 (this rank);
    /// rank 1: no answer ...`), for a timeout of this rank in `collective`
    /// (call or tag `seq`) waiting for `peer`; empty when the transport
    /// cannot ask at all.
    fn desync_report(&self, collective: &str, seq: u64, peer: usize) -> String {
        let group = &self.shared.group;
        let found = self
            .shared
            .transport
            .positions(self.shared.id, group, DESYNC_WAIT);
        if found.iter().all(Option::is_none) {
            return String::new();
        }
        found
            .iter()
            .enumerate()
            .map(|(r, at)| match at {
                _ if r == self.rank() => {
                    let call = if collective.starts_with("send/recv") {
                        format!("tag {seq}")
                    } else {
                        format!("#{seq}")
                    };
                    format!("rank {r}: in {collective} {call} (this rank, timed out waiting for rank {peer})")
                }
                Some(text) => format!("rank {r}: {text}"),
                None => format!(
                    "rank {r}: no answer within {} ms (unreachable, or in no ferrocoll call: computing, stopped, or stuck elsewhere)",
                    DESYNC_WAIT.as_millis()
                ),
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Plans and runs one collective on `mem`, which holds the lengths the
    /// spec implies, laid out as `Layout::in_place` says when in place.
    pub(super) fn run(&self, spec: Spec, mut mem: Memory<'_>) -> Result<()> {
        if let Some(small) = self.small_path(spec.coll, spec.count, spec.dtype) {
            return self.run_fast(small, &spec, &mut mem);
        }
        // The number first: a call whose choice or plan fails still takes
        // its place, as it does on every other rank.
        let seq = self.next_seq();
        let planned = self.plan_call(&spec)?;
        self.run_planned(&spec, &planned, seq, &mut mem)
    }

    /// Resolves once what [`Communicator::run`] resolves per call: the
    /// small-call fast path when the call qualifies (decided from the call's
    /// shape, the group and the configuration only, so it stays right for
    /// every later run), else the algorithm and its checked plans. Takes no
    /// sequence number.
    pub(super) fn prepare(&self, spec: Spec) -> Result<Prepared> {
        let planned = match self.small_path(spec.coll, spec.count, spec.dtype) {
            Some(_) => None,
            None => Some(self.plan_call(&spec)?),
        };
        Ok(Prepared { spec, planned })
    }

    /// Runs a call [`Communicator::prepare`]d on this communicator, on
    /// `mem` laid out as for [`Communicator::run`]; takes the next sequence
    /// number (or the reserved one) as every call does.
    pub(super) fn run_prepared(&self, call: &Prepared, mem: &mut Memory<'_>) -> Result<()> {
        match &call.planned {
            None => {
                let small = self.shared.transport.small_collectives().ok_or_else(|| {
                    Error::Internal("the small-collective path is gone from the transport".into())
                })?;
                self.run_fast(small, &call.spec, mem)
            }
            Some(planned) => {
                let seq = self.next_seq();
                self.run_planned(&call.spec, planned, seq, mem)
            }
        }
    }

    /// Chooses the algorithm of a call that does not take the fast path and
    /// builds (and in debug builds checks) the plan of every slice length.
    fn plan_call(&self, spec: &Spec) -> Result<Planned> {
        let elem = spec.dtype.size();
        // Every rank must choose alike, so the choice looks only at what every
        // rank agrees on (not, say, the root's larger gather buffer).
        let bytes = self.call_bytes(spec.coll, spec.count, spec.dtype);
        let (algo, why) = self.choose(spec.coll, bytes)?;
        let req = PlanRequest {
            collective: spec.coll,
            n: self.size(),
            rank: self.rank(),
            count: spec.count,
            root: spec.root,
            elem_size: elem,
            send_counts: spec.send_counts.clone(),
            recv_counts: spec.recv_counts.clone(),
            topology: self.shared.topology.clone(),
        };
        let layout = if spec.in_place {
            Layout::in_place(&req).expect("in-place form exists")
        } else {
            Layout::OUT_OF_PLACE
        };
        // Elementwise collectives of many bytes run as consecutive slices,
        // each a whole collective on a cache-sized piece (see
        // `exec::slices`); everything else runs as one plan. Slices have at
        // most two lengths, so at most two plans are built.
        let slices = exec::slices(spec.coll, spec.count, elem, self.shared.config.slice_bytes);
        let mut plans: [Option<(usize, Plan)>; 2] = [None, None];
        for &(_, len) in &slices {
            if plans.iter().flatten().any(|(l, _)| *l == len) {
                continue;
            }
            let Some(free) = plans.iter_mut().find(|p| p.is_none()) else {
                return Err(Error::Internal(format!(
                    "{} of {} elements cut into slices of more than two lengths",
                    spec.coll, spec.count
                )));
            };
            let req = PlanRequest {
                count: len,
                ..req.clone()
            };
            let plan = plan::build(algo, &req)?;
            if cfg!(debug_assertions) {
                plan::validate(&plan, &req, layout)
                    .map_err(|e| Error::Internal(format!("{algo} plan for {}: {e}", spec.coll)))?;
            }
            *free = Some((len, plan));
        }
        Ok(Planned {
            algo,
            why,
            bytes,
            slices,
            plans,
        })
    }

    /// Runs the plans of a planned call under sequence number `seq` and ends
    /// the call on the transport.
    fn run_planned(
        &self,
        spec: &Spec,
        planned: &Planned,
        seq: u64,
        mem: &mut Memory<'_>,
    ) -> Result<()> {
        if self.shared.config.debug && self.rank() == 0 {
            eprintln!(
                "ferrocoll: {} #{seq} {} B on {} ranks -> {} ({})",
                spec.coll,
                planned.bytes,
                self.size(),
                planned.algo,
                planned.why
            );
            if self.shared.config.debug_tune {
                self.chooser()
                    .explain(spec.coll, spec.count, spec.dtype, planned.bytes);
            }
        }
        let elem = spec.dtype.size();
        let sig = spec.signature();
        let op = spec.op.unwrap_or(ReduceOp::Sum);
        for &(offset, len) in &planned.slices {
            let plan = planned
                .plans
                .iter()
                .flatten()
                .find_map(|(l, p)| (*l == len).then_some(p))
                .expect("a plan for every slice length");
            if len == spec.count {
                // One slice: the whole call, whatever its buffers' shapes.
                self.execute(plan, mem, &sig, seq, op)?;
            } else {
                let mut piece = mem.slice(offset * elem, len * elem);
                self.execute(plan, &mut piece, &sig, seq, op)?;
            }
        }
        let header = Header {
            comm: self.shared.id,
            seq,
            sig,
        };
        self.shared
            .transport
            .end_call(&header)
            .map_err(|e| self.group_error(e))
    }

    /// Runs a plan under a header.
    pub(super) fn execute(
        &self,
        plan: &Plan,
        mem: &mut Memory<'_>,
        sig: &Signature,
        seq: u64,
        op: ReduceOp,
    ) -> Result<()> {
        let call = Call {
            transport: &*self.shared.transport,
            group: &self.shared.group,
            header: Header {
                comm: self.shared.id,
                seq,
                sig: *sig,
            },
            dtype: sig.dtype,
            op,
            deadline: self.deadline(),
            sent: &self.shared.sent,
        };
        // Reuse the communicator's scratch memory; a call running alongside
        // (non-blocking) finds it taken and uses a fresh buffer.
        let mut scratch = self
            .shared
            .scratch
            .try_lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        let result = exec::execute(plan, mem, &call, &mut scratch);
        if let Ok(mut slot) = self.shared.scratch.try_lock() {
            if slot.len() < scratch.len() {
                *slot = scratch;
            }
        }
        result.map_err(|e| self.group_error(e))
    }
}

impl Communicator {
    /// Receives one message of `sig` under tag key `seq` into `buf` from
    /// whichever rank of this group sends first; returns that group rank.
    pub(super) fn recv_any_bytes(
        &self,
        sig: &Signature,
        seq: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let header = Header {
            comm: self.shared.id,
            seq,
            sig: *sig,
        };
        let mut sink = IntoBytes(buf);
        let len = sink.0.len();
        let world = self
            .shared
            .transport
            .recv_any(&header, len, &mut sink, self.deadline())
            .map_err(|e| self.group_error(e))?;
        self.shared
            .group
            .iter()
            .position(|&w| w == world)
            .ok_or_else(|| {
                Error::Internal(format!(
                    "recv_any: transport rank {world} sent under this group's key but is not in it"
                ))
            })
    }
}

/// A sink that copies one message into a byte buffer.
struct IntoBytes<'a>(&'a mut [u8]);

impl crate::transport::Sink for IntoBytes<'_> {
    fn deliver(&mut self, _index: usize, offset: usize, chunk: &[u8]) {
        self.0[offset..offset + chunk.len()].copy_from_slice(chunk);
    }

    fn destination(&mut self, _index: usize, offset: usize, len: usize) -> Option<&mut [u8]> {
        Some(&mut self.0[offset..offset + len])
    }
}

/// A plan of one op in one round (send and recv).
pub(super) fn single_op_plan(op: Op) -> Plan {
    Plan {
        rounds: vec![Round { ops: vec![op] }],
        scratch: 0,
    }
}
