//! The launch layer: how the processes of a job find each other and become
//! one communicator.
//!
//! - [`world`]: which rank this process is, from the launcher's variables
//!   (`ferrocoll run`, torchrun, Open MPI, Slurm, PMI);
//! - [`store`]: ferrocoll's rendezvous key-value store (protocol, server on
//!   rank 0, client);
//! - [`rendezvous`]: the store as a trait, so a framework's own store
//!   (torch.distributed's) serves instead;
//! - [`init`](mod@init): the start-up itself, from hosts and links to the
//!   communicator ([`init::init`], [`init::init_with_rendezvous`]);
//! - [`placement`]: where the ranks ended up;
//! - `waits`: the start-up's waits on the store, and the errors that name
//!   the ranks that never arrived.
//!
//! The transports know nothing of this layer: init learns addresses and
//! segment names through the store and hands the transports what they need.

pub mod init;
mod node;
pub mod placement;
pub mod rendezvous;
mod settings;
pub mod store;
mod waits;
pub mod world;

pub use placement::Placement;
