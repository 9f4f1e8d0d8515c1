//! What persists between ticks: the state file's schema (`state` in `plan` output), the
//! creation back-off and the totals the shell keeps for metrics.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The state file / `plan --state` format version this build reads and writes.
pub const STATE_VERSION: u32 = 1;

/// One executor we asked for and have not seen in any snapshot yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unacknowledged {
    /// The executor id.
    pub executor_id: u64,
    /// When the create was planned, ms since the Unix epoch.
    pub created_ms: u64,
    /// The create call's outcome is unknown (5xx or a lost connection after the retries, or a
    /// 2xx whose body did not parse): the next step sends it again under the same name, where
    /// 409 AlreadyExists for our own pod counts as created, instead of waiting for the
    /// creation timeout (absent: false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retry: bool,
    /// The resource profile the executor was created for (Spark's `newlyCreatedExecutors`
    /// keep it too; absent: 0, the default profile).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub profile: u32,
}

/// Whether a profile id is the default profile (then the state file omits it).
fn is_zero(p: &u32) -> bool {
    *p == 0
}

/// What persists between ticks (the state file, and `state` in `plan` output).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorState {
    /// Format version; [`STATE_VERSION`].
    pub version: u32,
    /// Total expected executors; `None` until a target is first given.
    #[serde(default)]
    pub target: Option<u32>,
    /// The targets of the resource profiles other than the default one (Spark 3.1+'s
    /// stage-level scheduling, SPARK-33288), profile id → target; profile 0's is `target`.
    /// Absent: profile 0 only, as every state written before profiles existed reads.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub profile_targets: BTreeMap<u32, u32>,
    /// The highest executor id ever handed out, over every profile: one id counter per app
    /// (0: none yet).
    #[serde(default)]
    pub last_executor_id: u64,
    /// Created by us, not yet seen; ordered by id.
    #[serde(default)]
    pub unacknowledged: Vec<Unacknowledged>,
    /// The unacknowledged ids whose create the API server answered (201, or 409 for our own
    /// pod), as recorded after the calls; a successor ([`AllocatorState::inherited`]) does
    /// not send those again, and the next step, whoever runs it, takes one its list does not
    /// show as deleted before any list saw it (replaced at once, rule `forget_vanished`).
    /// Absent: none (or a write-ahead save, before any answer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answered: Vec<u64>,
    /// Ids we deleted that the last snapshot still showed (Spark's `deletedExecutorIds`);
    /// informational, pruned as the pods disappear.
    #[serde(default)]
    pub deleted: Vec<u64>,
    /// Requests deleted before any snapshot showed them (excess, removed), with the time of
    /// the request, kept until the creation timeout has passed since it: a create that
    /// reaches the API server after its own delete (which found nothing) is deleted when it
    /// shows up (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_unseen: Vec<Unacknowledged>,
    /// Removals in progress: executors removed on request (`remove`) whose delete or
    /// eviction is in flight, failed (5xx or a lost connection after the retries, 403, any
    /// error but 404, which is gone) or was put off by a PodDisruptionBudget (`--evict`; 429,
    /// "not now"). Each step asks again, without lowering the target again (the removal
    /// lowered it once), while the pod is live; a request naming one again is not a second
    /// removal. They no longer count toward the target. Written `evicting` before removals
    /// whose delete failed were kept too; read under either name (absent: none).
    #[serde(default, alias = "evicting", skip_serializing_if = "Vec::is_empty")]
    pub removing: Vec<u64>,
    /// The removals in progress ([`AllocatorState::removing`]) that asked for the Eviction
    /// API (`remove --evict`): asked again through it whatever the flags of the tick that
    /// asks (absent: none; the others follow the tick's `--evict`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removing_evict: Vec<u64>,
    /// Creation back-off after refused creates or kubelet rejections (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_backoff: Option<Backoff>,
    /// Running totals for metrics (absent: all zero). Not used by the step; carried through.
    #[serde(default, skip_serializing_if = "Counters::is_zero")]
    pub counters: Counters,
    /// Executor failures inside the crash-loop guard's window (only with `max_failures`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailureRecord>,
    /// Pods seen stuck in a [`crate::engine::alloc::STUCK_REASONS`] state, since when (only with `startup_grace`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<StuckRecord>,
    /// Pods seen in phase Unknown, since when (`reason` is `Unknown`): lost, deleted and
    /// replaced once Unknown longer than [`crate::engine::alloc::Settings::unknown_timeout`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown: Vec<StuckRecord>,
    /// Adaptive batch state (only with `--batch-size auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveState>,
    /// The cluster, namespace and app this state belongs to: set by the shell when it saves,
    /// checked when it loads (a state of another cluster is never reused). Absent in files
    /// written before these fields existed, and in `plan --state` input. Not used by the step;
    /// carried through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<StateOwner>,
    /// Ids of steering requests ([`crate::engine::alloc::Steering`]) this state already reflects
    /// whose records may still be in the store's queue (absent: none). Saved in the same
    /// atomic write as the target and removals they caused, so a request is applied exactly
    /// once even when the process dies before its record is removed; pruned by the shell once
    /// the record is gone. Not used by the step; carried through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_requests: Vec<String>,
}

