//! What goes into a step besides the snapshot and the state ([`Request`]) and what comes out
//! ([`Plan`]: the `plan` JSON contract).

use super::state::AllocatorState;
use crate::engine::snapshot::ExecutorPod;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// How this step changes the target (total expected executors).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TargetChange {
    /// Keep the state's target (an error when it has none: [`StepError::NoTarget`]).
    #[default]
    Keep,
    /// Set the target to this count (`--target N`, `podalloc scale N`; Spark's
    /// `requestTotalExecutors`).
    Set(u32),
    /// Raise the state's target by this count (0 when it has none), saturating: `podalloc add N`,
    /// Spark's `requestExecutors` (SPARK-9493's add-executors API).
    Add(u32),
    /// Set the target to this count only when the state has none: `run --target N`, so that
    /// a restarted or rolled-out loop never overrides the target kept in the store (the
    /// target's one home; `--force-target` overrides with [`TargetChange::Set`]).
    Seed(u32),
    /// Set the target to this count, which already accounts for this step's removals: they
    /// do not lower it further. An ExecutorSet's `spec.replicas` (`docs/executorset.md`):
    /// `podalloc remove` lowers it in the same write that asks for the removal.
    Absolute(u32),
}

impl TargetChange {
    /// The target after this change, from the state's `current` one. `None`: no target at all.
    /// An `Add` stops at [`crate::engine::alloc::MAX_TARGET`] (R3: a sum above it would be
    /// saved, then refused by every later load); [`TargetChange::overflows`] says when.
    pub fn apply(self, current: Option<u32>) -> Option<u32> {
        match self {
            TargetChange::Keep => current,
            TargetChange::Set(n) | TargetChange::Absolute(n) => Some(n),
            TargetChange::Add(n) => {
                Some((current.unwrap_or(0).saturating_add(n)).min(crate::engine::alloc::MAX_TARGET))
            }
            TargetChange::Seed(n) => Some(current.unwrap_or(n)),
        }
    }

    /// Whether this change, from `current`, would take the target above
    /// [`crate::engine::alloc::MAX_TARGET`] (an `Add` whose sum does; [`TargetChange::apply`]
    /// stops it there).
    pub fn overflows(self, current: Option<u32>) -> bool {
        let max = u64::from(crate::engine::alloc::MAX_TARGET);
        matches!(self, TargetChange::Add(n) if u64::from(current.unwrap_or(0)) + u64::from(n) > max)
    }
}

/// What the caller asks of this step besides the snapshot and the state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// How the target changes ([`TargetChange::Keep`] keeps the state's).
    pub target: TargetChange,
    /// Executors to delete now whatever their state, lowering the target by those that count
    /// (Spark's `killExecutors` with `adjustTargetNumExecutors = true`, SPARK-9493).
    pub remove: Vec<u64>,
    /// The ids of [`Request::remove`] to remove through the Eviction API whatever
    /// [`crate::engine::alloc::Policies::evict`] says (`remove --evict` handed to a loop
    /// started without it: issue 31 H2), when running.
    pub evict: Vec<u64>,
    /// The resource profile whose object (an ExecutorSet's `spec.removals`) a removal of
    /// [`Request::remove`] was written to, by executor id; absent: none said. A removal
    /// written to another profile's object than the executor's own is refused when either
    /// profile's target is [`TargetChange::Absolute`] (its writer lowered the object it wrote
    /// to, not the executor's profile): `docs/executorset.md`, "Resource profiles".
    pub filed: BTreeMap<u64, u32>,
    /// How the targets of resource profiles other than 0 change (profile id → change;
    /// Spark's `requestTotalExecutors` with a map of profiles). [`Request::target`] is
    /// profile 0's.
    pub profiles: BTreeMap<u32, TargetChange>,
}

impl Request {
    /// A request that sets the target to `n` and removes nothing.
    pub fn set(n: u32) -> Request {
        Request {
            target: TargetChange::Set(n),
            ..Request::default()
        }
    }

