//! The allocation step: `(Snapshot, AllocatorState, Settings, Request, now_ms) → Plan`, and its
//! feedback half, `record(Plan, Outcomes, Settings, now_ms) → AllocatorState`.
//!
//! This module is fully deterministic: it has no networking code, reads no clock, touches no
//! file, logs nothing and draws no random number. Callers hand it a snapshot of the cluster and
//! the time, and take back plain data — the pods to create and to delete, the state to persist
//! and when the next tick is due — in the style of sans-IO protocol cores such as
//! `quinn-proto`. After making the calls, the shell reports what happened ([`Outcomes`]) and
//! [`record`] folds it into the next state. These two functions are the only place allocation
//! policy lives.
//!
//! The default policy is Spark 3.0's `ExecutorPodsAllocator` (`docs/semantics.md` states each
//! rule with its Spark source). [`step`] runs the rules in this order, one method each
//! (`rules.rs`):
//! 1. **begin** — the target after the request's [`TargetChange`] (keep, set or add); the id
//!    counter at max(persisted counter, highest id in the cluster), so ids survive a lost state
//!    file and are never reused.
//! 2. **acknowledge_seen** — unacknowledged ids (created by us, not yet seen) that appear in the
//!    snapshot, in any state, stop being unacknowledged.
//! 3. **forget_vanished** — an unacknowledged id whose create the API server answered
//!    ([`AllocatorState::answered`]) and which this later list does not show was deleted
//!    before any list saw it: forgotten at once (no delete), so replaced in this step under a
//!    new id, instead of waited out until the creation timeout as Spark does; its id is kept
//!    with the requests deleted unseen (a late copy is deleted) and never reused.
//! 4. **time_out_unseen** — unacknowledged ids older than the creation timeout (default
//!    max(5 × batch delay, 60 s), strictly older) are deleted — they may exist unseen — and
//!    forgotten, so they get replaced.
//! 5. **remove_requested** — explicit removal (`podalloc remove ID…`, Spark's `killExecutors`)
//!    deletes the named executors whatever their state and lowers the target of each one's
//!    profile by the number of them that count (running, pending, unknown or
//!    unacknowledged), unless the request's target of that profile is
//!    [`TargetChange::Absolute`] (it already accounts for them). With `--evict`
//!    ([`Policies::evict`]) a running executor goes through the Eviction API, so its
//!    PodDisruptionBudget applies. A removal is kept until its pod is deleted or evicted
//!    ([`AllocatorState::removing`]): one the budget puts off ([`Outcomes::not_now`]) or
//!    whose call fails (5xx after the retries, 403, …) is asked again each step without
//!    lowering the target again, and a request naming it again is not a second removal.
//! 6. **census** — the snapshot's executors sorted into running and pending (removed ones no
//!    longer count); failed and succeeded executors do not count and their pods are deleted
//!    (unless [`Settings::delete_terminated`] is off), so they get replaced.
//!    A Failed pod that Kubernetes ended (`DisruptionTarget=True`, KEP-3329: preemption,
//!    eviction, node shutdown) is deleted and replaced as `disrupted`, never a failure.
//! 7. **delete_lost** — a pod in phase Unknown counts toward the target (as ReplicaSet's
//!    `IsPodActive`) until Unknown longer than `--unknown-timeout` (5 min): then it is lost,
//!    deleted once (reason `lost`) and replaced.
//! 8. **delete_stuck** (opt-in `--startup-grace`) — pods waiting in ErrImagePull,
//!    CrashLoopBackOff, … longer than the grace are failures, deleted once.
//! 9. **crash_loop_guard** (opt-in `--max-failures`, `guard.rs`) — too many failures in the
//!    window halt creation ([`Plan::halt`]).
//! 10. **delete_excess** — known = running + pending + unacknowledged. If known > target, the
//!     excess is deleted: unacknowledged first (newest first), then pending (unscheduled first,
//!     lower pod-deletion-cost first, then newest). Running executors are never deleted for
//!     excess (unless `--scale-down-running`, then through the Eviction API under
//!     `--evict`), and a pending pod is deleted only if it is still pending when the call is
//!     made ([`Delete::if_pending`]).
//! 11. **retry_ambiguous** — a create whose outcome is unknown (5xx, lost connection,
//!     unreadable 2xx after the retries) and still unseen is sent again under the same id and
//!     name ([`Create::retry`]); 409 for our own pod counts as created.
//! 12. **create_batch** — only when nothing is unacknowledged and nothing is pending (as
//!     observed in the snapshot; scheduling-gated pods do not hold a batch back), and
//!     running < target, min(target − counted, batch size) executors are created with fresh
//!     ids (counted: running, Unknown, gated, and with `--count-terminating` terminating pods
//!     as quota charges them); `--max-pending` (Spark 3.1+'s maxPendingPods) lets
//!     pending pods stop blocking; adaptive batches (`adaptive.rs`) size the batch; a quota
//!     back-off or a crash-loop halt stops creation.
//! 13. **finish** — the counts, "converged" (the one definition every command uses:
//!     [`Summary::converged`]), the deleted ids still visible, [`Plan::requeue_after_ms`], and
//!     the state to persist if every call succeeds.
//!
//! **Resource profiles** (Spark 3.1+'s stage-level scheduling, SPARK-33288): the state keeps a
//! target per profile ([`AllocatorState::targets`]); a pod's profile is its
//! `spark-exec-resourceprofile-id` label (none: 0), a request's the one it was created for.
//! While no profile but 0 has a target, everything counts as profile 0's (Spark's
//! single-profile path). With several, rules 10 and 12 and "converged" run per profile, in
//! profile id order as Spark 3.5 walks them: known, excess and its choice per profile; a batch
//! per profile, waiting on that profile's own requests (and, under Spark 3.0's rule, pending
//! pods); `--max-pending` counted over every profile, its free slots split among the profiles
//! that want pods as Spark's `splitSlots` does; pods of a profile without a target are neither
//! counted nor touched. Removal lowers its executor's profile's target. One id counter serves
//! every profile.

