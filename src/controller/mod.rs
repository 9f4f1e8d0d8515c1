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
//! - `context`: which app this thread's log lines are about (set by the runner).
//! - `runner`: the one loop that keeps 1..N apps at their targets (`run` is the runner
//!   with one app; `apps` the same runner fed by an apps file or by discovery).

pub(crate) mod app;
pub(crate) mod context;
pub(crate) mod deletes;
pub(crate) mod events;
pub(crate) mod leader;
pub(crate) mod metrics;
pub(crate) mod points;
pub(crate) mod refusals;
pub(crate) mod runner;
pub(crate) mod serve;
pub mod tick;
