//! The shell that acts and decides nothing the engine decides.
//!
//! - [`tick`]: one reconcile: list → snapshot → step → write-ahead save → calls → `record`
//!   → save, and the Events and log lines of it.
//! - `app`: the application a tick works for ([`tick::App`]).
//! - `points`: the crash and pause points the test harnesses set by environment.
//! - `deletes`: the plan's deletes as calls (one `deletecollection` for many pods).
//! - `refusals`: each refusal of the API server named for what it is (template, admission,
//!   quota, RBAC) with its hint and exit code.
//! - `leader`: leader election over a Lease (client-go's rules; the pure elector and its
//!   thread), and the write fence it installs on a client.
//! - `events`: Kubernetes Events for what a tick did.
//! - `metrics`: the Prometheus text (the `--metrics-file` textfile and `/metrics`).
//! - `serve`: the opt-in `/metrics`, `/healthz` and `/readyz` endpoints.
//! - `context`: which app a log line is about ([`context::LogContext`], set by the command
//!   and the runner, read by the logger).
//! - `services`: what the shell keeps for the whole process ([`services::Services`]).
//! - `runner`: the one loop that keeps 1..N apps at their targets (`run` is the runner
//!   with one app; `apps` the same runner fed by an apps file or by discovery).

/// The log target of leader election's lines (its module path), which the logger never
/// collapses: every change of leadership is shown.
pub const LEADER_LOG_TARGET: &str = "podalloc::controller::leader";

pub(crate) mod app;
pub mod context;
pub(crate) mod deletes;
pub(crate) mod events;
pub(crate) mod leader;
pub(crate) mod metrics;
pub(crate) mod points;
pub(crate) mod refusals;
pub(crate) mod runner;
pub(crate) mod serve;
pub mod services;
pub mod tick;