/// Which cluster, namespace and app a state belongs to ([`AllocatorState::owner`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateOwner {
    /// The API server URL as resolved (`https://host:port`, no trailing slash).
    pub server: String,
    /// The namespace of the executor pods.
    pub namespace: String,
    /// The application id (`spark-app-selector`).
    pub app_id: String,
}

/// One executor failure counted by the crash-loop guard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    /// The executor id.
    pub executor_id: u64,
    /// When the failure was first seen, ms since the Unix epoch.
    pub at_ms: u64,
    /// Why (see [`crate::engine::snapshot::ExecutorPod::reason`]).
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
    /// The highest executor id seen Unschedulable so far (0: none). A pod that stays
    /// Unschedulable over many ticks is one shrink signal, not one per tick: only a pod above
    /// this id halves the batch, and pods at or below it no longer hold back growth.
    #[serde(default)]
    pub unschedulable_seen: u64,
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

/// No creates before `until_ms`: set when creates keep failing for a reason another create
/// at once would meet again — the API server refused a create (a ResourceQuota's "exceeded
/// quota", a template it cannot decode or validate, an admission refusal: Pod Security, a
/// webhook, a ValidatingAdmissionPolicy) or a kubelet rejected a pod at admission
/// (`OutOfcpu`, `NodeAffinity`, …). As the Job controller backs off the replacement of
/// failed pods (`pkg/controller/job`, "Pod backoff failure policy": 10 s, 20 s, 40 s …
/// capped at six minutes), the delay starts at max(batch delay, [`MIN_BACKOFF_MS`]) and
/// doubles on each further refusal up to [`MAX_BACKOFF_MS`]. A successful create clears a
/// back-off set by refused creates; one set by kubelet rejections is cleared once a later
/// executor runs (a create that succeeds says nothing about the kubelet's admission).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// No creates before this time, ms since the Unix epoch.
    pub until_ms: u64,
    /// The delay that set `until_ms`, ms; the next refusal doubles it.
    pub delay_ms: u64,
    /// Why: the server's (or the kubelet's) words, for `status`, the Event and the log.
    pub reason: String,
    /// What set it (absent in states written before it existed: a quota rejection).
    #[serde(default, skip_serializing_if = "BackoffCause::is_quota")]
    pub cause: BackoffCause,
    /// Refusals in a row that made this back-off (absent: 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub refusals: u32,
    /// For [`BackoffCause::Rejected`]: the id counter when the last rejection was seen; a
    /// Running executor above it (created since) ends the back-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor_id: Option<u64>,
    /// For [`BackoffCause::Refused`]: the fingerprint of the template the server refused
    /// ([`crate::engine::alloc::Settings::template_fingerprint`]); a step with another
    /// template ends the back-off (the fix is tried at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// What set a [`Backoff`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackoffCause {
    /// A ResourceQuota refused a create (403 "exceeded quota"): wait for room.
    #[default]
    Quota,
    /// The API server refused a create: 400/422 (the pod template), an admission refusal
    /// (Pod Security, a webhook, a ValidatingAdmissionPolicy) or a quota that can never
    /// admit the template.
    Refused,
    /// The kubelet rejected a pod at admission (phase Failed with reason `OutOfcpu`,
    /// `OutOfmemory`, `NodeAffinity`, …).
    Rejected,
}

