//! Plans: what one rank does in a collective, as data.
//!
//! An algorithm is a pure function from a [`PlanRequest`] (collective, group
//! size, this rank, counts, root, ...) to a [`Plan`]: an ordered list of
//! [`Round`]s, each a set of [`Op`]s over three buffers ([`Buf::Input`],
//! [`Buf::Output`], [`Buf::Scratch`]). Plans never touch a socket, a thread or
//! a clock; the executor (`exec.rs`) runs them over any transport and the
//! simulator runs the plans of all ranks against a network model.
//!
//! # Round semantics
//!
//! Within a round, the local ops ([`Op::Copy`], [`Op::Reduce`]) listed before
//! its messages run first, in order; then every send and receive of the round
//! is in flight at once (so a ring step sends and receives concurrently, and a
//! direct all-to-all posts all its messages together). Local ops listed after
//! the messages are *overlapped*: they run, in order, while the messages are
//! in flight (a broadcast root's copy of its input into its output while a
//! peer reads the input), so they may touch nothing the round's messages
//! read or write. The round ends when all of them are done. Messages
//! between one pair of ranks in one collective are matched in plan order
//! (FIFO), so a rank may exchange several messages with the same peer.
//!
//! A valid plan (see [`validate`]) never lets a round write a span that the
//! same round reads elsewhere or writes twice; the one exception is
//! [`Op::RecvReduce`] whose `local` is exactly its `dst` (accumulate in place).
//!
//! Spans count **elements**, not bytes; the executor scales by the element
//! size. Only the pipelined algorithms look at the element size, to choose
//! segment lengths in bytes.
//!
//! # Why rounds
//!
//! The seeds' algorithms (ring, two-port ring, trees, double binary tree,
//! butterfly, halving-doubling with its non-power-of-two pre/post step, mesh,
//! pairwise, Bruck, hierarchical, torus) are all described as a sequence of
//! steps in which each rank sends to and receives from a few peers. A round is
//! exactly such a step: the cost model charges alpha + bytes/beta per round on
//! each rank's ports, and the simulator replays rounds message by message.
//!
//! # Layout
//!
//! * `catalog.rs`: [`Collective`] and [`Algorithm`], their names, and which
//!   collective has which algorithms.
//! * `ops.rs`: the plan as data: [`Buf`], [`Span`], [`Op`], [`Round`],
//!   [`Plan`].
//! * `request.rs`: [`PlanRequest`].
//! * `registry.rs`: [`build`] (algorithm to plan function) and
//!   [`unknown_algorithm`].
//! * `builder.rs`: the helpers algorithms are written with (the plan and
//!   round builders, [`block`], offsets of packed blocks).
//! * `check.rs`, `pairing.rs`: validation and the message table.
//! * One file per algorithm family: `ring.rs`, `tree.rs`, `dbtree.rs`,
//!   `butterfly.rs`, `halving_doubling.rs`, `direct.rs`, `bruck.rs`,
//!   `pairwise.rs`, `hier.rs`, `torus.rs`, `composite.rs`, `barrier.rs`.

mod barrier;
mod bruck;
mod builder;
mod butterfly;
mod catalog;
mod check;
mod composite;
mod dbtree;
mod direct;
mod halving_doubling;
mod hier;
mod ops;
pub mod pairing;
mod pairwise;
mod registry;
mod request;
mod ring;
mod torus;
mod tree;

pub use builder::block;
pub(crate) use builder::{offsets, root_copy_overlapped, single_rank, PlanBuilder, RoundBuilder};
pub use catalog::{Algorithm, Collective};
pub use check::{inter_node_elements, match_messages, validate, Layout, MessageStats};
pub(crate) use dbtree::segments as dbtree_segments;
pub use ops::{Buf, Op, Plan, Round, Span};
pub use registry::{build, unknown_algorithm};
pub use request::PlanRequest;
pub(crate) use ring::chain_segments;

pub use crate::topo::Topology;
