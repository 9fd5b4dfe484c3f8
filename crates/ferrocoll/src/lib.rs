//! ferrocoll: collective communication for Rust.
//!
//! The primitives of MPI, NCCL and Gloo (allreduce, broadcast, reduce,
//! allgather, reduce-scatter, all-to-all(v), gather, scatter, barrier,
//! send/recv, split) over ranks that are threads, processes or hosts.
//!
//! The design in one sentence: **algorithms are data**. An algorithm
//! ([`plan`]) is a pure function returning a [`plan::Plan`], the ordered
//! rounds of sends, receives and reductions one rank performs; one executor
//! runs any plan over any [`transport::Transport`]; the simulator and the cost
//! model read the same plans.
//!
//! ```
//! use ferrocoll::{local, ReduceOp};
//!
//! // Four ranks as threads of this process.
//! let results = local::run(4, |comm| {
//!     let mine = vec![comm.rank() as f64 + 1.0; 1000];
//!     let mut total = vec![0.0; 1000];
//!     comm.all_reduce(&mine, &mut total, ReduceOp::Sum)?;
//!     Ok::<_, ferrocoll::Error>(total[0])
//! })
//! .unwrap();
//! assert!(results.iter().all(|r| *r.as_ref().unwrap() == 10.0));
//! ```
//!
//! Errors are values of [`Error`], with messages that say what to fix; no
//! user mistake panics. Non-blocking forms (`iall_reduce`, ...) take owned
//! buffers, run on the communicator's progress worker (one thread per
//! communicator, not one per call) and return the buffers from
//! [`Request::wait`] ([`Request::test`], [`Request::wait_all`] and
//! [`Request::wait_any`] too). Persistent collectives
//! ([`Communicator::all_reduce_init`], ...) are planned once and run many
//! times ([`Persistent`]).

#![warn(missing_docs)]
#![warn(unreachable_pub)]

// What users need is re-exported at the root (below); the public modules
// are for those who go further (custom transports, the cost model, plans
// for the simulator). Internals the other crates of the workspace reach
// into are public but hidden from the documentation.
pub mod bucket;
mod comm;
pub mod compress;
pub mod config;
pub mod cost;
mod env;
mod error;
mod exec;
#[doc(hidden)]
pub mod kernels;
pub mod launch;
pub mod local;
pub mod moe;
pub mod plan;
mod request;
#[doc(hidden)]
pub mod select;
pub mod shared;
pub mod topo;
pub mod transport;
pub mod tune;
mod types;

/// Entry points for the fuzz targets in `fuzz/` (not a stable API).
#[doc(hidden)]
pub mod fuzzing {
    /// Decodes `bytes` as a frame header; a decoded header must encode back
    /// to what decodes the same. Never panics on any input.
    pub fn wire_header(bytes: &[u8]) {
        if let Ok(frame) = crate::transport::wire::Frame::decode(bytes) {
            let again = crate::transport::wire::Frame::decode(&frame.encode());
            assert_eq!(again, Ok(frame), "a decoded header must round-trip");
        }
    }

    /// Feeds `bytes` to the rendezvous store as one client's stream.
    pub fn store_connection(bytes: &[u8]) {
        crate::store::fuzz_connection(bytes);
    }
}

pub use comm::{CallOptions, Communicator, Persistent, Started};
pub use config::Config;
pub use error::{Error, Result};
pub use launch::init::{init, init_with_rendezvous, TransportKind};
pub use launch::rendezvous::Rendezvous;
/// The rendezvous store under its former path (internal: `ferrocoll store`
/// serves it; users meet through [`init()`] or [`Rendezvous`]).
#[doc(hidden)]
pub use launch::store;
pub use launch::world::WorldSpec;
pub use launch::Placement;
/// The launch layer's modules under their former paths (`ferrocoll::init::...`,
/// `ferrocoll::world::...`, `ferrocoll::rendezvous::...`).
pub use launch::{init, rendezvous, world};
pub use plan::{Algorithm, Collective};
pub use request::Request;
pub use shared::SharedBuffer;
pub use topo::Topology;
pub use types::{DType, Element, ReduceOp};

/// Re-export of the 16-bit float types ferrocoll reduces.
pub use half::{bf16, f16};

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