    /// A request that sets the target when `target` is given (`--target N`), else keeps it.
    pub fn target(target: Option<u32>) -> Request {
        Request {
            target: target.map_or(TargetChange::Keep, TargetChange::Set),
            ..Request::default()
        }
    }
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
    /// The driver pod has finished or is being deleted.
    DriverEnded,
    /// Deleted by an earlier step, but it appeared afterwards, live: a create that reached
    /// the API server after its delete found nothing.
    Late,
    /// Stuck in start-up longer than the grace (ErrImagePull, CrashLoopBackOff, …).
    Stuck,
    /// Ended by Kubernetes, not by the executor (`DisruptionTarget=True`, KEP-3329): replaced,
    /// not a failure.
    Disrupted,
    /// In phase Unknown longer than `--unknown-timeout`: its node is presumed lost.
    Lost,
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeleteReason::TimedOut => "timed-out",
            DeleteReason::Excess => "excess",
            DeleteReason::Failed => "failed",
            DeleteReason::Succeeded => "succeeded",
            DeleteReason::Removed => "removed",
            DeleteReason::DriverEnded => "driver-ended",
            DeleteReason::Late => "late",
            DeleteReason::Stuck => "stuck",
            DeleteReason::Disrupted => "disrupted",
            DeleteReason::Lost => "lost",
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
    /// A create sent again under the same id and name because the last one's outcome is
    /// unknown ([`crate::engine::alloc::Unacknowledged::retry`]); not a new id.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub retry: bool,
    /// The resource profile (Spark 3.1+, SPARK-33288): the pod carries label
    /// `spark-exec-resourceprofile-id` and env `SPARK_RESOURCE_PROFILE_ID` with it, and is
    /// built from that profile's template (absent in the plan JSON: 0, the default profile).
    #[serde(skip_serializing_if = "is_default_profile")]
    pub profile: u32,
}

/// Whether a profile id is the default profile's (the plan JSON then omits it).
fn is_default_profile(p: &u32) -> bool {
    *p == 0
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
    /// Through the Eviction API (`POST pods/NAME/eviction`, policy/v1 `Eviction`) instead
    /// of a plain delete, so a PodDisruptionBudget covering the pod applies: a running
    /// executor removed or scaled down under [`crate::engine::alloc::Policies::evict`]
    /// (absent in `plan` output: false).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub evict: bool,
}

impl Delete {
    /// Deletes a pod the snapshot shows, with its uid for preconditions.
    pub fn seen(pod: &ExecutorPod, reason: DeleteReason) -> Delete {
        Delete {
            executor_id: pod.id,
            pod_name: pod.name.clone(),
            reason,
            if_pending: false,
            uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
            evict: false,
        }
    }

    /// Deletes a pod the snapshot does not show (an unacknowledged request), by its
    /// deterministic name.
    pub fn unseen(executor_id: u64, pod_name: String, reason: DeleteReason) -> Delete {
        Delete {
            executor_id,
            pod_name,
            reason,
            if_pending: false,
            uid: None,
            evict: false,
        }
    }

    /// The same delete, through the Eviction API when `evict` ([`Delete::evict`]).
    pub fn evicting(self, evict: bool) -> Delete {
        Delete { evict, ..self }
    }

    /// The same delete, made only if the pod is still pending when the call is made.
    pub fn if_still_pending(self) -> Delete {
        Delete {
            if_pending: true,
            ..self
        }
    }
}

/// The executors of an app by state: the counts the step's [`Summary`] and `status` both
/// show, flattened into their JSON (these keys, in this order).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PhaseCounts {
    /// Running executors.
    pub running: u32,
    /// Pending executors.
    pub pending: u32,
    /// Executors created and not yet seen (unacknowledged requests).
    pub unacknowledged: u32,
    /// Failed executors (not yet deleted).
    pub failed: u32,
    /// Succeeded executors (not yet deleted).
    pub succeeded: u32,
    /// Executors being deleted (with a deletionTimestamp).
    pub deleting: u32,
    /// Executors in phase Unknown.
    pub unknown: u32,
}

/// Counts behind the plan, for logs and `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The target after this step (after removals).
    pub target: u32,
    /// The executors in the snapshot by state: running and pending ones not being removed;
    /// unacknowledged ones as carried into this step (after rules 1–2, before creates).
    #[serde(flatten)]
    pub counts: PhaseCounts,
    /// Pods planned for creation.
    pub created: u32,
    /// Pods planned for deletion.
    pub deleted: u32,
    /// True when running = target with nothing pending, unacknowledged or planned.
    pub converged: bool,
    /// The counts of each resource profile with a target, by profile id (profile 0 always;
    /// on the single-profile path every pod counts as profile 0's). For the homes that show
    /// a profile each (an ExecutorSet per profile); not part of the `plan` JSON.
    #[serde(skip)]
    pub profiles: BTreeMap<u32, ProfileSummary>,
}

/// One resource profile's counts after a step ([`Summary::profiles`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProfileSummary {
    /// The profile's target after this step.
    pub target: u32,
    /// Its running executors (not being removed).
    pub running: u32,
    /// Its pending executors (not being removed).
    pub pending: u32,
}

