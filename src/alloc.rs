//! The allocation step: `(Snapshot, AllocatorState, Settings, Request, now_ms) → Plan`.
//!
//! This module is fully deterministic: it has no networking code, reads no clock, touches no
//! file and draws no random number. Callers hand it a snapshot of the cluster and the time,
//! and take back plain data — the pods to create and to delete, and the state to persist —
//! in the style of sans-IO protocol cores such as `quinn-proto`. It is the only place
//! allocation policy lives.
//!
//! The default policy is Spark 3.0's `ExecutorPodsAllocator` (seed 004), rule by rule
//! (DESIGN.md "Allocation semantics"):
//! 1. Unacknowledged ids (created by us, not yet seen) that appear in the snapshot, in any
//!    state, stop being unacknowledged.
//! 2. Unacknowledged ids older than the creation timeout (default max(5 × batch delay, 60 s),
//!    strictly older) are deleted — they may exist unseen — and forgotten, so they get replaced.
//! 3. known = running + pending + unacknowledged. If known > target, the excess is deleted:
//!    unacknowledged first (newest first), then pending (unscheduled first, then newest first).
//!    Running executors are never deleted for excess, and a pending pod is deleted only if it
//!    is still pending when the call is made ([`Delete::if_pending`]).
//! 4. Only when nothing is unacknowledged and nothing is pending (as observed in the snapshot),
//!    and running < target, min(target − running, batch size) executors are created with
//!    fresh ids.
//! 5. Failed and succeeded executors do not count; their pods are deleted (unless
//!    [`Settings::delete_terminated`] is off), so they get replaced by rule 4.
//! 6. Explicit removal (seed 001's `deleteExecutors`) deletes the named executors whatever
//!    their state and lowers the target by the number of them that exist (running, pending,
//!    unknown or unacknowledged).
//!
//! Executor ids are never reused: the next id is max(persisted counter, highest id seen in the
//! cluster) + 1, so ids survive a lost state file.

use crate::podspec::pod_name;
use crate::snapshot::{ExecutorPod, ExecutorState, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The state file / `plan --state` format version this build reads and writes.
pub const STATE_VERSION: u32 = 1;

/// Default batch size (Spark's `spark.kubernetes.allocation.batch.size`): pods per batch.
pub const DEFAULT_BATCH_SIZE: u32 = 5;
/// Default batch delay (Spark's `spark.kubernetes.allocation.batch.delay`): 1 s, in ms.
pub const DEFAULT_BATCH_DELAY_MS: u64 = 1000;
/// Floor of the default creation timeout (Spark: `max(batch delay × 5, 60000)`), in ms.
pub const MIN_CREATION_TIMEOUT_MS: u64 = 60_000;

/// Allocation settings. Durations are milliseconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Pods created per tick at most (≥ 1).
    pub batch_size: u32,
    /// Time between ticks, ms; also sets the default creation timeout.
    pub batch_delay_ms: u64,
    /// How long a created pod may stay unseen before it is deleted and replaced, ms.
    /// `None`: max(5 × batch delay, 60 s), as Spark.
    pub creation_timeout_ms: Option<u64>,
    /// Delete Failed/Succeeded executor pods (default true, as Spark's
    /// `spark.kubernetes.executor.deleteOnTermination`).
    pub delete_terminated: bool,
    /// The pod name prefix (see [`crate::podspec::name_prefix`]).
    pub name_prefix: String,
    /// Opt-in policies beyond the seed's (all off by default).
    pub policies: Policies,
}

/// Opt-in allocation policies (issue "faster than Spark"). All off by default: the seed's
/// behaviour and the conformance corpus are unchanged unless one is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policies {
    /// Spark's `spark.kubernetes.allocation.maxPendingPods` (SPARK-33262, SPARK-36052):
    /// pending pods no longer block; a new batch is allowed once every earlier request was
    /// seen, sized min(target − known, batch size, max_pending − pending).
    pub max_pending: Option<u32>,
    /// Adaptive batches (`--batch-size auto`) up to this cap: the batch doubles after a batch
    /// whose pods were all seen with none unschedulable, and halves after throttling
    /// (429/5xx/quota, reported by the tick) or when pods are unschedulable.
    pub adaptive_max_batch: Option<u32>,
    /// Crash-loop guard (Spark's `spark.executor.maxNumFailures` idea): more than this many
    /// executor failures within [`Policies::failure_window_ms`] stop all creation
    /// ([`Plan::halt`]).
    pub max_failures: Option<u32>,
    /// The crash-loop guard's window, ms (default 10 minutes).
    pub failure_window_ms: u64,
    /// A pod waiting in ErrImagePull, ImagePullBackOff, InvalidImageName,
    /// CreateContainerConfigError or CrashLoopBackOff longer than this (ms) counts as a
    /// failure: deleted once (reason `stuck`) and counted by the guard. Unschedulable alone is
    /// not a failure.
    pub startup_grace_ms: Option<u64>,
    /// Also delete running executors above the target (off by default, as Spark), lowest
    /// pod-deletion-cost first, then most restarts, then newest.
    pub scale_down_running: bool,
}

