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
//! - [`snapshot`]: PodList JSON → executor id → state (pure).
//! - [`alloc`]: the allocation step (pure, deterministic; the only place policy lives).
//! - [`podspec`]: template + executor id → the Pod to create (pure).
//! - `template`: reads `--template`/`--image` into a checked pod template.
//! - [`kube`]: the blocking HTTPS client and its configuration.
//! - [`state`]: the persisted allocator state: atomic saves, an exclusive lock per tick.
//! - [`reconcile`]: the tick.
//! - `multi`: many apps in one process (`podalloc apps`): apps file, driver annotations,
//!   one executor list per namespace split by app.
//! - [`sim`]: the simulated API server and kubelet (the `podalloc-sim` crate; feature `sim`).
#![warn(missing_docs)]
// Items not part of the library's API are `pub(crate)`: the public modules are the ones the
// binary, the integration tests and users of the core need.
#![warn(unreachable_pub)]

pub mod alloc;
pub mod cli;
pub(crate) mod cmstore;
pub mod commands;
pub mod config_file;
pub mod error;
pub(crate) mod events;
pub mod kube;
pub(crate) mod leader;
pub(crate) mod metrics;
pub(crate) mod multi;
pub mod podspec;
pub mod reconcile;
#[cfg(feature = "sim")]
pub use podalloc_sim as sim;
pub mod snapshot;
pub mod state;
pub mod steer;
pub(crate) mod template;
