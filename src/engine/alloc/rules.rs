//! The rules of one step, as methods on a small working set ([`Step`]), in the order
//! [`super::step`] runs them. Each method is one rule; its doc line names the rule and where it
//! comes from.

use super::adaptive::AdaptiveBatch;
use super::guard::CrashLoopGuard;
use super::plan::{Blocked, Create, Delete, DeleteReason, Plan, Request, StepError, Summary};
use super::record::requeue_after_ms;
use super::settings::{is_kubelet_rejection, Settings, STUCK_REASONS};
use super::state::{
    AllocatorState, Backoff, BackoffCause, StuckRecord, Unacknowledged, STATE_VERSION,
};
use crate::engine::podspec::pod_name;
use crate::engine::snapshot::{DriverState, ExecutorPod, ExecutorState, Snapshot, MAX_EXECUTOR_ID};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

/// What every rule reads and writes: the inputs, the target, the id counter, the requests
/// still unacknowledged (id → created ms) and the plan being built.
pub(super) struct Step<'a> {
    snap: &'a Snapshot,
    prev: &'a AllocatorState,
    cfg: &'a Settings,
    now_ms: u64,
    target: u32,
    last_id: u64,
    unack: BTreeMap<u64, u64>,
    /// Unacknowledged ids whose create's outcome is unknown: sent again by name.
    retry: BTreeSet<u64>,
    removed: BTreeSet<u64>,
    delete: Vec<Delete>,
    create: Vec<Create>,
    warnings: Vec<String>,
    /// Executors that failed in this snapshot (terminated or stuck): id, reason.
    newly_failed: Vec<(u64, String)>,
    /// The creation back-off in force (the state's, clamped to the documented cap, or set
    /// by this snapshot's kubelet rejections).
    backoff: Option<Backoff>,
}

/// The executors that count toward the target, as the rules narrow them down, and the counts
/// of those that do not.
pub(super) struct Census<'a> {
    running: Vec<&'a ExecutorPod>,
    pending: Vec<&'a ExecutorPod>,
    /// Pods in phase Unknown not yet lost: they count toward the target.
    unknown: Vec<&'a ExecutorPod>,
    /// Terminating pods (`deletionTimestamp` set), whether they count or not.
    terminating: Vec<&'a ExecutorPod>,
    summary: Summary,
    stuck: Vec<StuckRecord>,
    /// Since when each pod in `unknown` has been Unknown.
    unknown_since: Vec<StuckRecord>,
    /// Pods lost (deleted from phase Unknown) in this step: with `--count-terminating` they
    /// count as the terminating pods they are about to be.
    lost: u32,
    /// Pending pods deleted as excess in this step.
    excess_pending: u32,
}

