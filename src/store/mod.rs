//! Where the allocator state lives between ticks.
//!
//! - [`file`]: the [`file::StateStore`] trait, the state file (atomic saves, an exclusive
//!   lock per owner, a holder record), and the binding of a state to its cluster, namespace
//!   and app.
//! - `configmap`: the ConfigMap store (`--state-store configmap:NAME`): optimistic
//!   concurrency on `resourceVersion`, the holder record, the steering requests and the
//!   target annotation.
//! - [`executorset`]: the ExecutorSet store (`--state-store executorset:NAME`,
//!   `docs/executorset.md`): the target and removals read from `spec`, the allocator state
//!   and what the tick saw written to `status`, and the steering commands' spec writes.
//! - `liveness`: a holder record written once, whose holder is asked whether it lives
//!   (ping/pong) by the process that finds it, instead of a heartbeat.
//! - [`queue`]: the file store's steering queue (a directory of request files).

pub(crate) mod configmap;
pub mod executorset;
pub mod file;
pub(crate) mod liveness;
pub mod queue;
