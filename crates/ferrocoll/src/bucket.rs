//! Gradient bucketing and fusion on the non-blocking calls, as DDP and
//! Horovod do it, and the FSDP/ZeRO pattern of prefetched layer gathers.
//!
//! [`GradientBucketer`]: told the parameter sizes in registration order, it
//! groups them into buckets of about `cap` bytes in *reverse* order (the
//! order autograd produces gradients: last layer first), the first bucket
//! smaller (1 MiB by default, as DDP: the first gradients arrive before the
//! rest of backward has anything to hide behind). [`GradientBucketer::ready`]
//! copies a gradient into its bucket's buffer; a bucket whose gradients are
//! all in is launched as one non-blocking allreduce ([`ReduceOp::Avg`]),
//! so many small tensors travel as one message (Horovod's fusion buffer).
//! [`GradientBucketer::finish`] waits for all of them and writes the
//! averaged gradients back.
//!
//! Buckets are launched in bucket order, whatever order they fill in: a
//! bucket that is full before an earlier one waits for it. Every rank thus
//! issues the same allreduces in the same order (what collectives require),
//! even when autograd hands gradients over in a different order on some
//! rank. Because the bucket boundaries are fixed up front, no fusion timer
//! is needed: Horovod's cycle time exists because it fuses whatever tensors
//! happen to be ready, which ranks must first agree on; here a straggling
//! gradient delays only the buckets from its own on, and nothing waits for
//! a timer.
//!
//! [`BucketCap::Auto`] picks the cap from the communicator's cost model:
//! large enough that a bucket's latency is amortised (32 times n* = α·β of
//! the slowest link class, so α is ~3% of its time; within 1-25 MiB), but
//! no more than an eighth of all gradient bytes (at least 1 MiB), so that
//! the last bucket, which nothing hides, is short.
//!
//! [`ShardedLayers`]: ZeRO-3 / FSDP's pattern. Each rank keeps a shard of
//! every layer's parameters; [`ShardedLayers::gather`] returns layer `l`'s
//! full parameters and starts the non-blocking all_gather of layer `l+1`
//! (prefetch) so that it travels while layer `l` computes;
//! [`ShardedLayers::reduce_gradient`] starts a non-blocking reduce_scatter
//! of a layer's full gradient during backward, and
//! [`ShardedLayers::finish_backward`] returns this rank's gradient shards.

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::request::Request;
use crate::types::ReduceOp;
use crate::Communicator;

/// DDP's default bucket size.
pub const DEFAULT_CAP_BYTES: usize = 25 << 20;
/// DDP's first bucket.
pub const DEFAULT_FIRST_CAP_BYTES: usize = 1 << 20;

/// How large the buckets of a [`GradientBucketer`] are.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BucketCap {
    /// At most this many bytes per bucket (a single larger gradient gets a
    /// bucket of its own); the first bucket at most `first` bytes.
    Bytes {
        /// Bytes of every bucket but the first.
        cap: usize,
        /// Bytes of the first bucket (the last gradients of the model).
        first: usize,
    },
    /// From the cost model (see the module documentation).
    Auto,
}

impl Default for BucketCap {
    fn default() -> Self {
        BucketCap::Bytes {
            cap: DEFAULT_CAP_BYTES,
            first: DEFAULT_FIRST_CAP_BYTES,
        }
    }
}

/// One bucket: which parameters it holds (in bucket order) and where.
#[derive(Clone, Debug, PartialEq)]
pub struct BucketLayout {
    /// Parameter indices (registration order numbers).
    pub params: Vec<usize>,
    /// Element offset of each parameter in the bucket's buffer.
    pub offsets: Vec<usize>,
    /// Elements in the bucket.
    pub len: usize,
}

/// The buckets for parameters of `sizes` elements (registration order) of
/// `elem` bytes each: reverse order, closed when adding the next parameter
/// would pass the cap (the first bucket's cap for bucket 0).
pub fn layout(sizes: &[usize], elem: usize, cap: usize, first: usize) -> Vec<BucketLayout> {
    let mut buckets: Vec<BucketLayout> = Vec::new();
    let mut current = BucketLayout {
        params: Vec::new(),
        offsets: Vec::new(),
        len: 0,
    };
    for i in (0..sizes.len()).rev() {
        let limit = if buckets.is_empty() { first } else { cap };
        let bytes = (current.len + sizes[i]) * elem;
        if !current.params.is_empty() && bytes > limit {
            buckets.push(std::mem::replace(
                &mut current,
                BucketLayout {
                    params: Vec::new(),
                    offsets: Vec::new(),
                    len: 0,
                },
            ));
        }
        current.params.push(i);
        current.offsets.push(current.len);
        current.len += sizes[i];
    }
    if !current.params.is_empty() {
        buckets.push(current);
    }
    buckets
}

