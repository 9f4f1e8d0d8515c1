//! The other half of the sans-IO loop: the shell makes the planned calls and reports what
//! happened as data ([`Outcomes`]); [`record`] folds that into the state to persist. Like
//! [`super::step`] it is pure: no I/O, no clock, no log.

use super::plan::Plan;
use super::settings::Settings;
use super::state::{AllocatorState, Backoff, BackoffCause, Counters};
use std::collections::BTreeMap;

/// What the calls of one tick did, as the shell saw them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// Executor ids whose pods were created (201, or 409 AlreadyExists for our own pod).
    pub created: Vec<u64>,
    /// Executor ids given up for good: names taken by a pod that is not ours. They are not
    /// unacknowledged and the ids stay consumed (never reused).
    pub dropped: Vec<u64>,
    /// Fresh executor ids whose pods certainly never existed: a create the API server
    /// refused (quota, 400/422, admission) and the rest of a batch that stopped before
    /// them. They are not unacknowledged, and those at the top of the id counter are given
    /// back: the next create reuses them (no pod ever had them, so "ids are never reused"
    /// still holds for every id that named a pod).
    pub returned: Vec<u64>,
    /// Executor ids whose create's outcome is unknown (5xx, a lost connection or an
    /// unreadable 2xx after the retries): they stay unacknowledged and the next step sends
    /// them again by name.
    pub ambiguous: Vec<u64>,
    /// Executor ids whose eviction ([`crate::engine::alloc::Delete::evict`]) the server
    /// refused for now: 429 TooManyRequests, a PodDisruptionBudget that allows no
    /// disruption now (or whose status its controller has not computed yet). Not deleted,
    /// not a failure: a removal's eviction is asked again next tick
    /// ([`AllocatorState::removing`]), an excess one is planned again by the next step.
    pub not_now: Vec<u64>,
    /// Pods deleted (or found already gone).
    pub deleted: u32,
    /// The executor ids of those pods, in call order (for events; not folded into the
    /// state).
    pub deleted_ids: Vec<u64>,
    /// A create was rejected by a ResourceQuota (403 "exceeded quota"): the server's message.
    pub quota: Option<String>,
    /// A create was refused for another reason that the next create would meet again (the
    /// template, an admission policy, a quota that can never admit it): the server's message
    /// as it is to be quoted.
    pub refused: Option<String>,
    /// The API server throttled or failed during the tick (429 or 5xx, retries included).
    pub throttled: bool,
    /// API error responses during the tick by HTTP status code, retries included (404 is not
    /// an error for us: an idempotent delete).
    pub api_errors: BTreeMap<u16, u64>,
    /// The tick ended with an error (then `last_success_ms` is not advanced).
    pub failed: bool,
}

/// Folds the tick's outcomes into the state to persist, from the plan's state:
/// - dropped and returned ids stop being unacknowledged; ambiguous ones are marked to be sent
///   again; returned ids at the top of the counter are given back ([`Outcomes::returned`]);
/// - a refused create (quota or other) sets the creation back-off ([`Backoff`]: max(batch
///   delay, 10 s), doubling per refusal, at most 6 minutes); a successful create clears one
///   set by refused creates, as Kubernetes' controllers back off a failing sync and reset on
///   success;
/// - adaptive batches learn whether the tick was throttled (the next step halves the batch);
/// - the totals for metrics (created, deleted, API errors by code, last success at `now_ms`).
pub fn record(plan: &Plan, out: &Outcomes, settings: &Settings, now_ms: u64) -> AllocatorState {
    let mut state = plan.state.clone();
    state.unacknowledged.retain(|u| {
        !out.dropped.contains(&u.executor_id) && !out.returned.contains(&u.executor_id)
    });
    while state.last_executor_id > 0 && out.returned.contains(&state.last_executor_id) {
        state.last_executor_id -= 1;
    }
    // A planned delete that did not happen (refused: the pod turned running, or changed) is
    // not "deleted": only what the calls did stays in Spark's `deletedExecutorIds`.
    let skipped: Vec<u64> = (plan.delete.iter())
        .map(|d| d.executor_id)
        .filter(|id| !out.deleted_ids.contains(id))
        .collect();
    state.deleted.retain(|id| !skipped.contains(id));
    // A removal is done once its pod is deleted or evicted (or found gone); one a disruption
    // budget put off, or whose call failed, is asked again next tick without lowering the
    // target again (docs/faults.md: a failing call leaves the state as if not acted).
    state.removing.retain(|id| !out.deleted_ids.contains(id));
    let removing = state.removing.clone();
    state.removing_evict.retain(|id| removing.contains(id));
    for u in &mut state.unacknowledged {
        if out.ambiguous.contains(&u.executor_id) {
            u.retry = true;
        } else if out.created.contains(&u.executor_id) {
            u.retry = false;
        }
    }
    // Which creates were answered, for a successor (`AllocatorState::inherited`).
    state.answered = (state.unacknowledged.iter())
        .map(|u| u.executor_id)
        .filter(|id| out.created.contains(id) || plan.state.answered.contains(id))
        .collect();
    state.create_backoff = next_backoff(plan, out, settings, now_ms);
    if let Some(a) = state.adaptive.as_mut() {
        a.throttled = out.quota.is_some() || out.throttled;
    }
    state.counters.created += out.created.len() as u64;
    state.counters.deleted += out.deleted as u64;
    state.counters.add_api_errors(&out.api_errors);
    if !out.failed {
        state.counters.last_success_ms = Some(now_ms);
    }
    state
}