/// The step's decision: the `plan` JSON contract (`create`, `delete`, `state`) plus extras.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Pods to create, in creation order.
    pub create: Vec<Create>,
    /// With `--batch-size slow-start`: the sizes of the groups `create` is sent in (1, 2, 4,
    /// …, summing to its length); the caller stops at the first group that meets an error,
    /// throttling (429, 5xx) or a quota rejection. Empty: one group.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub create_groups: Vec<u32>,
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
    /// When the next tick is due at the latest, ms from `now`: the earliest of the creation
    /// back-off's end, the oldest unacknowledged request's creation deadline, a stuck pod's
    /// start-up grace end and the crash-loop window's end while halted (kube-runtime's
    /// `Action::requeue`). `None`: nothing is waiting on time; tick at the usual interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requeue_after_ms: Option<u64>,
    /// The driver pod has finished or is being deleted: every executor is deleted, none is
    /// created, and the caller stops (exit 7). The message names the driver's phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_ended: Option<String>,
    /// Why nothing is created although running < target (`None` when creating, or when the
    /// target is reached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<Blocked>,
    /// Removals refused because they were written to another resource profile's object than
    /// the executor's ([`Request::filed`]): executor id and why (also in `warnings`; posted
    /// as a Warning Event `RemovalRefused`).
    #[serde(skip)]
    pub refused_removals: Vec<(u64, String)>,
}

/// Why no executor is created although the target is not reached (`blocked` in the plan and
/// in `status --output json`; one log line per tick, as Spark logs it since SPARK-42261).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum Blocked {
    /// A new batch waits until nothing is pending or unacknowledged (Spark 3.0's rule; with
    /// `--max-pending`, until every request was seen and pending pods fill the target).
    Waiting {
        /// Pending pods (not being deleted as excess).
        pending: u32,
        /// Requests not yet seen.
        unacknowledged: u32,
    },
    /// Pending pods are at the `--max-pending` cap.
    MaxPending {
        /// Pending pods.
        pending: u32,
        /// The cap.
        cap: u32,
    },
    /// The driver pod is still Pending (`--driver-pod`): executors wait for it.
    DriverPending,
    /// The creation back-off is in force (refused creates or kubelet rejections:
    /// [`crate::engine::alloc::Backoff`]).
    Backoff {
        /// Time left, ms.
        remaining_ms: u64,
        /// Why: the server's or the kubelet's words.
        message: String,
    },
    /// The crash-loop guard halted creation ([`Plan::halt`] says why).
    CrashLoop,
    /// No executor id is left for this app id.
    IdsExhausted,
    /// Every slot below the target is taken by scheduling-gated pods (`spec.schedulingGates`,
    /// e.g. Kueue waiting to admit the group): they count, and wait for their gates to go.
    Gated {
        /// Scheduling-gated pods.
        pods: u32,
    },
    /// With `--count-terminating`: terminating pods still counted (as quota charges them,
    /// until `deletionTimestamp + deletionGracePeriodSeconds`) hold the app short.
    Terminating {
        /// Terminating pods that count.
        pods: u32,
        /// How long ago the oldest one's delete was asked for, ms (`None`: unknown).
        #[serde(skip_serializing_if = "Option::is_none")]
        oldest_ms: Option<u64>,
    },
    /// Pods in phase Unknown (node not reporting) hold the slots until they are lost.
    Unknown {
        /// Pods in phase Unknown.
        pods: u32,
        /// Time until the first is lost (deleted and replaced), ms.
        lost_in_ms: u64,
    },
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocked::Waiting {
                pending,
                unacknowledged,
            } => write!(
                f,
                "waiting for pending {pending}, unacknowledged {unacknowledged} before the next batch"
            ),
            Blocked::MaxPending { pending, cap } => {
                write!(f, "pending {pending} at the --max-pending cap {cap}")
            }
            Blocked::Backoff {
                remaining_ms,
                message,
            } => write!(
                f,
                "backing off for {} after refused creates ({message})",
                humantime::format_duration(std::time::Duration::from_millis(*remaining_ms))
            ),
            Blocked::CrashLoop => f.write_str("halted by the crash-loop guard"),
            Blocked::DriverPending => f.write_str("the driver pod is still pending"),
            Blocked::IdsExhausted => f.write_str("executor ids are exhausted for this app id"),
            Blocked::Gated { pods } => write!(f, "waiting for {pods} scheduling-gated pods"),
            Blocked::Terminating { pods, oldest_ms } => {
                write!(f, "waiting for {pods} terminating pods to go (--count-terminating)")?;
                match oldest_ms {
                    Some(ms) => write!(f, "; the oldest was deleted {} ago", dur(*ms)),
                    None => Ok(()),
                }
            }
            Blocked::Unknown { pods, lost_in_ms } => write!(
                f,
                "waiting for {pods} pods in phase Unknown (node not reporting); the first is \
                 lost and replaced in {}",
                dur(*lost_in_ms)
            ),
        }
    }
}

/// A duration for messages, to the second (`1m 5s`).
fn dur(ms: u64) -> humantime::FormattedDuration {
    humantime::format_duration(std::time::Duration::from_secs(ms.div_ceil(1000)))
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