/// Default crash-loop guard window: 10 minutes, in ms.
pub const DEFAULT_FAILURE_WINDOW_MS: u64 = 600_000;

/// Waiting reasons that mean a pod will not start by itself (see [`Policies::startup_grace_ms`]).
pub const STUCK_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CrashLoopBackOff",
];

impl Settings {
    /// Settings with Spark's defaults for pods named after `name_prefix`.
    pub fn new(name_prefix: impl Into<String>) -> Settings {
        Settings {
            batch_size: DEFAULT_BATCH_SIZE,
            batch_delay_ms: DEFAULT_BATCH_DELAY_MS,
            creation_timeout_ms: None,
            delete_terminated: true,
            name_prefix: name_prefix.into(),
            policies: Policies {
                failure_window_ms: DEFAULT_FAILURE_WINDOW_MS,
                ..Policies::default()
            },
        }
    }

    /// The creation timeout in effect, ms: the configured one, else
    /// max(5 × batch delay, 60 s) (Spark's `podCreationTimeout`).
    pub fn creation_timeout(&self) -> u64 {
        self.creation_timeout_ms.unwrap_or_else(|| {
            self.batch_delay_ms
                .saturating_mul(5)
                .max(MIN_CREATION_TIMEOUT_MS)
        })
    }
}

/// One executor we asked for and have not seen in any snapshot yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unacknowledged {
    /// The executor id.
    pub executor_id: u64,
    /// When the create was planned, ms since the Unix epoch.
    pub created_ms: u64,
}

/// What persists between ticks (the state file, and `state` in `plan` output).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorState {
    /// Format version; [`STATE_VERSION`].
    pub version: u32,
    /// Total expected executors; `None` until a target is first given.
    #[serde(default)]
    pub target: Option<u32>,
    /// The highest executor id ever handed out (0: none yet).
    #[serde(default)]
    pub last_executor_id: u64,
    /// Created by us, not yet seen; ordered by id.
    #[serde(default)]
    pub unacknowledged: Vec<Unacknowledged>,
    /// Ids we deleted that the last snapshot still showed (Spark's `deletedExecutorIds`);
    /// informational, pruned as the pods disappear.
    #[serde(default)]
    pub deleted: Vec<u64>,
    /// Creation back-off after a quota rejection (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_backoff: Option<Backoff>,
    /// Running totals for metrics (absent: all zero). Not used by the step; carried through.
    #[serde(default, skip_serializing_if = "Counters::is_zero")]
    pub counters: Counters,
    /// Executor failures inside the crash-loop guard's window (only with `max_failures`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailureRecord>,
    /// Pods seen stuck in a [`STUCK_REASONS`] state, since when (only with `startup_grace`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<StuckRecord>,
    /// Adaptive batch state (only with `--batch-size auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveState>,
}

/// One executor failure counted by the crash-loop guard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The executor id.
    pub executor_id: u64,
    /// When the failure was first seen, ms since the Unix epoch.
    pub at_ms: u64,
    /// Why (see [`crate::snapshot::ExecutorPod::reason`]).
    pub reason: String,
}

/// A pod stuck in start-up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StuckRecord {
    /// The executor id.
    pub executor_id: u64,
    /// When it was first seen stuck, ms since the Unix epoch.
    pub since_ms: u64,
    /// The waiting reason.
    pub reason: String,
}

/// Adaptive batch state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdaptiveState {
    /// The current batch size (1 ..= the cap).
    pub batch: u32,
    /// Set by the tick when its creates met 429, 5xx or a quota rejection: the next step
    /// halves the batch.
    #[serde(default)]
    pub throttled: bool,
}

/// Totals kept across ticks and processes (a cron run is one process per tick), exported by
/// `--metrics-file` and `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Executor pods created (201, or 409 for our own pod).
    #[serde(default)]
    pub created: u64,
    /// Executor pods deleted (or found already gone).
    #[serde(default)]
    pub deleted: u64,
    /// API error responses by HTTP code (as a string key), retries included.
    #[serde(default)]
    pub api_errors: BTreeMap<String, u64>,
    /// When the last tick without error ended, ms since the Unix epoch.
    #[serde(default)]
    pub last_success_ms: Option<u64>,
}

impl Counters {
    /// True when nothing was counted yet (then the state file omits the field).
    pub fn is_zero(&self) -> bool {
        *self == Counters::default()
    }
}

/// No creates before `until_ms`: set when the API server rejected a create for a
/// ResourceQuota (403 "exceeded quota"), so a full quota is not hammered every tick.
/// The delay doubles on each rejection up to [`MAX_BACKOFF_MS`] and the back-off is cleared
/// by the next successful create, as Kubernetes' controllers back off a failing sync.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// No creates before this time, ms since the Unix epoch.
    pub until_ms: u64,
    /// The delay that set `until_ms`, ms; the next rejection doubles it.
    pub delay_ms: u64,
    /// Why (the quota message), for `status` and logs.
    pub reason: String,
}

/// First creation back-off after a quota rejection, ms.
pub const MIN_BACKOFF_MS: u64 = 5_000;
/// Longest creation back-off, ms (5 minutes).
pub const MAX_BACKOFF_MS: u64 = 300_000;