/// The cap [`BucketCap::Auto`] picks for `total` gradient bytes on a
/// communicator of `n` ranks with cost-model `profile`: `(cap, first)`.
pub fn auto_cap(profile: &crate::cost::Profile, n: usize, total: usize) -> (usize, usize) {
    let slow = if profile.inter.beta < profile.intra.beta && n > 1 {
        &profile.inter
    } else {
        &profile.intra
    };
    let n_star = slow.alpha * slow.beta;
    let amortised = ((32.0 * n_star) as usize).clamp(1 << 20, DEFAULT_CAP_BYTES);
    // At least 8 buckets, so that the last one (nothing hides it) is at
    // most an eighth of the communication.
    let cap = amortised.min((total / 8).max(1 << 20));
    (cap, cap.min(DEFAULT_FIRST_CAP_BYTES))
}

/// Where a bucket is: filling (how many of its gradients are in), in
/// flight, or done (its averaged buffer kept until `finish`).
enum State {
    Filling { buffer: Vec<f32>, missing: usize },
    Full { buffer: Vec<f32> },
    InFlight,
    Done { buffer: Vec<f32> },
}

/// Gradient bucketing and fusion over one communicator (see the module
/// documentation). One step: [`GradientBucketer::ready`] for every
/// parameter, then [`GradientBucketer::finish`]; then the next step.
pub struct GradientBucketer<'c> {
    comm: &'c Communicator,
    sizes: Vec<usize>,
    buckets: Vec<BucketLayout>,
    /// Parameter -> (bucket, position in it).
    place: Vec<(usize, usize)>,
    states: Vec<State>,
    /// Whether each parameter's gradient is in this step.
    arrived: Vec<bool>,
    /// Buckets launched so far this step (they go in bucket order).
    launched: usize,
    in_flight: VecDeque<(usize, Request<Vec<f32>>)>,
    /// The caps in use: (every bucket but the first, the first), bytes.
    caps: (usize, usize),
}