mod adaptive;
mod guard;
mod plan;
mod record;
mod rules;
mod settings;
mod state;
mod steer;

pub use plan::{
    Blocked, Create, Delete, DeleteReason, PhaseCounts, Plan, ProfileSummary, Request, StepError,
    Summary, TargetChange,
};
pub use record::{next_tick_ms, record, requeue_after_ms, Outcomes};
pub use settings::{
    is_kubelet_rejection, FailureLimit, Policies, Settings, DEFAULT_BATCH_DELAY_MS,
    DEFAULT_BATCH_SIZE, DEFAULT_EXECUTOR_IDLE_TIMEOUT_MS, DEFAULT_FAILURE_WINDOW_MS,
    DEFAULT_UNKNOWN_TIMEOUT_MS, KUBELET_REJECTIONS, MAX_TARGET, MIN_CREATION_TIMEOUT_MS,
    SPARK3X_CREATION_TIMEOUT_MS, STUCK_REASONS,
};
pub use state::{
    AdaptiveState, AllocatorState, Backoff, BackoffCause, Counters, FailureRecord, StateOwner,
    StuckRecord, Unacknowledged, MAX_BACKOFF_MS, MIN_BACKOFF_MS, STATE_VERSION,
};
pub use steer::{take_requests, SteerOp, Steering};

use crate::engine::snapshot::Snapshot;
use rules::Step;

/// Runs one allocation step. Pure and deterministic; the module doc lists the rules in the
/// order this function runs them.
///
/// `now_ms` is milliseconds since the Unix epoch. Errors: [`StepError::NoTarget`] when neither
/// the request nor the state has a target.
pub fn step(
    snapshot: &Snapshot,
    state: &AllocatorState,
    settings: &Settings,
    request: &Request,
    now_ms: u64,
) -> Result<Plan, StepError> {
    let mut s = Step::begin(snapshot, state, settings, request, now_ms)?;
    s.acknowledge_seen();
    if let Some(why) = s.driver_ended() {
        return Ok(s.wind_down(why));
    }
    s.forget_vanished();
    s.time_out_unseen();
    let absolute = |c: Option<&TargetChange>| matches!(c, Some(TargetChange::Absolute(_)));
    let lowers = |p: u32| {
        !(absolute(request.profiles.get(&p)) || (p == 0 && absolute(Some(&request.target))))
    };
    s.retry_removals();
    s.remove_requested(&request.remove, &request.filed, lowers);
    let mut pods = s.census();
    s.delete_lost(&mut pods);
    s.delete_stuck(&mut pods);
    let guard = s.crash_loop_guard();
    s.delete_excess(&mut pods);
    s.retry_ambiguous();
    let batch = s.create_batch(&pods, guard.halt.is_some());
    Ok(s.finish(pods, guard, batch))
}

#[cfg(test)]
mod tests;