impl Backoff {
    /// The back-off after a rejection at `now_ms`, following `previous` (doubling, capped):
    /// max(batch delay, 5 s), then ×2 per rejection, at most 5 minutes.
    pub fn after_rejection(
        previous: Option<&Backoff>,
        batch_delay_ms: u64,
        now_ms: u64,
        reason: String,
    ) -> Backoff {
        let delay_ms = match previous {
            Some(b) => b.delay_ms.saturating_mul(2),
            None => batch_delay_ms.max(MIN_BACKOFF_MS),
        }
        .min(MAX_BACKOFF_MS);
        Backoff {
            until_ms: now_ms.saturating_add(delay_ms),
            delay_ms,
            reason,
        }
    }
}

impl AllocatorState {
    /// A fresh state: no target, no ids handed out.
    pub fn new() -> AllocatorState {
        AllocatorState {
            version: STATE_VERSION,
            ..AllocatorState::default()
        }
    }

    /// Checks a loaded state: known version, ids consistent. Errors: one line naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.version != STATE_VERSION {
            return Err(format!(
                "state version {} is not supported by this podalloc (it reads version {STATE_VERSION}); \
                 use the podalloc that wrote it",
                self.version
            ));
        }
        if let Some(u) = self.unacknowledged.iter().find(|u| u.executor_id == 0) {
            return Err(format!(
                "unacknowledged executor id {} is not ≥ 1",
                u.executor_id
            ));
        }
        if let Some(u) = self
            .unacknowledged
            .iter()
            .find(|u| u.executor_id > self.last_executor_id)
        {
            return Err(format!(
                "unacknowledged executor id {} is above last_executor_id {}",
                u.executor_id, self.last_executor_id
            ));
        }
        Ok(())
    }
}

/// What the caller asks of this step besides keeping the target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// A new target (total expected executors); `None` keeps the state's.
    pub target: Option<u32>,
    /// Executors to delete now whatever their state, lowering the target (seed 001).
    pub remove: Vec<u64>,
}

/// Why a pod is deleted (the `reason` of a `delete` entry in the plan contract).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeleteReason {
    /// Created but not seen within the creation timeout.
    TimedOut,
    /// Above the target (unacknowledged or pending).
    Excess,
    /// Phase Failed.
    Failed,
    /// Phase Succeeded.
    Succeeded,
    /// Named in a removal request.
    Removed,
    /// Stuck in start-up longer than the grace (ErrImagePull, CrashLoopBackOff, …).
    Stuck,
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeleteReason::TimedOut => "timed-out",
            DeleteReason::Excess => "excess",
            DeleteReason::Failed => "failed",
            DeleteReason::Succeeded => "succeeded",
            DeleteReason::Removed => "removed",
            DeleteReason::Stuck => "stuck",
        })
    }
}

/// A pod to create.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Create {
    /// The fresh executor id.
    pub executor_id: u64,
    /// Its pod name, a DNS-1123 label ≤ 63 characters.
    pub pod_name: String,
}

/// A pod to delete.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Delete {
    /// The executor id.
    pub executor_id: u64,
    /// The pod's name (from the snapshot, or the deterministic name for unseen pods).
    pub pod_name: String,
    /// Why.
    pub reason: DeleteReason,
    /// Delete only if the pod is still Pending when the call is made (excess pending pods:
    /// Spark restricts this delete to `status.phase=Pending`), so a pod that turned Running
    /// since the snapshot is not killed.
    pub if_pending: bool,
    /// `metadata.uid` when the snapshot saw the pod (for delete preconditions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// Counts behind the plan, for logs and `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The target after this step (after removals).
    pub target: u32,
    /// Running executors in the snapshot (not being removed).
    pub running: u32,
    /// Pending executors in the snapshot (not being removed).
    pub pending: u32,
    /// Unacknowledged executors carried into this step (after rules 1–2, before creates).
    pub unacknowledged: u32,
    /// Failed executors in the snapshot.
    pub failed: u32,
    /// Succeeded executors in the snapshot.
    pub succeeded: u32,
    /// Executors with a deletionTimestamp in the snapshot.
    pub deleting: u32,
    /// Executors in an unknown phase.
    pub unknown: u32,
    /// Pods planned for creation.
    pub created: u32,
    /// Pods planned for deletion.
    pub deleted: u32,
    /// True when running = target with nothing pending, unacknowledged or planned.
    pub converged: bool,
}

/// The step's decision: the `plan` JSON contract (`create`, `delete`, `state`) plus extras.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Pods to create, in creation order.
    pub create: Vec<Create>,
    /// Pods to delete, in call order (timed-out, removed, terminated, excess).
    pub delete: Vec<Delete>,
    /// The state to persist if every planned call succeeds.
    pub state: AllocatorState,
    /// Counts.
    pub summary: Summary,
    /// Things the operator should know (ignored pods, unknown ids to remove).
    pub warnings: Vec<String>,
    /// The crash-loop guard stopped creation: why (dominant failure reason). The tick exits
    /// with code 6.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub halt: Option<String>,
}