impl<'a> Step<'a> {
    /// Starts a step: the target after the request's change, and the id counter at
    /// max(persisted counter, every id the state names, highest id in the cluster), so ids
    /// survive a lost state and an inconsistent one.
    pub(super) fn begin(
        snap: &'a Snapshot,
        prev: &'a AllocatorState,
        cfg: &'a Settings,
        req: &Request,
        now_ms: u64,
    ) -> Result<Step<'a>, StepError> {
        Ok(Step {
            snap,
            prev,
            cfg,
            now_ms,
            target: req.target.apply(prev.target).ok_or(StepError::NoTarget)?,
            last_id: prev.highest_id().max(snap.max_id()),
            unack: prev
                .unacknowledged
                .iter()
                .map(|u| (u.executor_id, u.created_ms))
                .collect(),
            retry: (prev.unacknowledged.iter())
                .filter(|u| u.retry)
                .map(|u| u.executor_id)
                .collect(),
            removed: BTreeSet::new(),
            delete: Vec::new(),
            create: Vec::new(),
            warnings: snap.warnings.clone(),
            newly_failed: Vec::new(),
            backoff: (prev.create_backoff.clone())
                .map(|b| b.clamped(now_ms))
                .filter(|b| !b.is_for_another_template(cfg.template_fingerprint.as_deref())),
        })
    }

    fn name(&self, id: u64) -> String {
        pod_name(&self.cfg.name_prefix, id)
    }

    /// Rule 1 (Spark: `newlyCreatedExecutors` seen in a snapshot): an unacknowledged id that
    /// appears in the snapshot, in any state, is acknowledged.
    pub(super) fn acknowledge_seen(&mut self) {
        let seen = &self.snap.executors;
        self.unack.retain(|id, _| !seen.contains_key(id));
    }

    /// Rule 3 (the driver's lifecycle, `--driver-pod`): a driver that has finished or is being
    /// deleted ends the app; why, naming the phase.
    pub(super) fn driver_ended(&self) -> Option<String> {
        match self.snap.driver.as_ref()? {
            DriverState::Finished(phase) => Some(format!("has finished ({phase})")),
            DriverState::Deleting => Some("is being deleted".to_string()),
            DriverState::Gone => Some("is gone (deleted)".to_string()),
            DriverState::Pending | DriverState::Running => None,
        }
    }

    /// When the driver has ended: every executor pod is deleted (reason `driver-ended`), every
    /// request forgotten, nothing created — the app is over, so its executors would run for
    /// nothing until the garbage collector removes them with the driver object.
    pub(super) fn wind_down(mut self, why: String) -> Plan {
        let snap = self.snap;
        for p in snap.executors.values() {
            if p.state != ExecutorState::Deleted {
                self.delete.push(Delete::seen(p, DeleteReason::DriverEnded));
            }
        }
        for id in std::mem::take(&mut self.unack).into_keys() {
            let d = Delete::unseen(id, self.name(id), DeleteReason::DriverEnded);
            self.delete.push(d);
        }
        self.retry.clear();
        let mut c = self.census();
        c.running.clear();
        c.pending.clear();
        let guard = CrashLoopGuard::observe(
            self.prev,
            &self.cfg.policies,
            self.target,
            vec![],
            self.now_ms,
        );
        let batch = CreateBatch {
            backing_off: false,
            blocked: None,
            adaptive: self.prev.adaptive.clone(),
        };
        let mut plan = self.finish(c, guard, batch);
        plan.delete
            .retain(|d| d.reason == DeleteReason::DriverEnded);
        plan.summary.deleted = plan.delete.len() as u32;
        plan.summary.converged = false;
        plan.driver_ended = Some(why);
        plan
    }

    /// Rule 2 (Spark's `podCreationTimeout`): a request unseen for longer than the creation
    /// timeout is deleted (it may exist unseen) and forgotten, so it gets replaced.
    pub(super) fn time_out_unseen(&mut self) {
        let timeout = self.cfg.creation_timeout();
        let now = self.now_ms;
        let late: Vec<u64> = self
            .unack
            .iter()
            .filter(|(_, &t)| now.saturating_sub(t) > timeout)
            .map(|(&id, _)| id)
            .collect();
        for id in late {
            self.unack.remove(&id);
            let d = Delete::unseen(id, self.name(id), DeleteReason::TimedOut);
            self.delete.push(d);
        }
    }

    /// Rule 6 (Spark's `killExecutors`, SPARK-9493): named executors are deleted whatever their
    /// state; with `lowers`, each that counts (running, pending, unknown, unacknowledged) lowers
    /// the target (not when the request's target already accounts for them:
    /// [`super::TargetChange::Absolute`]).
    pub(super) fn remove_requested(&mut self, ids: &[u64], lowers: bool) {
        for &id in ids {
            if !self.removed.insert(id) {
                continue;
            }
            let (delete, counts) = match self.snap.executors.get(&id) {
                Some(p) if p.state == ExecutorState::Deleted => {
                    self.warnings
                        .push(format!("executor {id} is already being deleted"));
                    continue;
                }
                Some(p) => (
                    Delete::seen(p, DeleteReason::Removed),
                    !matches!(p.state, ExecutorState::Failed | ExecutorState::Succeeded),
                ),
                None if self.unack.remove(&id).is_some() => (
                    Delete::unseen(id, self.name(id), DeleteReason::Removed),
                    true,
                ),
                None => {
                    self.warnings
                        .push(format!("executor {id} does not exist: nothing to remove"));
                    continue;
                }
            };
            if counts && lowers {
                self.target = self.target.saturating_sub(1);
            }
            self.delete.push(delete);
        }
    }

    /// Rule 5 (Spark: `deleteOnTermination`): sorts the snapshot's executors (removed ones no
    /// longer count); failed and succeeded pods are deleted, so rule 4 replaces them.
    pub(super) fn census(&mut self) -> Census<'a> {
        let mut c = Census {
            running: Vec::new(),
            pending: Vec::new(),
            unknown: Vec::new(),
            terminating: Vec::new(),
            summary: Summary::default(),
            stuck: Vec::new(),
            unknown_since: Vec::new(),
            lost: 0,
            excess_pending: 0,
        };
        c.summary.unacknowledged = self.unack.len() as u32;
        let snap = self.snap;
        for p in snap.executors.values() {
            if self.removed.contains(&p.id) {
                continue;
            }
            // Deleted by an earlier step, yet live and not terminating: a create that reached
            // the API server after its delete (the delete found nothing). It goes again.
            let live = matches!(p.state, ExecutorState::Running | ExecutorState::Pending);
            let gone_before = self.prev.deleted.contains(&p.id)
                || (self.prev.deleted_unseen.iter()).any(|u| u.executor_id == p.id);
            if live && gone_before {
                self.delete.push(Delete::seen(p, DeleteReason::Late));
                continue;
            }
            match p.state {
                ExecutorState::Running => c.running.push(p),
                ExecutorState::Pending => c.pending.push(p),
                ExecutorState::Failed if p.disruption.is_some() => {
                    c.summary.failed += 1;
                    self.disrupted(p);
                }
                ExecutorState::Failed => {
                    c.summary.failed += 1;
                    let reason = p.reason.clone().unwrap_or_else(|| "failed".into());
                    self.newly_failed.push((p.id, reason));
                    self.delete_terminated(p, DeleteReason::Failed);
                }
                ExecutorState::Succeeded => {
                    c.summary.succeeded += 1;
                    self.delete_terminated(p, DeleteReason::Succeeded);
                }
                ExecutorState::Deleted => {
                    c.summary.deleting += 1;
                    c.terminating.push(p);
                }
                ExecutorState::Unknown => {
                    c.summary.unknown += 1;
                    c.unknown.push(p);
                }
            }
        }
        c
    }

    /// Disruptions are not crashes (KEP-3329's `DisruptionTarget`, as a Job's
    /// `podFailurePolicy` `Ignore` rule treats them): a pod Kubernetes ended (preemption,
    /// eviction, taint eviction, node shutdown, pod GC) is deleted and replaced like a failed
    /// one (reason `disrupted`), but never counted by the crash-loop guard; a warning names
    /// the disruption.
    fn disrupted(&mut self, p: &ExecutorPod) {
        let why = p.disruption.as_deref().unwrap_or("DisruptionTarget");
        self.warnings.push(format!(
            "executor {} (pod {}) was ended by Kubernetes, not by the executor ({why}): \
             replaced, not counted as a failure",
            p.id, p.name
        ));
        self.delete_terminated(p, DeleteReason::Disrupted);
    }

    /// Phase Unknown (the node stopped reporting): the pod counts toward the target, as the
    /// ReplicaSet controller's `IsPodActive` counts it, until it has been Unknown longer than
    /// `--unknown-timeout` (default 5 min, the default `tolerationSeconds` for
    /// `node.kubernetes.io/unreachable`). Then it is lost: deleted once (reason `lost`), no
    /// longer counted (with `--count-terminating` it counts as a terminating pod until its
    /// deletion deadline passes), replaced, and not a failure for the crash-loop guard.
    pub(super) fn delete_lost(&mut self, c: &mut Census<'a>) {
        let timeout = self.cfg.unknown_timeout();
        let since: BTreeMap<u64, u64> = (self.prev.unknown.iter())
            .map(|r| (r.executor_id, r.since_ms))
            .collect();
        let now = self.now_ms;
        let mut kept = Vec::new();
        for p in std::mem::take(&mut c.unknown) {
            let since_ms = since.get(&p.id).copied().unwrap_or(now);
            if now.saturating_sub(since_ms) > timeout {
                self.warnings.push(format!(
                    "executor {} (pod {}) has been in phase Unknown for more than {}: lost, \
                     deleted and replaced",
                    p.id,
                    p.name,
                    humantime::format_duration(std::time::Duration::from_millis(timeout))
                ));
                self.delete.push(Delete::seen(p, DeleteReason::Lost));
                c.lost += 1;
                continue;
            }
            c.unknown_since.push(StuckRecord {
                executor_id: p.id,
                since_ms,
                reason: "Unknown".into(),
            });
            kept.push(p);
        }
        c.unknown = kept;
    }

    fn delete_terminated(&mut self, p: &ExecutorPod, reason: DeleteReason) {
        if self.cfg.delete_terminated {
            self.delete.push(Delete::seen(p, reason));
        }
    }

    /// Opt-in `--startup-grace`: a pod waiting in a [`STUCK_REASONS`] state for longer than the
    /// grace is a failure, deleted once (reason `stuck`); younger ones are remembered.
    pub(super) fn delete_stuck(&mut self, c: &mut Census<'a>) {
        let Some(grace) = self.cfg.policies.startup_grace_ms else {
            return;
        };
        let since: BTreeMap<u64, u64> = self
            .prev
            .stuck
            .iter()
            .map(|r| (r.executor_id, r.since_ms))
            .collect();
        let mut stuck_ids: BTreeSet<u64> = BTreeSet::new();
        for p in c.running.iter().chain(c.pending.iter()) {
            let Some(reason) = p.waiting_in(STUCK_REASONS) else {
                continue;
            };
            let since_ms = since.get(&p.id).copied().unwrap_or(self.now_ms);
            if self.now_ms.saturating_sub(since_ms) > grace {
                stuck_ids.insert(p.id);
                self.newly_failed.push((p.id, reason.to_string()));
                self.delete.push(Delete::seen(p, DeleteReason::Stuck));
            } else {
                let executor_id = p.id;
                let reason = reason.to_string();
                c.stuck.push(StuckRecord {
                    executor_id,
                    since_ms,
                    reason,
                });
            }
        }
        c.running.retain(|p| !stuck_ids.contains(&p.id));
        c.pending.retain(|p| !stuck_ids.contains(&p.id));
    }

    /// Opt-in `--max-failures` (Spark's `spark.executor.maxNumFailures` idea): records this
    /// snapshot's failures in the window and says whether creation halts.
    pub(super) fn crash_loop_guard(&mut self) -> CrashLoopGuard {
        let failed = std::mem::take(&mut self.newly_failed);
        self.back_off_rejections(&failed);
        CrashLoopGuard::observe(
            self.prev,
            &self.cfg.policies,
            self.target,
            failed,
            self.now_ms,
        )
    }

    /// Kubelet rejections back off (the Job controller's pod failure back-off): a pod the
    /// kubelet refused at admission (`OutOfcpu`, `NodeAffinity`, …), newly failed in this
    /// snapshot, sets or doubles the creation back-off, so its replacement does not meet the
    /// same node at once; an executor created after it began (an id above the counter of
    /// then) that runs ends such a back-off.
    fn back_off_rejections(&mut self, failed: &[(u64, String)]) {
        let seen = |id: &u64| self.prev.failures.iter().any(|f| f.executor_id == *id);
        let rejected: Vec<&(u64, String)> = (failed.iter())
            .filter(|(id, reason)| is_kubelet_rejection(reason) && !seen(id))
            .collect();
        if let Some(&&(id, ref reason)) = rejected.iter().max_by_key(|(id, _)| *id) {
            let why = format!(
                "the kubelet rejected executor {id} (pod {}): {reason}{}",
                self.name(id),
                match rejected.len() {
                    1 => String::new(),
                    n => format!(" ({n} pods rejected)"),
                }
            );
            let b = Backoff::after_rejection(
                self.backoff.as_ref(),
                self.cfg.batch_delay_ms,
                self.now_ms,
                why,
            );
            // Executors created from now on are above the counter: one that runs ends it.
            let top = (self.last_id).max(
                self.backoff
                    .as_ref()
                    .and_then(|b| b.executor_id)
                    .unwrap_or(0),
            );
            self.backoff = Some(Backoff {
                executor_id: Some(top),
                ..b.because(BackoffCause::Rejected)
            });
            return;
        }
        let admitted = |b: &Backoff| {
            let above = b.executor_id.unwrap_or(u64::MAX);
            (self.snap.executors.values())
                .any(|p| p.state == ExecutorState::Running && p.id > above)
        };
        if (self.backoff.as_ref()).is_some_and(|b| b.cause == BackoffCause::Rejected && admitted(b))
        {
            self.backoff = None;
        }
    }

    /// Rule 8 (excess): known = running + pending + unacknowledged; above the target, the
    /// excess requests and pending pods are deleted, each only if still pending at the call.
    /// Running pods only with `--scale-down-running`: not-Ready first, then lowest deletion
    /// cost, then most restarts, then newest (the ReplicaSet's `ActivePodsWithRanks`: not
    /// ready < ready comes before the deletion cost).
    pub(super) fn delete_excess(&mut self, c: &mut Census<'a>) {
        let known = c.running.len() as u64 + c.pending.len() as u64 + self.unack.len() as u64;
        let Some(excess) = known.checked_sub(self.target as u64).filter(|&e| e > 0) else {
            return;
        };
        let left = match self.cfg.policies.executor_idle_timeout_ms {
            Some(idle) => self.delete_idle_excess(c, excess, idle),
            None => self.delete_newest_excess(c, excess),
        };
        if self.cfg.policies.scale_down_running && left > 0 {
            c.running
                .sort_by_key(|p| (p.ready, p.deletion_cost, Reverse(p.restarts), Reverse(p.id)));
            for p in c.running.iter().take(left as usize) {
                self.delete.push(Delete::seen(p, DeleteReason::Excess));
            }
        }
    }

    /// Rule 8 under Spark 3.0's policy (SPARK-28487): unacknowledged requests first, newest
    /// first, then pending pods as ReplicaSet ranks them for scale-down (unscheduled,
    /// not-Ready, lower pod-deletion-cost, newest). Returns the excess left.
    fn delete_newest_excess(&mut self, c: &mut Census<'a>, mut excess: u64) -> u64 {
        while excess > 0 {
            let Some((id, _)) = self.unack.pop_last() else {
                break;
            };
            let d = Delete::unseen(id, self.name(id), DeleteReason::Excess);
            self.delete.push(d.if_still_pending());
            excess -= 1;
        }
        c.pending
            .sort_by_key(|p| (p.scheduled, p.ready, p.deletion_cost, Reverse(p.id)));
        for p in c.pending.iter().take(excess as usize) {
            self.delete
                .push(Delete::seen(p, DeleteReason::Excess).if_still_pending());
            c.excess_pending += 1;
        }
        excess - c.excess_pending as u64
    }

    /// Rule 8 under Spark 3.1+'s policy (SPARK-33099, SPARK-34334): only requests and pending
    /// pods older than the executor idle timeout may go, oldest first — requests by their
    /// create time, pending pods by `creationTimestamp` (SPARK-37049; none counts as old), ties
    /// by id; pending pods taken = excess − requests deleted. Returns the excess left.
    fn delete_idle_excess(&mut self, c: &mut Census<'a>, mut excess: u64, idle: u64) -> u64 {
        let now = self.now_ms;
        let old = |t: u64| now.saturating_sub(t) > idle;
        let requests: Vec<u64> = (self.unack.iter())
            .filter(|&(_, &t)| old(t))
            .map(|(&id, _)| id)
            .take(excess as usize)
            .collect();
        for id in requests {
            self.unack.remove(&id);
            let d = Delete::unseen(id, self.name(id), DeleteReason::Excess);
            self.delete.push(d.if_still_pending());
            excess -= 1;
        }
        c.pending.sort_by_key(|p| (p.created_ms.unwrap_or(0), p.id));
        let idle_pending = (c.pending.iter()).filter(|p| p.created_ms.is_none_or(old));
        for p in idle_pending.take(excess as usize) {
            self.delete
                .push(Delete::seen(p, DeleteReason::Excess).if_still_pending());
            c.excess_pending += 1;
        }
        excess - c.excess_pending as u64
    }

    /// Ambiguous creates (5xx, a lost connection or an unreadable 2xx after the retries) are
    /// sent again by name while still unseen: pod names are deterministic and 409 for our own
    /// pod counts as created, so this never makes a second pod (as Kubernetes' controllers
    /// settle an unknown create by name rather than by waiting).
    pub(super) fn retry_ambiguous(&mut self) {
        self.retry.retain(|id| self.unack.contains_key(id));
        // Not while creates back off: the server refuses them (they wait, then time out).
        if self.backoff_remaining_ms().is_some() {
            return;
        }
        for &id in &self.retry {
            let pod_name = pod_name(&self.cfg.name_prefix, id);
            self.create.push(Create {
                executor_id: id,
                pod_name,
                retry: true,
            });
        }
    }

    /// How long the creation back-off still holds creates, ms (`None`: not in force).
    fn backoff_remaining_ms(&self) -> Option<u64> {
        let b = self.backoff.as_ref()?;
        b.until_ms.checked_sub(self.now_ms).filter(|&r| r > 0)
    }

    /// The creation back-off in force, with a warning while it blocks growth.
    fn backoff_in_force(&mut self, running: u32) -> Option<Blocked> {
        let remaining_ms = self.backoff_remaining_ms()?;
        let b = self.backoff.as_ref()?;
        let message = b.reason.clone();
        if running < self.target {
            self.warnings.push(format!(
                "not creating executors for {} more (back-off {} after {} refusal(s), {}): {message}",
                humantime::format_duration(std::time::Duration::from_millis(remaining_ms.div_ceil(1000) * 1000)),
                humantime::format_duration(std::time::Duration::from_millis(b.delay_ms)),
                b.refusals,
                b.cause.as_str(),
            ));
        }
        Some(Blocked::Backoff {
            remaining_ms,
            message,
        })
    }

    /// Rule 9 (Spark 3.0: a new batch only when nothing is unacknowledged or pending;
    /// `--max-pending`: Spark 3.1+'s `maxPendingPods`, SPARK-36052): min(room, batch size)
    /// fresh ids, unless a quota back-off or a crash-loop halt is in force. When the target is
    /// not reached and nothing is created, says why ([`Blocked`], as SPARK-42261 logs it).
    pub(super) fn create_batch(&mut self, c: &Census<'a>, halted: bool) -> CreateBatch {
        let running = c.running.len() as u32;
        let backing_off = self.backoff_in_force(running);
        let adaptive =
            AdaptiveBatch::before(self.prev, self.cfg, &c.pending, self.unack.is_empty());
        let batch = adaptive.as_ref().map_or(self.cfg.batch_size, |a| a.size());
        let (room, waiting) = self.room(c, running);
        let ids_left = MAX_EXECUTOR_ID.saturating_sub(self.last_id);
        if ids_left < room.min(batch) as u64 {
            self.warnings.push(format!(
                "executor ids are exhausted (the highest id seen is {}): no more executors \
                 can be created for this app id; use a new app id",
                self.last_id
            ));
        }
        let driver_pending = self.snap.driver == Some(DriverState::Pending);
        let blocked = match () {
            _ if driver_pending => Some(Blocked::DriverPending),
            _ if halted => Some(Blocked::CrashLoop),
            _ if backing_off.is_some() => backing_off.clone(),
            _ if waiting.is_some() => waiting,
            _ if room > 0 && ids_left == 0 => Some(Blocked::IdsExhausted),
            _ => None,
        };
        let made = blocked.is_none() && room > 0;
        if made {
            for _ in 0..(room.min(batch) as u64).min(ids_left) {
                self.last_id += 1;
                self.unack.insert(self.last_id, self.now_ms);
                let name = self.name(self.last_id);
                self.create.push(Create {
                    executor_id: self.last_id,
                    pod_name: name,
                    retry: false,
                });
            }
        }
        CreateBatch {
            backing_off: backing_off.is_some(),
            blocked: blocked.filter(|_| self.create.is_empty() && running < self.target),
            adaptive: adaptive.map(|a| a.after(made, self.prev)),
        }
    }

    /// How many executors may be created (before the batch size), and what makes the rule
    /// wait, if anything. Pods in phase Unknown (not yet lost) and scheduling-gated pods count
    /// toward the target but never hold back a batch; with `--count-terminating`, terminating
    /// pods count as a ResourceQuota charges them ([`ExecutorPod::terminating_counts`]).
    fn room(&self, c: &Census<'a>, running: u32) -> (u32, Option<Blocked>) {
        let gated = c.pending.iter().filter(|p| p.gated).count() as u32;
        let pending = c.pending.len() as u32 - c.excess_pending;
        let ungated = c.pending.len() as u32 - gated;
        let unacknowledged = self.unack.len() as u32;
        let terminating = self.counted_terminating(c);
        let lost = match self.cfg.policies.count_terminating {
            true => c.lost,
            false => 0,
        };
        let counted = (running.saturating_add(terminating.len() as u32))
            .saturating_add(c.unknown.len() as u32)
            .saturating_add(lost);
        let waiting = |pending| Blocked::Waiting {
            pending,
            unacknowledged,
        };
        let (room, blocked) = match self.cfg.policies.max_pending {
            None if unacknowledged > 0 || ungated > 0 => (0, Some(waiting(ungated))),
            None => (
                self.target.saturating_sub(counted.saturating_add(gated)),
                None,
            ),
            Some(_) if unacknowledged > 0 => (0, Some(waiting(pending))),
            Some(max) => {
                let missing = self.target.saturating_sub(counted.saturating_add(pending));
                let slots = max.saturating_sub(pending.saturating_sub(gated));
                let blocked = match (missing, slots) {
                    (0, _) if pending > gated => Some(waiting(pending)),
                    (1.., 0) => Some(Blocked::MaxPending { pending, cap: max }),
                    _ => None,
                };
                (missing.min(slots), blocked)
            }
        };
        let held = (room == 0 && blocked.is_none()).then(|| self.held_by(c, gated, &terminating));
        (room, blocked.or(held.flatten()))
    }

    /// The terminating pods that still count toward the target (only with
    /// `--count-terminating`).
    fn counted_terminating(&self, c: &Census<'a>) -> Vec<&'a ExecutorPod> {
        match self.cfg.policies.count_terminating {
            true => (c.terminating.iter().copied())
                .filter(|p| p.terminating_counts(self.now_ms))
                .collect(),
            false => Vec::new(),
        }
    }

    /// What holds the app below its target when every slot is taken by pods that are not
    /// running: scheduling-gated pods, then counted terminating pods, then Unknown ones.
    fn held_by(
        &self,
        c: &Census<'a>,
        gated: u32,
        terminating: &[&'a ExecutorPod],
    ) -> Option<Blocked> {
        if gated > 0 {
            return Some(Blocked::Gated { pods: gated });
        }
        if !terminating.is_empty() {
            let oldest_ms = (terminating.iter())
                .filter_map(|p| p.deleted_at_ms())
                .map(|t| self.now_ms.saturating_sub(t))
                .max();
            let pods = terminating.len() as u32;
            return Some(Blocked::Terminating { pods, oldest_ms });
        }
        let since = c.unknown_since.iter().map(|r| r.since_ms).min()?;
        Some(Blocked::Unknown {
            pods: c.unknown.len() as u32,
            lost_in_ms: (since.saturating_add(self.cfg.unknown_timeout()) + 1)
                .saturating_sub(self.now_ms),
        })
    }

    /// Ends the step: the counts, "converged", the deleted ids still visible (Spark's
    /// `deletedExecutorIds`), when the next tick is due, and the state to persist.
    pub(super) fn finish(mut self, c: Census<'a>, guard: CrashLoopGuard, b: CreateBatch) -> Plan {
        let mut s = c.summary;
        s.target = self.target;
        s.running = c.running.len() as u32;
        s.pending = c.pending.len() as u32;
        s.created = self.create.len() as u32;
        s.deleted = self.delete.len() as u32;
        let above = self.running_above_target(s.running);
        s.converged = !b.backing_off
            && guard.halt.is_none()
            && self.create.is_empty()
            && self.delete.is_empty()
            && self.unack.is_empty()
            && c.pending.is_empty()
            && (s.running == self.target || above);
        let snap = self.snap;
        let mut deleted: BTreeSet<u64> = (self.prev.deleted.iter().copied())
            .filter(|id| snap.executors.contains_key(id))
            .collect();
        deleted.extend(self.delete.iter().map(|d| d.executor_id));
        let state = AllocatorState {
            version: STATE_VERSION,
            target: Some(self.target),
            last_executor_id: self.last_id,
            unacknowledged: (self.unack.iter())
                .map(|(&executor_id, &created_ms)| Unacknowledged {
                    executor_id,
                    created_ms,
                    retry: self.retry.contains(&executor_id),
                })
                .collect(),
            answered: (self.prev.answered.iter())
                .filter(|id| self.unack.contains_key(id) && !self.retry.contains(id))
                .copied()
                .collect(),
            deleted: deleted.into_iter().collect(),
            deleted_unseen: self.deleted_unseen(),
            create_backoff: self.backoff.take(),
            counters: self.prev.counters.clone(),
            failures: guard.failures,
            stuck: c.stuck,
            unknown: c.unknown_since,
            adaptive: b.adaptive,
            owner: self.prev.owner.clone(),
            applied_requests: self.prev.applied_requests.clone(),
        };
        let create_groups = match self.cfg.policies.slow_start {
            true => slow_start_groups(self.create.len() as u32),
            false => Vec::new(),
        };
        let requeue_after_ms = requeue_after_ms(&state, self.cfg, self.now_ms);
        Plan {
            create: self.create,
            create_groups,
            delete: self.delete,
            state,
            summary: s,
            warnings: self.warnings,
            halt: guard.halt,
            requeue_after_ms,
            driver_ended: None,
            blocked: b.blocked,
        }
    }

    /// The requests deleted unseen, still within their creation timeout (see
    /// [`AllocatorState::deleted_unseen`]): the earlier ones not yet shown, and this step's.
    fn deleted_unseen(&self) -> Vec<Unacknowledged> {
        let timeout = self.cfg.creation_timeout();
        let snap = self.snap;
        let earlier = (self.prev.deleted_unseen.iter())
            .filter(|u| self.now_ms.saturating_sub(u.created_ms) <= timeout)
            .filter(|u| !snap.executors.contains_key(&u.executor_id));
        let now = (self.delete.iter())
            .filter(|d| d.uid.is_none() && d.reason != DeleteReason::TimedOut)
            .filter_map(|d| {
                let id = d.executor_id;
                self.prev
                    .unacknowledged
                    .iter()
                    .find(|u| u.executor_id == id)
            });
        earlier
            .chain(now)
            .map(|u| Unacknowledged { retry: false, ..*u })
            .collect()
    }

    /// Running executors above the target stay (Spark's rule) unless `--scale-down-running`:
    /// then there is nothing more to do, which counts as converged, with a warning.
    fn running_above_target(&mut self, running: u32) -> bool {
        let above = running > self.target && !self.cfg.policies.scale_down_running;
        if above {
            self.warnings.push(format!(
                "{running} running executors are above the target {} and are left running (as \
                 Spark does); pass --scale-down-running, or `podalloc remove ID…`, to stop some",
                self.target
            ));
        }
        above
    }
}

/// What [`Step::create_batch`] leaves for [`Step::finish`].
pub(super) struct CreateBatch {
    backing_off: bool,
    blocked: Option<Blocked>,
    adaptive: Option<super::state::AdaptiveState>,
}

/// Slow-start groups for `n` creates: 1, 2, 4, … and the remainder last (the ReplicaSet
/// controller's `slowStartBatch`, which starts at 1 and doubles while every create succeeds).
fn slow_start_groups(n: u32) -> Vec<u32> {
    let mut groups = Vec::new();
    let (mut left, mut size) = (n, 1u32);
    while left > 0 {
        let g = size.min(left);
        groups.push(g);
        left -= g;
        size = size.saturating_mul(2);
    }
    groups
}