impl<'c> GradientBucketer<'c> {
    /// A bucketer for parameters of `sizes` f32 elements, in registration
    /// order (the model's forward order), buckets as `cap` says.
    pub fn new(comm: &'c Communicator, sizes: &[usize], cap: BucketCap) -> GradientBucketer<'c> {
        let total: usize = sizes.iter().sum::<usize>() * 4;
        let (cap, first) = match cap {
            BucketCap::Bytes { cap, first } => (cap.max(1), first.max(1)),
            BucketCap::Auto => auto_cap(&comm.profile(), comm.size(), total),
        };
        let buckets = layout(sizes, 4, cap, first);
        let mut place = vec![(0, 0); sizes.len()];
        for (b, bucket) in buckets.iter().enumerate() {
            for (k, &p) in bucket.params.iter().enumerate() {
                place[p] = (b, k);
            }
        }
        let mut bucketer = GradientBucketer {
            comm,
            sizes: sizes.to_vec(),
            states: Vec::new(),
            buckets,
            place,
            arrived: vec![false; sizes.len()],
            launched: 0,
            in_flight: VecDeque::new(),
            caps: (cap, first),
        };
        bucketer.reset();
        bucketer
    }

    /// The bucket caps in bytes, as given or as [`BucketCap::Auto`] chose
    /// them: (every bucket but the first, the first).
    pub fn caps(&self) -> (usize, usize) {
        self.caps
    }

    /// The buckets, in the order they are launched.
    pub fn buckets(&self) -> &[BucketLayout] {
        &self.buckets
    }

    fn reset(&mut self) {
        self.states = self
            .buckets
            .iter()
            .map(|b| State::Filling {
                buffer: vec![0.0; b.len],
                missing: b.params.len(),
            })
            .collect();
        self.arrived.iter_mut().for_each(|a| *a = false);
        self.launched = 0;
    }

    /// Parameter `i`'s gradient is ready: copied into its bucket, and every
    /// bucket that is full and next in line is launched.
    pub fn ready(&mut self, i: usize, grad: &[f32]) -> Result<()> {
        let Some(&size) = self.sizes.get(i) else {
            return Err(Error::invalid(format!(
                "GradientBucketer::ready({i}): there are {} parameters",
                self.sizes.len()
            )));
        };
        if grad.len() != size {
            return Err(Error::invalid(format!(
                "GradientBucketer::ready({i}): the gradient has {} elements, the parameter {size}",
                grad.len()
            )));
        }
        if std::mem::replace(&mut self.arrived[i], true) {
            return Err(Error::invalid(format!(
                "GradientBucketer::ready({i}) twice in one step; call finish() between steps"
            )));
        }
        let (b, k) = self.place[i];
        let offset = self.buckets[b].offsets[k];
        if let State::Filling { buffer, missing } = &mut self.states[b] {
            buffer[offset..offset + size].copy_from_slice(grad);
            *missing -= 1;
            if *missing == 0 {
                let buffer = std::mem::take(buffer);
                self.states[b] = State::Full { buffer };
            }
        }
        self.launch_ready();
        Ok(())
    }

    /// Launches, in bucket order, every full bucket whose predecessors are
    /// launched; collects the ones already done without waiting.
    fn launch_ready(&mut self) {
        while self.launched < self.buckets.len() {
            let b = self.launched;
            match std::mem::replace(&mut self.states[b], State::InFlight) {
                State::Full { buffer } => {
                    let request = self.comm.iall_reduce(buffer, ReduceOp::Avg);
                    self.in_flight.push_back((b, request));
                    self.launched += 1;
                }
                other => {
                    self.states[b] = other;
                    break;
                }
            }
        }
    }

    /// Waits for every bucket and writes the averaged gradients into
    /// `grads` (indexed by parameter, each of its parameter's size); then
    /// the bucketer is ready for the next step. Every parameter must have
    /// been [`GradientBucketer::ready`] this step.
    pub fn finish(&mut self, grads: &mut [&mut [f32]]) -> Result<()> {
        if let Some(missing) = self.arrived.iter().position(|a| !a) {
            // Collect what is in flight before failing, so nothing is left
            // running against the next step.
            self.drain();
            self.reset();
            return Err(Error::invalid(format!(
                "GradientBucketer::finish: parameter {missing}'s gradient never came (ready() is \
                 needed for every parameter, every step; every rank must call the same)"
            )));
        }
        if grads.len() != self.sizes.len() {
            self.drain();
            self.reset();
            return Err(Error::invalid(format!(
                "GradientBucketer::finish: {} gradients for {} parameters",
                grads.len(),
                self.sizes.len()
            )));
        }
        let mut first_error = None;
        while let Some((b, request)) = self.in_flight.pop_front() {
            match request.wait() {
                Ok(buffer) => self.states[b] = State::Done { buffer },
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            self.reset();
            return Err(e);
        }
        for (b, bucket) in self.buckets.iter().enumerate() {
            let State::Done { buffer } = &self.states[b] else {
                unreachable!("every bucket is launched once all gradients are in");
            };
            for (&p, &offset) in bucket.params.iter().zip(&bucket.offsets) {
                let out = &mut grads[p];
                if out.len() != self.sizes[p] {
                    self.reset();
                    return Err(Error::invalid(format!(
                        "GradientBucketer::finish: gradient {p} has {} elements, the parameter {}",
                        out.len(),
                        self.sizes[p]
                    )));
                }
                out.copy_from_slice(&buffer[offset..offset + self.sizes[p]]);
            }
        }
        self.reset();
        Ok(())
    }

    fn drain(&mut self) {
        while let Some((_, request)) = self.in_flight.pop_front() {
            let _ = request.wait();
        }
    }
}

impl Drop for GradientBucketer<'_> {
    fn drop(&mut self) {
        // Requests own their buffers; waiting keeps the call order of a
        // communicator that outlives the bucketer consistent.
        self.drain();
    }
}

/// FSDP / ZeRO-3 over one communicator: every layer's parameters sharded
/// over the ranks, gathered one layer ahead (see the module documentation).
pub struct ShardedLayers<'c> {
    comm: &'c Communicator,
    /// This rank's shard of each layer (each padded to a multiple of the
    /// group size times the shard).
    shards: Vec<Vec<f32>>,
    /// Each layer's unpadded number of elements.
    sizes: Vec<usize>,
    /// The gather in flight and the layer it is for.
    prefetch: Option<(usize, Request<Vec<f32>>)>,
    /// Reduce-scatters in flight, in layer order of issue.
    reducing: Vec<(usize, Request<Vec<f32>>)>,
}

