//! The pure engine: value in, value out. Nothing here does I/O, reads a clock, logs or starts
//! a thread (`purity` below checks the folder's text for those names): time comes in as
//! `now_ms`, pods as parsed values, and what to do goes out as a [`alloc::Plan`].
//!
//! - [`snapshot`]: a PodList (JSON, whole or streamed page by page) → executor id → state.
//! - [`alloc`]: the allocation step, `record`, the persisted state's schema.
//! - [`podspec`]: a checked pod template + executor id → the Pod to create; the DNS-1123
//!   name checks.
//! - [`counts`]: the target and batch-size parsers and their limits.
//! - `driver`: what a discovered driver pod's annotations ask for (`apps --discover`).

pub mod alloc;
pub mod counts;
pub(crate) mod driver;
pub mod podspec;
pub mod snapshot;

#[cfg(test)]
mod purity;