/// Why no plan could be made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepError {
    /// Neither the request nor the state has a target.
    NoTarget,
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::NoTarget => f.write_str(
                "no target: pass --target N (or `podalloc scale N`); the state holds none yet",
            ),
        }
    }
}

impl std::error::Error for StepError {}

/// Runs one allocation step. Pure and deterministic; see the module doc for the rules.
///
/// `now_ms` is milliseconds since the Unix epoch. Errors: [`StepError::NoTarget`].
pub fn step(
    snapshot: &Snapshot,
    state: &AllocatorState,
    settings: &Settings,
    request: &Request,
    now_ms: u64,
) -> Result<Plan, StepError> {
    let pol = &settings.policies;
    let mut target = request.target.or(state.target).ok_or(StepError::NoTarget)?;
    let mut last_id = state.last_executor_id.max(snapshot.max_id());
    let mut warnings = snapshot.warnings.clone();
    let mut delete: Vec<Delete> = Vec::new();
    let name = |id: u64| pod_name(&settings.name_prefix, id);
    let uid_of = |p: &ExecutorPod| Some(p.uid.clone()).filter(|u| !u.is_empty());

    // Rule 1: seen ids are acknowledged.
    let mut unack: BTreeMap<u64, u64> = state
        .unacknowledged
        .iter()
        .filter(|u| !snapshot.executors.contains_key(&u.executor_id))
        .map(|u| (u.executor_id, u.created_ms))
        .collect();

    // Rule 2: time out creations never seen.
    let timeout = settings.creation_timeout();
    let timed_out: Vec<u64> = unack
        .iter()
        .filter(|(_, &t)| now_ms.saturating_sub(t) > timeout)
        .map(|(&id, _)| id)
        .collect();
    for id in timed_out {
        unack.remove(&id);
        delete.push(Delete {
            executor_id: id,
            pod_name: name(id),
            reason: DeleteReason::TimedOut,
            if_pending: false,
            uid: None,
        });
    }

    // Rule 6: explicit removal, before counting.
    let mut removed: BTreeSet<u64> = BTreeSet::new();
    for &id in &request.remove {
        if !removed.insert(id) {
            continue;
        }
        let (pod_name_, uid, counts) = match snapshot.executors.get(&id) {
            Some(p) => match p.state {
                ExecutorState::Deleted => {
                    warnings.push(format!("executor {id} is already being deleted"));
                    continue;
                }
                ExecutorState::Failed | ExecutorState::Succeeded => {
                    (p.name.clone(), uid_of(p), false)
                }
                _ => (p.name.clone(), uid_of(p), true),
            },
            None if unack.remove(&id).is_some() => (name(id), None, true),
            None => {
                warnings.push(format!("executor {id} does not exist: nothing to remove"));
                continue;
            }
        };
        if counts {
            target = target.saturating_sub(1);
        }
        delete.push(Delete {
            executor_id: id,
            pod_name: pod_name_,
            reason: DeleteReason::Removed,
            if_pending: false,
            uid,
        });
    }

    // Count what the snapshot shows (removed executors no longer count).
    let mut s = Summary {
        target,
        ..Summary::default()
    };
    let mut running: Vec<&ExecutorPod> = Vec::new();
    let mut pending: Vec<&ExecutorPod> = Vec::new();
    let mut newly_failed: Vec<(u64, String)> = Vec::new();
    for p in snapshot
        .executors
        .values()
        .filter(|p| !removed.contains(&p.id))
    {
        match p.state {
            ExecutorState::Running => running.push(p),
            ExecutorState::Pending => pending.push(p),
            ExecutorState::Failed | ExecutorState::Succeeded => {
                let failed = p.state == ExecutorState::Failed;
                if failed {
                    s.failed += 1;
                    newly_failed.push((p.id, p.reason.clone().unwrap_or_else(|| "failed".into())));
                } else {
                    s.succeeded += 1;
                }
                // Rule 5: terminated executors are deleted and so replaced.
                if settings.delete_terminated {
                    delete.push(Delete {
                        executor_id: p.id,
                        pod_name: p.name.clone(),
                        reason: if failed {
                            DeleteReason::Failed
                        } else {
                            DeleteReason::Succeeded
                        },
                        if_pending: false,
                        uid: uid_of(p),
                    });
                }
            }
            ExecutorState::Deleted => s.deleting += 1,
            ExecutorState::Unknown => s.unknown += 1,
        }
    }

    // Policy: pods stuck in start-up longer than the grace are failures, deleted once.
    let mut stuck_records: Vec<StuckRecord> = Vec::new();
    if let Some(grace) = pol.startup_grace_ms {
        let since: BTreeMap<u64, u64> = state
            .stuck
            .iter()
            .map(|r| (r.executor_id, r.since_ms))
            .collect();
        let mut stuck_ids: BTreeSet<u64> = BTreeSet::new();
        for p in running.iter().chain(pending.iter()) {
            let Some(reason) = p.waiting.as_deref().filter(|r| STUCK_REASONS.contains(r)) else {
                continue;
            };
            let since_ms = since.get(&p.id).copied().unwrap_or(now_ms);
            if now_ms.saturating_sub(since_ms) > grace {
                stuck_ids.insert(p.id);
                newly_failed.push((p.id, reason.to_string()));
                delete.push(Delete {
                    executor_id: p.id,
                    pod_name: p.name.clone(),
                    reason: DeleteReason::Stuck,
                    if_pending: false,
                    uid: uid_of(p),
                });
            } else {
                stuck_records.push(StuckRecord {
                    executor_id: p.id,
                    since_ms,
                    reason: reason.to_string(),
                });
            }
        }
        running.retain(|p| !stuck_ids.contains(&p.id));
        pending.retain(|p| !stuck_ids.contains(&p.id));
    }

    // Policy: the crash-loop guard.
    // Failures inside the window are always kept (so `status` shows them and a run without
    // the guard does not forget them); the guard acts on them only when it is on.
    let mut failures: Vec<FailureRecord> = state
        .failures
        .iter()
        .filter(|f| now_ms.saturating_sub(f.at_ms) <= pol.failure_window_ms)
        .cloned()
        .collect();
    for (id, reason) in newly_failed {
        if !state.failures.iter().any(|f| f.executor_id == id) {
            failures.push(FailureRecord {
                executor_id: id,
                at_ms: now_ms,
                reason,
            });
        }
    }
    let mut halt: Option<String> = None;
    if let Some(max) = pol.max_failures {
        if failures.len() as u64 > max as u64 {
            let mut by_reason: BTreeMap<&str, usize> = BTreeMap::new();
            for f in &failures {
                *by_reason.entry(f.reason.as_str()).or_insert(0) += 1;
            }
            let (top, n) = by_reason
                .iter()
                .max_by_key(|(r, n)| (**n, std::cmp::Reverse(**r)))
                .map(|(r, n)| (r.to_string(), *n))
                .unwrap_or_default();
            halt = Some(format!(
                "crash loop: {} executors failed within {} (limit {max}); most often: {top} ({n}); \
                 creation stopped — fix the cause, then wait out the window or raise --max-failures",
                failures.len(),
                humantime::format_duration(std::time::Duration::from_millis(pol.failure_window_ms)),
            ));
        }
    }

    s.running = running.len() as u32;
    s.pending = pending.len() as u32;
    s.unacknowledged = unack.len() as u32;
    let pending_seen = !pending.is_empty();

    // Rule 3: excess requests, unacknowledged first, then pending; never running (unless
    // the scale-down-running policy is on).
    let mut excess_pending = 0u32;
    let known = running.len() as u64 + pending.len() as u64 + unack.len() as u64;
    if known > target as u64 {
        let mut excess = known - target as u64;
        let newest_unack: Vec<u64> = unack.keys().rev().copied().collect();
        for id in newest_unack {
            if excess == 0 {
                break;
            }
            unack.remove(&id);
            excess -= 1;
            delete.push(Delete {
                executor_id: id,
                pod_name: name(id),
                reason: DeleteReason::Excess,
                if_pending: true,
                uid: None,
            });
        }
        // As ReplicaSet ranks: unscheduled first, lower pod-deletion-cost, then newest.
        pending.sort_by_key(|p| (p.scheduled, p.deletion_cost, std::cmp::Reverse(p.id)));
        for p in pending.iter().take(excess as usize) {
            excess -= 1;
            excess_pending += 1;
            delete.push(Delete {
                executor_id: p.id,
                pod_name: p.name.clone(),
                reason: DeleteReason::Excess,
                if_pending: true,
                uid: uid_of(p),
            });
        }
        if pol.scale_down_running && excess > 0 {
            running.sort_by_key(|p| {
                (
                    p.deletion_cost,
                    std::cmp::Reverse(p.restarts),
                    std::cmp::Reverse(p.id),
                )
            });
            for p in running.iter().take(excess as usize) {
                delete.push(Delete {
                    executor_id: p.id,
                    pod_name: p.name.clone(),
                    reason: DeleteReason::Excess,
                    if_pending: false,
                    uid: uid_of(p),
                });
            }
        }
    }

    // Rule 4: a new batch only when nothing is outstanding (and no quota back-off or
    // crash-loop halt is on).
    let backing_off = state
        .create_backoff
        .as_ref()
        .filter(|b| now_ms < b.until_ms);
    if let (Some(b), true) = (backing_off, s.running < target) {
        warnings.push(format!(
            "not creating executors for {} ms more: the last create was rejected ({})",
            b.until_ms - now_ms,
            b.reason
        ));
    }
    let mut adaptive = None;
    let batch = match pol.adaptive_max_batch {
        None => settings.batch_size,
        Some(cap) => {
            let cap = cap.max(1);
            let prev = state.adaptive.clone();
            let mut b = prev
                .as_ref()
                .map_or(settings.batch_size.min(cap), |a| a.batch)
                .clamp(1, cap);
            let unschedulable = pending.iter().any(|p| p.unschedulable);
            if prev.as_ref().is_some_and(|a| a.throttled) || unschedulable {
                b = (b / 2).max(1);
            } else if prev.is_some() && unack.is_empty() && !pending.iter().any(|p| !p.scheduled) {
                // The last batch was all seen and scheduled: grow, as slow-start does.
                b = b.saturating_mul(2).min(cap);
            }
            adaptive = Some(AdaptiveState {
                batch: b,
                throttled: false,
            });
            b
        }
    };
    let pending_left = s.pending - excess_pending;
    let (allowed, room) = match pol.max_pending {
        // Spark's default: nothing unacknowledged, nothing pending.
        None => (
            unack.is_empty() && !pending_seen,
            target.saturating_sub(s.running),
        ),
        // maxPendingPods: every request seen; pending only limits the size.
        Some(max) => (
            unack.is_empty(),
            target
                .saturating_sub(s.running + pending_left)
                .min(max.saturating_sub(pending_left)),
        ),
    };
    let mut create = Vec::new();
    let ids_left = u64::MAX - last_id;
    if ids_left < room.min(batch) as u64 {
        warnings.push(format!(
            "executor ids are exhausted (the highest id seen is {last_id}): no more executors \
             can be created for this app id; use a new app id"
        ));
    }
    if allowed && room > 0 && backing_off.is_none() && halt.is_none() {
        let n = (room.min(batch) as u64).min(ids_left);
        for _ in 0..n {
            last_id += 1;
            unack.insert(last_id, now_ms);
            create.push(Create {
                executor_id: last_id,
                pod_name: name(last_id),
            });
        }
    } else if let (Some(a), Some(prev)) = (adaptive.as_mut(), state.adaptive.as_ref()) {
        // No batch this step: the size only changes when a batch is made.
        if !prev.throttled && !pending.iter().any(|p| p.unschedulable) {
            a.batch = prev.batch;
        }
    }

    s.created = create.len() as u32;
    s.deleted = delete.len() as u32;
    // Running executors above the target stay (Spark's rule) unless --scale-down-running:
    // then there is nothing more to do, which counts as converged, with a warning.
    let above = s.running > target && !pol.scale_down_running;
    if above {
        warnings.push(format!(
            "{} running executors are above the target {target} and are left running (as Spark \
             does); pass --scale-down-running, or `podalloc remove ID…`, to stop some",
            s.running
        ));
    }
    s.converged = backing_off.is_none()
        && halt.is_none()
        && create.is_empty()
        && delete.is_empty()
        && unack.is_empty()
        && !pending_seen
        && (s.running == target || above);

    // Spark's deletedExecutorIds: ours deleted, still visible; pruned to what the cluster shows.
    let mut deleted: BTreeSet<u64> = state
        .deleted
        .iter()
        .copied()
        .filter(|id| snapshot.executors.contains_key(id))
        .collect();
    deleted.extend(delete.iter().map(|d| d.executor_id));

    let state = AllocatorState {
        version: STATE_VERSION,
        target: Some(target),
        last_executor_id: last_id,
        unacknowledged: unack
            .into_iter()
            .map(|(executor_id, created_ms)| Unacknowledged {
                executor_id,
                created_ms,
            })
            .collect(),
        deleted: deleted.into_iter().collect(),
        create_backoff: state.create_backoff.clone(),
        counters: state.counters.clone(),
        failures,
        stuck: stuck_records,
        adaptive,
    };
    Ok(Plan {
        create,
        delete,
        state,
        summary: s,
        warnings,
        halt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn pod(id: u64, state: ExecutorState) -> ExecutorPod {
        ExecutorPod {
            id,
            name: format!("app-exec-{id}"),
            uid: format!("uid-{id}"),
            resource_version: "1".into(),
            state,
            scheduled: state != ExecutorState::Pending,
            detail: None,
            reason: None,
            waiting: None,
            unschedulable: false,
            deletion_cost: 0,
            restarts: 0,
        }
    }

    fn snap(pods: &[(u64, ExecutorState)]) -> Snapshot {
        Snapshot {
            executors: pods.iter().map(|&(id, s)| (id, pod(id, s))).collect(),
            ..Snapshot::default()
        }
    }

    fn settings(batch: u32) -> Settings {
        Settings {
            batch_size: batch,
            ..Settings::new("app")
        }
    }

    fn ids_c(p: &Plan) -> Vec<u64> {
        p.create.iter().map(|c| c.executor_id).collect()
    }
    fn ids_d(p: &Plan) -> Vec<u64> {
        let mut v: Vec<u64> = p.delete.iter().map(|d| d.executor_id).collect();
        v.sort();
        v
    }

    #[test]
    fn creation_timeout_default_and_override() {
        let mut s = settings(5);
        assert_eq!(s.creation_timeout(), 60_000);
        s.batch_delay_ms = 20_000;
        assert_eq!(s.creation_timeout(), 100_000);
        s.creation_timeout_ms = Some(5);
        assert_eq!(s.creation_timeout(), 5);
    }

    #[test]
    fn no_target_is_an_error() {
        let e = step(
            &snap(&[]),
            &AllocatorState::new(),
            &settings(5),
            &Request::default(),
            0,
        );
        assert_eq!(e.unwrap_err(), StepError::NoTarget);
    }

    #[test]
    fn first_batch_then_wait_then_next() {
        let st = AllocatorState::new();
        let req = Request {
            target: Some(7),
            remove: vec![],
        };
        let p = step(&snap(&[]), &st, &settings(5), &req, 10).unwrap();
        assert_eq!(ids_c(&p), vec![1, 2, 3, 4, 5]);
        assert_eq!(p.create[0].pod_name, "app-exec-1");
        // Seen but pending: nothing new.
        use ExecutorState::*;
        let s2 = snap(&[
            (1, Running),
            (2, Running),
            (3, Running),
            (4, Running),
            (5, Pending),
        ]);
        let p2 = step(&s2, &p.state, &settings(5), &Request::default(), 20).unwrap();
        assert!(p2.create.is_empty() && p2.delete.is_empty());
        assert!(p2.state.unacknowledged.is_empty());
        let s3 = snap(&[
            (1, Running),
            (2, Running),
            (3, Running),
            (4, Running),
            (5, Running),
        ]);
        let p3 = step(&s3, &p2.state, &settings(5), &Request::default(), 30).unwrap();
        assert_eq!(ids_c(&p3), vec![6, 7]);
        assert!(!p3.summary.converged);
    }

    #[test]
    fn excess_takes_unacknowledged_then_unscheduled_pending_newest_first() {
        use ExecutorState::*;
        let mut st = AllocatorState::new();
        st.target = Some(6);
        st.last_executor_id = 6;
        st.unacknowledged = vec![
            Unacknowledged {
                executor_id: 5,
                created_ms: 0,
            },
            Unacknowledged {
                executor_id: 6,
                created_ms: 0,
            },
        ];
        let mut s = snap(&[(1, Running), (2, Pending), (3, Pending), (4, Pending)]);
        s.executors.get_mut(&2).unwrap().scheduled = true;
        // known = 1 + 3 + 2 = 6; target 2 → excess 4: 6, 5, then unscheduled 4, 3 (not 2).
        let p = step(
            &s,
            &st,
            &settings(5),
            &Request {
                target: Some(2),
                remove: vec![],
            },
            1,
        )
        .unwrap();
        assert_eq!(ids_d(&p), vec![3, 4, 5, 6]);
        assert!(p
            .delete
            .iter()
            .all(|d| d.reason == DeleteReason::Excess && d.if_pending));
        assert!(p.state.unacknowledged.is_empty());
        assert!(p.create.is_empty());
    }

    #[test]
    fn remove_lowers_target_only_for_existing() {
        use ExecutorState::*;
        let s = snap(&[(1, Running), (2, Running), (3, Failed), (4, Deleted)]);
        let req = Request {
            target: Some(4),
            remove: vec![2, 3, 4, 99, 2],
        };
        let p = step(&s, &AllocatorState::new(), &settings(5), &req, 0).unwrap();
        assert_eq!(p.state.target, Some(3));
        assert_eq!(ids_d(&p), vec![2, 3]);
        assert!(p.delete.iter().all(|d| d.reason == DeleteReason::Removed));
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
        // running 1 < target 3 → 2 more, ids above everything seen.
        assert_eq!(ids_c(&p), vec![5, 6]);
    }

    #[test]
    fn keep_terminated_does_not_delete_but_still_replaces() {
        use ExecutorState::*;
        let mut set = settings(5);
        set.delete_terminated = false;
        let p = step(
            &snap(&[(1, Running), (2, Failed)]),
            &AllocatorState::new(),
            &set,
            &Request {
                target: Some(2),
                remove: vec![],
            },
            0,
        )
        .unwrap();
        assert!(p.delete.is_empty());
        assert_eq!(ids_c(&p), vec![3]);
    }

    #[test]
    fn quota_backoff_holds_creates_until_it_expires() {
        let mut st = AllocatorState::new();
        st.target = Some(3);
        st.create_backoff = Some(Backoff::after_rejection(
            None,
            1000,
            10_000,
            "exceeded quota: q".into(),
        ));
        assert_eq!(st.create_backoff.as_ref().unwrap().until_ms, 15_000);
        let p = step(&snap(&[]), &st, &settings(5), &Request::default(), 14_999).unwrap();
        assert!(p.create.is_empty());
        assert!(p.warnings.iter().any(|w| w.contains("exceeded quota")));
        assert_eq!(
            p.state.create_backoff, st.create_backoff,
            "kept until a create succeeds"
        );
        let p = step(&snap(&[]), &st, &settings(5), &Request::default(), 15_000).unwrap();
        assert_eq!(ids_c(&p), vec![1, 2, 3]);
        // Doubling, capped.
        let mut b = Backoff::after_rejection(None, 1000, 0, String::new());
        for _ in 0..20 {
            b = Backoff::after_rejection(Some(&b), 1000, 0, String::new());
        }
        assert_eq!(b.delay_ms, MAX_BACKOFF_MS);
    }

    #[test]
    fn clock_going_backwards_does_not_time_out() {
        let mut st = AllocatorState::new();
        st.target = Some(1);
        st.last_executor_id = 1;
        st.unacknowledged = vec![Unacknowledged {
            executor_id: 1,
            created_ms: 1_000_000,
        }];
        let p = step(&snap(&[]), &st, &settings(5), &Request::default(), 0).unwrap();
        assert!(p.delete.is_empty() && p.create.is_empty());
    }

    // ---- property tests: a random cluster driven by the step --------------------------------

    #[derive(Clone, Debug)]
    enum Event {
        Target(u32),
        Progress(u8),
        Fail(u8),
        LoseCreates,
        Advance(u32),
        Remove(u8),
        LoseState,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u32..30).prop_map(Event::Target),
            any::<u8>().prop_map(Event::Progress),
            any::<u8>().prop_map(Event::Fail),
            Just(Event::LoseCreates),
            (0u32..90_000).prop_map(Event::Advance),
            any::<u8>().prop_map(Event::Remove),
            Just(Event::LoseState),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        /// Invariants over random runs: no overshoot, ≤ batch per tick, ids strictly increasing
        /// and never reused, running never deleted for excess, terminating never deleted again.
        #[test]
        fn invariants_hold(batch in 1u32..8, events in proptest::collection::vec(event(), 1..60)) {
            let set = settings(batch);
            let mut cluster: BTreeMap<u64, ExecutorState> = BTreeMap::new();
            let mut state = AllocatorState::new();
            let mut now = 0u64;
            let mut target = 0u32;
            let mut highest_ever = 0u64;
            let mut lose_next_creates = false;
            let mut remove: Vec<u64> = vec![];
            for ev in events {
                match ev {
                    Event::Target(t) => target = t,
                    Event::Progress(k) => {
                        for (i, (_, s)) in cluster.iter_mut().enumerate() {
                            if *s == ExecutorState::Pending && (k as usize + i).is_multiple_of(2) {
                                *s = ExecutorState::Running;
                            }
                        }
                    }
                    Event::Fail(k) => {
                        if let Some((_, s)) = cluster.iter_mut().nth(k as usize % 8) {
                            if *s == ExecutorState::Running { *s = ExecutorState::Failed; }
                        }
                    }
                    Event::LoseCreates => lose_next_creates = true,
                    Event::Advance(ms) => now += ms as u64,
                    Event::Remove(k) => remove = cluster.keys().copied().nth(k as usize % 6).into_iter().collect(),
                    Event::LoseState => {
                        // Without a state file only the cluster remembers ids: new ids must
                        // still be above every id it shows.
                        state = AllocatorState::new();
                        highest_ever = cluster.keys().next_back().copied().unwrap_or(0);
                    }
                }
                let snapshot = snap(&cluster.iter().map(|(&i, &s)| (i, s)).collect::<Vec<_>>());
                let req = Request { target: Some(target), remove: std::mem::take(&mut remove) };
                let removing: Vec<u64> = req.remove.clone();
                let plan = step(&snapshot, &state, &set, &req, now).unwrap();
                let new_target = plan.state.target.unwrap();
                // ≤ a batch per tick.
                prop_assert!(plan.create.len() <= batch as usize);
                // Ids strictly increasing and never seen before.
                let mut prev = highest_ever;
                for c in &plan.create {
                    prop_assert!(c.executor_id > prev, "id {} not above {}", c.executor_id, prev);
                    prop_assert!(!cluster.contains_key(&c.executor_id));
                    prev = c.executor_id;
                }
                // No overshoot: creating only from a quiet state, up to the target.
                let running = snapshot.executors.values()
                    .filter(|p| p.state == ExecutorState::Running && !removing.contains(&p.id))
                    .count() as u32;
                if !plan.create.is_empty() {
                    prop_assert!(running + plan.create.len() as u32 <= new_target);
                    // Nothing pending (removed pods are going away and do not block).
                    let pending = snapshot.executors.values()
                        .filter(|p| p.state == ExecutorState::Pending && !removing.contains(&p.id))
                        .count();
                    prop_assert_eq!(pending, 0);
                }
                for d in &plan.delete {
                    match cluster.get(&d.executor_id) {
                        Some(ExecutorState::Running) => prop_assert_eq!(d.reason, DeleteReason::Removed),
                        Some(ExecutorState::Deleted) => prop_assert!(false, "deleted twice"),
                        _ => {}
                    }
                }
                // Apply the plan to the model cluster.
                for d in &plan.delete {
                    if d.if_pending && cluster.get(&d.executor_id) == Some(&ExecutorState::Running) {
                        continue;
                    }
                    if cluster.contains_key(&d.executor_id) {
                        cluster.insert(d.executor_id, ExecutorState::Deleted);
                    }
                }
                cluster.retain(|_, s| *s != ExecutorState::Deleted || !now.is_multiple_of(3));
                for c in &plan.create {
                    highest_ever = highest_ever.max(c.executor_id);
                    if !lose_next_creates {
                        cluster.insert(c.executor_id, ExecutorState::Pending);
                    }
                }
                lose_next_creates = false;
                // The live count never exceeds the larger of the target and running before.
                let live = cluster.values().filter(|s| matches!(s, ExecutorState::Pending | ExecutorState::Running)).count() as u32;
                prop_assert!(live <= new_target.max(running), "live {} > target {}", live, new_target);
                highest_ever = highest_ever.max(plan.state.last_executor_id);
                state = plan.state;
                now += 1000;
            }
        }
    }
}
