//! podalloc: keeps an application's executor pods on Kubernetes at a target count.
//!
//! The allocator Apache Spark runs inside its driver (`ExecutorPodsAllocator`), made into a
//! small synchronous command-line reconciler. A pure core inside a thin shell:
//!
//! ```text
//! PodList ──► snapshot ──► allocation step ──► Plan ──► apply ──► results ──► state
//! (HTTP GET)  (pure)       (pure: no I/O,       create/  (HTTP     (which calls  (saved
//!                           no clock)           delete   POST/     succeeded)    atomically)
//!                                                         DELETE)
//! ```
//!
//! The folders are the layers, each importing only from the layers below it
//! (`commands → cli → controller → store → engine | kube → wire`; `engine` and `kube` side by
//! side, neither importing the other; `src/layers.rs` is the test that keeps it so):
//! - [`engine`]: **pure** (no I/O, clock, log or thread; a unit test checks the folder):
//!   the snapshot (a PodList, JSON or Protobuf → executor id → state), the allocation step
//!   and `record` (the only place policy lives), the pod spec.
//! - [`kube`]: the blocking HTTPS client and its configuration; imports nothing else of
//!   podalloc but `wire` (the Protobuf wire format, which the engine reads too).
//! - [`store`]: where the allocator state lives: the file store (atomic saves, an exclusive
//!   lock), the ConfigMap store (optimistic concurrency, holder record), the file store's
//!   steering queue.
//! - [`controller`]: the shell that acts and decides nothing the engine decides: the tick,
//!   the runner (one loop over 1..N apps: `run` and `apps`), leader election's thread,
//!   Events, metrics, the `/metrics` and probe endpoints.
//! - [`cli`]: the command line's definitions and the files it reads (config file, pod
//!   template).
//! - [`commands`]: one thin file per command.
//! - [`sim`]: the simulated API server and kubelet (the `podalloc-sim` crate; feature `sim`).
//!
//! The library's face keeps the paths its users name: [`alloc`], [`snapshot`], [`podspec`]
//! (in [`engine`]), [`state`] (the store's file half) and [`reconcile`] (the tick).
#![warn(missing_docs)]
// Items not part of the library's API are `pub(crate)`: the public modules are the ones the
// binary, the integration tests and users of the core need.
#![warn(unreachable_pub)]

pub mod cli;
pub mod clock;
pub mod commands;
pub mod controller;
pub mod engine;
pub mod error;
pub mod kube;
#[cfg(test)]
mod layers;
pub mod store;
pub(crate) mod sync;
pub(crate) mod wire;
#[cfg(feature = "sim")]
pub use podalloc_sim as sim;

pub use cli::config_file;
pub use controller::tick as reconcile;
pub use engine::{alloc, podspec, snapshot};
pub use store::file as state;
pub use store::queue as steer;