impl BackoffCause {
    /// True for [`BackoffCause::Quota`] (then the state file omits the field).
    pub fn is_quota(&self) -> bool {
        *self == BackoffCause::Quota
    }

    /// The cause's name (`quota`, `refused`, `rejected`), as `status` and the metric label
    /// show it.
    pub fn as_str(&self) -> &'static str {
        match self {
            BackoffCause::Quota => "quota",
            BackoffCause::Refused => "refused",
            BackoffCause::Rejected => "rejected",
        }
    }
}

/// First creation back-off, ms (10 s, the Job controller's `DefaultJobPodFailureBackOff`).
pub const MIN_BACKOFF_MS: u64 = 10_000;
/// Longest creation back-off, ms (6 minutes, the cap the Job controller documents for pod
/// failures). A state that asks for more is clamped when a step reads it.
pub const MAX_BACKOFF_MS: u64 = 360_000;

impl Backoff {
    /// The back-off after a refusal at `now_ms`, following `previous` (doubling, capped):
    /// max(batch delay, [`MIN_BACKOFF_MS`]), then ×2 per refusal, at most [`MAX_BACKOFF_MS`].
    pub fn after_rejection(
        previous: Option<&Backoff>,
        batch_delay_ms: u64,
        now_ms: u64,
        reason: String,
    ) -> Backoff {
        let first = batch_delay_ms.max(MIN_BACKOFF_MS);
        // The previous delay as stored may be anything a hand edit left (0 would double to 0
        // for ever): never below the first delay.
        let delay_ms = match previous {
            Some(b) => b.delay_ms.saturating_mul(2).max(first),
            None => first,
        }
        .min(MAX_BACKOFF_MS);
        Backoff {
            until_ms: now_ms.saturating_add(delay_ms),
            delay_ms,
            reason,
            cause: BackoffCause::Quota,
            refusals: previous.map_or(1, |b| b.refusals.saturating_add(1)),
            executor_id: None,
            template: None,
        }
    }

    /// Whether this back-off was set by refusals of a template other than `current`, the
    /// fingerprint of the template in use (then it no longer applies: the changed template
    /// is tried at once). A back-off without a recorded template applies to any.
    pub fn is_for_another_template(&self, current: Option<&str>) -> bool {
        self.cause == BackoffCause::Refused
            && self.template.is_some()
            && self.template.as_deref() != current
    }

    /// This back-off with its cause set.
    pub fn because(mut self, cause: BackoffCause) -> Backoff {
        self.cause = cause;
        self
    }

    /// Within the documented cap as seen at `now_ms`: a delay above [`MAX_BACKOFF_MS`] is
    /// cut to it, and an end further than the cap from `now_ms` (a state written by hand,
    /// by another tool or under a clock that jumped) is moved to `now_ms` + the cap, so a
    /// stored back-off never stalls creation for longer than documented.
    pub fn clamped(mut self, now_ms: u64) -> Backoff {
        self.delay_ms = self.delay_ms.min(MAX_BACKOFF_MS);
        self.until_ms = self.until_ms.min(now_ms.saturating_add(MAX_BACKOFF_MS));
        self
    }
}