/// The creation back-off after the calls: set or doubled by a refused create, cleared by a
/// successful one (but for a back-off of kubelet rejections: the step ends it once a later
/// executor runs), else as the step left it.
fn next_backoff(plan: &Plan, out: &Outcomes, settings: &Settings, now_ms: u64) -> Option<Backoff> {
    let prev = plan.state.create_backoff.as_ref();
    let refusal = (out.refused.as_ref().map(|r| (r, BackoffCause::Refused)))
        .or(out.quota.as_ref().map(|q| (q, BackoffCause::Quota)));
    match refusal {
        Some((reason, cause)) => Some(Backoff {
            template: (cause == BackoffCause::Refused)
                .then(|| settings.template_fingerprint.clone())
                .flatten(),
            ..Backoff::after_rejection(prev, settings.batch_delay_ms, now_ms, reason.clone())
                .because(cause)
        }),
        None if !out.created.is_empty()
            && prev.is_some_and(|b| b.cause != BackoffCause::Rejected) =>
        {
            None
        }
        None => prev.cloned(),
    }
}

impl Counters {
    /// Adds API error responses by HTTP code (404 excluded: not an error for us). True when
    /// anything was added.
    pub fn add_api_errors(&mut self, by_code: &BTreeMap<u16, u64>) -> bool {
        let mut added = false;
        for (&code, &n) in by_code {
            if n > 0 && code != 404 {
                *self.api_errors.entry(code.to_string()).or_insert(0) += n;
                added = true;
            }
        }
        added
    }
}

/// When the next tick of a loop is due, ms from now: while something is in flight (`busy`:
/// not converged — unacknowledged creates, pending pods, a batch to make, a back-off — or
/// steering requests waiting), the fast interval `fast_ms`, else the idle interval
/// `idle_ms` (Spark's `spark.kubernetes.executor.apiPollingInterval`, 30 s by default); and
/// never later than `requeue_after_ms` ([`requeue_after_ms`]: when time alone changes what
/// the step decides). Pure.
pub fn next_tick_ms(requeue_after_ms: Option<u64>, busy: bool, fast_ms: u64, idle_ms: u64) -> u64 {
    let every = if busy { fast_ms } else { idle_ms.max(fast_ms) };
    requeue_after_ms.map_or(every, |due| due.min(every))
}

/// When time alone next changes what a step decides, ms from `now_ms` (`None`: nothing waits
/// on time): the earliest of an unacknowledged request's creation deadline, the end of the
/// creation back-off, a stuck pod's start-up grace, an Unknown pod's timeout and, while the crash-loop guard halts
/// creation, the oldest failure leaving the window (kube-runtime's `Action::requeue`). Read
/// from the state a step or [`record`] leaves, so a back-off set by this tick's calls counts.
pub fn requeue_after_ms(state: &AllocatorState, settings: &Settings, now_ms: u64) -> Option<u64> {
    let timeout = settings.creation_timeout();
    let pol = &settings.policies;
    let deadlines = (state.unacknowledged.iter()).map(|u| u.created_ms.saturating_add(timeout) + 1);
    let backoff = state.create_backoff.iter().map(|b| b.until_ms);
    let stuck = (state.stuck.iter())
        .filter_map(|r| Some(r.since_ms.saturating_add(pol.startup_grace_ms?) + 1));
    let lost = (state.unknown.iter())
        .map(|r| r.since_ms.saturating_add(settings.unknown_timeout()) + 1)
        .min();
    let halted = (pol.max_failures.limit(state.target.unwrap_or(0)))
        .is_some_and(|max| state.failures.len() as u64 > max as u64);
    let halt_ends = (state.failures.iter())
        .filter(|_| halted)
        .map(|f| f.at_ms.saturating_add(pol.failure_window_ms) + 1)
        .min();
    (deadlines
        .chain(backoff)
        .chain(stuck)
        .chain(lost)
        .chain(halt_ends))
    .filter(|&t| t > now_ms)
    .min()
    .map(|t| t - now_ms)
}