impl<'c> ShardedLayers<'c> {
    /// Shards `layers` (every rank passes the same full parameters, as
    /// after initialisation from one seed): this rank keeps block `rank` of
    /// each, the layer padded with zeros to a multiple of the group size.
    pub fn new(comm: &'c Communicator, layers: &[Vec<f32>]) -> ShardedLayers<'c> {
        let n = comm.size();
        let shards = layers
            .iter()
            .map(|l| {
                let per = l.len().div_ceil(n);
                let start = (comm.rank() * per).min(l.len());
                let end = (start + per).min(l.len());
                let mut shard = l[start..end].to_vec();
                shard.resize(per, 0.0);
                shard
            })
            .collect();
        ShardedLayers {
            comm,
            shards,
            sizes: layers.iter().map(Vec::len).collect(),
            prefetch: None,
            reducing: Vec::new(),
        }
    }

    /// This rank's shard of every layer.
    pub fn shards(&self) -> &[Vec<f32>] {
        &self.shards
    }

    /// This rank's shard of every layer, to update after an optimizer step.
    pub fn shards_mut(&mut self) -> &mut [Vec<f32>] {
        &mut self.shards
    }

    /// Layer `layer`'s full parameters (waiting for its prefetch, or
    /// gathering it now), with the gather of layer `next` (if any) started
    /// so that it travels while the caller computes with this one. Every
    /// rank must gather the same layers in the same order.
    pub fn gather(&mut self, layer: usize, next: Option<usize>) -> Result<Vec<f32>> {
        let layers = self.shards.len();
        if layer >= layers || next.is_some_and(|n| n >= layers) {
            return Err(Error::invalid(format!(
                "ShardedLayers::gather({layer}, {next:?}): there are {layers} layers"
            )));
        }
        let request = match self.prefetch.take() {
            Some((l, request)) if l == layer => request,
            Some((l, request)) => {
                // A prefetch the caller did not use: finish it (every rank
                // issued it) before gathering what is asked.
                let _ = request.wait();
                let _ = l;
                self.comm.iall_gather(self.shards[layer].clone())
            }
            None => self.comm.iall_gather(self.shards[layer].clone()),
        };
        if let Some(n) = next {
            self.prefetch = Some((n, self.comm.iall_gather(self.shards[n].clone())));
        }
        let mut full = request.wait()?;
        full.truncate(self.sizes[layer]);
        Ok(full)
    }

    /// Starts the reduce-scatter (average) of layer `layer`'s full
    /// gradient: this rank gets its shard's part from
    /// [`ShardedLayers::finish_backward`].
    pub fn reduce_gradient(&mut self, layer: usize, mut grad: Vec<f32>) -> Result<()> {
        let Some(&size) = self.sizes.get(layer) else {
            return Err(Error::invalid(format!(
                "ShardedLayers::reduce_gradient({layer}): there are {} layers",
                self.sizes.len()
            )));
        };
        if grad.len() != size {
            return Err(Error::invalid(format!(
                "ShardedLayers::reduce_gradient({layer}): {} elements, the layer has {size}",
                grad.len()
            )));
        }
        grad.resize(self.shards[layer].len() * self.comm.size(), 0.0);
        self.reducing
            .push((layer, self.comm.ireduce_scatter(grad, ReduceOp::Avg)));
        Ok(())
    }

    /// Waits for every reduce-scatter started since the last call and
    /// returns (layer, this rank's averaged gradient shard) in the order
    /// they were started.
    pub fn finish_backward(&mut self) -> Result<Vec<(usize, Vec<f32>)>> {
        let mut out = Vec::new();
        let mut first_error = None;
        for (layer, request) in self.reducing.drain(..) {
            match request.wait() {
                Ok(shard) => out.push((layer, shard)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

impl Drop for ShardedLayers<'_> {
    fn drop(&mut self) {
        if let Some((_, request)) = self.prefetch.take() {
            let _ = request.wait();
        }
        for (_, request) in self.reducing.drain(..) {
            let _ = request.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_reverse_order_with_a_small_first_bucket() {
        // 4-byte elements: sizes in bytes 400, 400, 4000, 40, 40.
        let b = layout(&[100, 100, 1000, 10, 10], 4, 4400, 100);
        let params: Vec<Vec<usize>> = b.iter().map(|x| x.params.clone()).collect();
        assert_eq!(params, vec![vec![4, 3], vec![2, 1], vec![0]]);
        assert_eq!(b[0].offsets, vec![0, 10]);
        assert_eq!(b[1].len, 1100);
        // A gradient larger than the cap gets a bucket of its own.
        let b = layout(&[10, 5000, 10], 4, 400, 400);
        let params: Vec<Vec<usize>> = b.iter().map(|x| x.params.clone()).collect();
        assert_eq!(params, vec![vec![2], vec![1], vec![0]]);
        assert!(layout(&[], 4, 100, 100).is_empty());
    }

    #[test]
    fn auto_cap_amortises_alpha_and_bounds_the_last_bucket() {
        let p = crate::cost::Profile::uniform(10e-6, 10e9, 0.0); // n* = 100 KB
        let (cap, first) = auto_cap(&p, 4, 400 << 20);
        assert_eq!(cap, 3_200_000, "32 n*, below total/8 = 50 MiB");
        assert_eq!(first, DEFAULT_FIRST_CAP_BYTES);
        let (cap, _) = auto_cap(&p, 4, 16 << 20);
        assert_eq!(cap, 2 << 20, "total/8 = 2 MiB, below 32 n*");
        let slow = crate::cost::Profile::uniform(1e-3, 1e9, 0.0); // n* = 1 MB
        assert_eq!(auto_cap(&slow, 4, 1 << 30).0, DEFAULT_CAP_BYTES);
        assert_eq!(auto_cap(&slow, 4, 1 << 20).0, 1 << 20);
    }
}