impl AllocatorState {
    /// The state as a process that did not write it must read it (a successor after a
    /// kill -9 or a leader handover): the outcome of every unacknowledged create is unknown
    /// to it, since the writer may have stopped anywhere between its write-ahead save and
    /// its calls. So each not [`AllocatorState::answered`] is marked
    /// [`Unacknowledged::retry`]: the step sends those still unseen again by name (rule
    /// `retry_ambiguous`, where 409 for our own pod counts as created) instead of waiting
    /// for the creation timeout, as Kubernetes' controllers settle an unknown create by
    /// name. Pods already listed are acknowledged first, so nothing is created twice and
    /// nothing counts twice toward the target; an answered create that the successor's list
    /// does not show (the pod deleted before any list) is gone, and replaced at once under a
    /// new id (the step's rule `forget_vanished`).
    pub fn inherited(mut self) -> AllocatorState {
        for u in &mut self.unacknowledged {
            if !self.answered.contains(&u.executor_id) {
                u.retry = true;
            }
        }
        self
    }

    /// A fresh state: no target, no ids handed out.
    pub fn new() -> AllocatorState {
        AllocatorState {
            version: STATE_VERSION,
            ..AllocatorState::default()
        }
    }

    /// The highest executor id the state names anywhere (the counter, requests, deleted ids,
    /// failure, stuck and Unknown records): new ids start above it, so an inconsistent state
    /// (a deleted id above the counter, written by hand or by another tool) never hands an
    /// id out again.
    pub fn highest_id(&self) -> u64 {
        let requests = (self.unacknowledged.iter()).chain(self.deleted_unseen.iter());
        let records = (self.stuck.iter()).chain(self.unknown.iter());
        (requests.map(|u| u.executor_id))
            .chain(self.deleted.iter().copied())
            .chain(self.removing.iter().copied())
            .chain(self.failures.iter().map(|f| f.executor_id))
            .chain(records.map(|r| r.executor_id))
            .fold(self.last_executor_id, u64::max)
    }

    /// The target of every resource profile that has one, by profile id: profile 0's
    /// ([`AllocatorState::target`]) first, then [`AllocatorState::profile_targets`].
    pub fn targets(&self) -> BTreeMap<u32, u32> {
        let mut all = self.profile_targets.clone();
        if let Some(t) = self.target {
            all.insert(0, t);
        }
        all
    }

    /// Profile ids are Spark's non-negative `Int`s; profile targets are at most
    /// [`crate::engine::alloc::MAX_TARGET`]; profile 0's target lives in `target`.
    fn validate_profiles(&self) -> Result<(), String> {
        for (&p, &t) in &self.profile_targets {
            if p == 0 || p > i32::MAX as u32 {
                return Err(format!(
                    "profile_targets names profile {p}: profiles are 1..={} (profile 0's \
                     target is `target`)",
                    i32::MAX
                ));
            }
            if t > super::MAX_TARGET {
                return Err(format!(
                    "profile {p}'s target {t} is above the largest target {}",
                    super::MAX_TARGET
                ));
            }
        }
        Ok(())
    }

    /// Checks a loaded state: known version, ids consistent, the documented limits (a target
    /// of at most [`crate::engine::alloc::MAX_TARGET`]; every executor id, the counter included, in
    /// `1 ..= MAX_EXECUTOR_ID`, Spark's positive longs). Errors: one line naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(t) = self.target.filter(|&t| t > super::MAX_TARGET) {
            return Err(format!(
                "target {t} is above the largest target {}",
                super::MAX_TARGET
            ));
        }
        self.validate_profiles()?;
        let max = crate::engine::snapshot::MAX_EXECUTOR_ID;
        let ids = (self.deleted.iter().map(|&id| ("deleted", id)))
            .chain(
                self.deleted_unseen
                    .iter()
                    .map(|u| ("deleted_unseen", u.executor_id)),
            )
            .chain(self.removing.iter().map(|&id| ("removing", id)))
            .chain(self.failures.iter().map(|f| ("failures", f.executor_id)))
            .chain(self.stuck.iter().map(|r| ("stuck", r.executor_id)))
            .chain(self.unknown.iter().map(|r| ("unknown", r.executor_id)));
        for (field, id) in ids {
            if !(1..=max).contains(&id) {
                return Err(format!(
                    "{field} executor id {id} is outside 1..={max} (Spark's ids are positive longs)"
                ));
            }
        }
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
