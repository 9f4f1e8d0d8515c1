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
    /// Profile 0's target.
    target: u32,
    /// The targets of the other resource profiles (empty: profile 0 only).
    profile_targets: BTreeMap<u32, u32>,
    last_id: u64,
    unack: BTreeMap<u64, u64>,
    /// The profile of each unacknowledged id not of profile 0.
    unack_profile: BTreeMap<u64, u32>,
    /// Unacknowledged ids whose create's outcome is unknown: sent again by name.
    retry: BTreeSet<u64>,
    removed: BTreeSet<u64>,
    /// Removals that asked for the Eviction API (this request's, and those kept).
    evict_asked: BTreeSet<u64>,
    delete: Vec<Delete>,
    create: Vec<Create>,
    warnings: Vec<String>,
    /// Executors that failed in this snapshot (terminated or stuck): id, reason.
    newly_failed: Vec<(u64, String)>,
    /// The creation back-off in force (the state's, clamped to the documented cap, or set
    /// by this snapshot's kubelet rejections).
    backoff: Option<Backoff>,
    /// Answered creates whose pods this snapshot does not list (rule `forget_vanished`).
    vanished: BTreeSet<u64>,
    /// Removals refused for the profile they were written to ([`Plan::refused_removals`]).
    refused: Vec<(u64, String)>,
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
    /// Pods lost (deleted from phase Unknown) or stuck (deleted in start-up) in this step,
    /// by their profile label: with `--count-terminating` they count as the terminating
    /// pods they are about to be.
    lost: Vec<u32>,
    /// Pending pods deleted as excess in this step.
    excess_pending: BTreeSet<u64>,
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
        let (target, profile_targets) = targets_after(prev, req)?;
        Ok(Step {
            snap,
            prev,
            cfg,
            now_ms,
            target,
            profile_targets,
            last_id: prev.highest_id().max(snap.max_id()),
            unack: prev
                .unacknowledged
                .iter()
                .map(|u| (u.executor_id, u.created_ms))
                .collect(),
            unack_profile: (prev.unacknowledged.iter())
                .filter(|u| u.profile != 0)
                .map(|u| (u.executor_id, u.profile))
                .collect(),
            retry: (prev.unacknowledged.iter())
                .filter(|u| u.retry)
                .map(|u| u.executor_id)
                .collect(),
            removed: BTreeSet::new(),
            evict_asked: (req.evict.iter().chain(prev.removing_evict.iter()))
                .copied()
                .collect(),
            delete: Vec::new(),
            create: Vec::new(),
            warnings: (snap.warnings.iter().cloned())
                .chain(overflow_warning(prev, req))
                .collect(),
            newly_failed: Vec::new(),
            backoff: (prev.create_backoff.clone())
                .map(|b| b.clamped(now_ms))
                .filter(|b| !b.is_for_another_template(cfg.template_fingerprint.as_deref())),
            vanished: BTreeSet::new(),
            refused: Vec::new(),
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

    /// Rule 2a (podalloc's, issue 31: known lost, not waited out): a create the API server
    /// answered (201, or 409 for our own pod: [`AllocatorState::answered`]) whose pod this
    /// snapshot does not list is gone. The list is made after the answer (the state that
    /// records it is saved after the calls and read before the next list) and lists are
    /// consistent reads (no `resourceVersion`: quorum reads from etcd on kube-apiserver), so
    /// a pod it created is in them until deleted: it was deleted before any list saw it. It
    /// is forgotten at once — no delete, the server has said it is gone — and so replaced
    /// in this step under a new id, instead of blocking creation until the creation timeout
    /// (Spark waits it out). Its id is kept with the requests deleted unseen, so a copy that
    /// shows up later is deleted (reason `late`), and never handed out again. A create whose
    /// outcome is unknown ([`Unacknowledged::retry`]) is never vanished: it is sent again.
    pub(super) fn forget_vanished(&mut self) {
        let answered = &self.prev.answered;
        let gone: Vec<u64> = (self.unack.keys().copied())
            .filter(|id| answered.contains(id) && !self.retry.contains(id))
            .collect();
        for id in gone {
            self.unack.remove(&id);
            self.vanished.insert(id);
            self.warnings.push(format!(
                "executor {id} (pod {}): the API server answered its create, but a later list \
                 does not show the pod (deleted before any list saw it): forgotten, and \
                 replaced under a new id as soon as the batch rules allow",
                self.name(id)
            ));
        }
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
    /// state; each that counts (running, pending, unknown, unacknowledged) lowers the target
    /// of its resource profile when `lowers(profile)` (not when the request's target of that
    /// profile already accounts for them: [`super::TargetChange::Absolute`]). A removal
    /// written to another profile's object than the executor's is refused when either
    /// target is absolute ([`Step::misfiled`]).
    pub(super) fn remove_requested(
        &mut self,
        ids: &[u64],
        filed: &BTreeMap<u64, u32>,
        lowers: impl Fn(u32) -> bool,
    ) {
        for &id in ids {
            if self.removed.contains(&id) {
                continue;
            }
            if let Some(why) = self.misfiled(id, filed.get(&id).copied(), &lowers) {
                self.warnings.push(why.clone());
                self.refused.push((id, why));
                continue;
            }
            self.removed.insert(id);
            let (delete, counts, profile) = match self.snap.executors.get(&id) {
                Some(p) if p.state == ExecutorState::Deleted => {
                    self.warnings
                        .push(format!("executor {id} is already being deleted"));
                    continue;
                }
                Some(p) => (
                    Delete::seen(p, DeleteReason::Removed).evicting(self.evicts(p)),
                    !matches!(p.state, ExecutorState::Failed | ExecutorState::Succeeded),
                    self.profile_of(p),
                ),
                None if self.unack.contains_key(&id) => {
                    let profile = self.unack_profile_of(id);
                    self.unack.remove(&id);
                    let d = Delete::unseen(id, self.name(id), DeleteReason::Removed);
                    (d, true, profile)
                }
                None => {
                    self.warnings
                        .push(format!("executor {id} does not exist: nothing to remove"));
                    continue;
                }
            };
            if counts && lowers(profile) {
                self.lower_target(profile);
            }
            self.delete.push(delete);
        }
    }

    /// Rule 6, continued: why a removal of executor `id` written to profile `filed`'s object
    /// is refused (`None`: it is applied). Refused when the executor counts in another
    /// profile and either target is absolute (an ExecutorSet's `spec.replicas`): the writer
    /// lowered the object it wrote to, so applying it would delete the executor, have its own
    /// profile replace it (its target not lowered) and leave the other profile one short.
    /// The executor is left alone; the request still counts as applied (not retried).
    fn misfiled(
        &self,
        id: u64,
        filed: Option<u32>,
        lowers: &impl Fn(u32) -> bool,
    ) -> Option<String> {
        let filed = filed?;
        let own = match self.snap.executors.get(&id) {
            Some(p) => self.profile_of(p),
            None if self.unack.contains_key(&id) => self.unack_profile_of(id),
            None => return None,
        };
        let written = self.profile_in(filed);
        if own == written || (lowers(own) && lowers(written)) {
            return None;
        }
        Some(format!(
            "executor {id} (pod {}) is resource profile {own}'s, but its removal was written \
             to profile {filed}'s ExecutorSet: refused, the executor is not deleted (write the \
             removal to profile {own}'s ExecutorSet, and set profile {filed}'s spec.replicas \
             back if it was lowered for it)",
            self.name(id)
        ))
    }

    /// Rule 6, continued: a removal in progress ([`AllocatorState::removing`]: its delete
    /// failed, or its eviction was put off by a PodDisruptionBudget) is asked again while the
    /// pod is live, without lowering the target again; a pod gone, terminating or ended
    /// needs no more (the census deletes an ended one as usual). Runs before
    /// [`Step::remove_requested`], so a request naming the same executor again does not
    /// lower the target twice.
    pub(super) fn retry_removals(&mut self) {
        for &id in &self.prev.removing {
            let Some(p) = self.snap.executors.get(&id) else {
                continue;
            };
            let live = matches!(
                p.state,
                ExecutorState::Running | ExecutorState::Pending | ExecutorState::Unknown
            );
            if live && self.removed.insert(id) {
                let d = Delete::seen(p, DeleteReason::Removed).evicting(self.evicts(p));
                self.delete.push(d);
            }
        }
    }

    /// Whether deleting `p` goes through the Eviction API: a running executor under
    /// `--evict`, or removed by a request that asked for it ([`Request::evict`], kept in
    /// [`AllocatorState::removing_evict`]) whatever this tick's flag (the API server
    /// ignores budgets for pending, ended and terminating pods).
    fn evicts(&self, p: &ExecutorPod) -> bool {
        (self.cfg.policies.evict || self.evict_asked.contains(&p.id))
            && p.state == ExecutorState::Running
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
            lost: Vec::new(),
            excess_pending: BTreeSet::new(),
        };
        c.summary.counts.unacknowledged = self.unack.len() as u32;
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
                    c.summary.counts.failed += 1;
                    self.disrupted(p);
                }
                ExecutorState::Failed => {
                    c.summary.counts.failed += 1;
                    let reason = p.reason.clone().unwrap_or_else(|| "failed".into());
                    self.newly_failed.push((p.id, reason));
                    self.delete_terminated(p, DeleteReason::Failed);
                }
                ExecutorState::Succeeded => {
                    c.summary.counts.succeeded += 1;
                    self.delete_terminated(p, DeleteReason::Succeeded);
                }
                ExecutorState::Deleted => {
                    c.summary.counts.deleting += 1;
                    c.terminating.push(p);
                }
                ExecutorState::Unknown => {
                    c.summary.counts.unknown += 1;
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
                c.lost.push(p.profile);
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
                // It is about to terminate: with --count-terminating it counts from now
                // (B52: its replacement waits, as for a lost pod).
                c.lost.push(p.profile);
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

    /// Rule 8 (excess), per resource profile (Spark 3.1+, SPARK-33288): known = running +
    /// pending + unacknowledged of the profile; above its target, the excess requests and
    /// pending pods of that profile are deleted, each only if still pending at the call.
    /// Running pods only with `--scale-down-running`: not-Ready first, then lowest deletion
    /// cost, then most restarts, then newest (the ReplicaSet's `ActivePodsWithRanks`: not
    /// ready < ready comes before the deletion cost).
    pub(super) fn delete_excess(&mut self, c: &mut Census<'a>) {
        for (profile, target) in self.targets() {
            self.delete_excess_of(c, profile, target);
        }
    }

    /// Rule 8 for one profile and its target.
    fn delete_excess_of(&mut self, c: &mut Census<'a>, profile: u32, target: u32) {
        let mut running: Vec<&'a ExecutorPod> = (c.running.iter().copied())
            .filter(|p| self.profile_of(p) == profile)
            .collect();
        let pending = (c.pending.iter()).filter(|p| self.profile_of(p) == profile);
        let known =
            running.len() as u64 + pending.count() as u64 + self.unack_of(profile).len() as u64;
        let Some(excess) = known.checked_sub(target as u64).filter(|&e| e > 0) else {
            return;
        };
        let left = match self.cfg.policies.executor_idle_timeout_ms {
            Some(idle) => self.delete_idle_excess(c, excess, idle, profile),
            None => self.delete_newest_excess(c, excess, profile),
        };
        if self.cfg.policies.scale_down_running && left > 0 {
            running.sort_by_key(|p| (p.ready, p.deletion_cost, Reverse(p.restarts), Reverse(p.id)));
            for p in running.iter().take(left as usize) {
                let d = Delete::seen(p, DeleteReason::Excess).evicting(self.evicts(p));
                self.delete.push(d);
            }
        }
    }

    /// Rule 8 under Spark 3.0's policy (SPARK-28487), in one profile: unacknowledged requests
    /// first, newest first, then pending pods as ReplicaSet ranks them for scale-down
    /// (unscheduled, not-Ready, lower pod-deletion-cost, newest). Returns the excess left.
    fn delete_newest_excess(&mut self, c: &mut Census<'a>, mut excess: u64, profile: u32) -> u64 {
        for id in self.unack_of(profile).into_iter().rev() {
            if excess == 0 {
                break;
            }
            self.unack.remove(&id);
            let d = Delete::unseen(id, self.name(id), DeleteReason::Excess);
            self.delete.push(d.if_still_pending());
            excess -= 1;
        }
        c.pending
            .sort_by_key(|p| (p.scheduled, p.ready, p.deletion_cost, Reverse(p.id)));
        self.delete_pending_excess(c, excess, profile, |_| true)
    }

    /// Deletes up to `excess` pending pods of `profile` that `may_go`, in `c.pending`'s order,
    /// each only if still pending at the call. Returns the excess left.
    fn delete_pending_excess(
        &mut self,
        c: &mut Census<'a>,
        excess: u64,
        profile: u32,
        may_go: impl Fn(&ExecutorPod) -> bool,
    ) -> u64 {
        let chosen: Vec<&'a ExecutorPod> = (c.pending.iter().copied())
            .filter(|p| self.profile_of(p) == profile && may_go(p))
            .take(excess as usize)
            .collect();
        for p in &chosen {
            self.delete
                .push(Delete::seen(p, DeleteReason::Excess).if_still_pending());
            c.excess_pending.insert(p.id);
        }
        excess - chosen.len() as u64
    }

    /// Rule 8 under Spark 3.1+'s policy (SPARK-33099, SPARK-34334), in one profile: only
    /// requests and pending pods older than the executor idle timeout may go, oldest first —
    /// requests by their create time, pending pods by `creationTimestamp` (SPARK-37049; none
    /// counts as old), ties by id; pending pods taken = excess − requests deleted. Returns the
    /// excess left.
    fn delete_idle_excess(
        &mut self,
        c: &mut Census<'a>,
        mut excess: u64,
        idle: u64,
        profile: u32,
    ) -> u64 {
        let now = self.now_ms;
        let old = move |t: u64| now.saturating_sub(t) > idle;
        let requests: Vec<u64> = (self.unack_of(profile).into_iter())
            .filter(|id| old(self.unack[id]))
            .take(excess as usize)
            .collect();
        for id in requests {
            self.unack.remove(&id);
            let d = Delete::unseen(id, self.name(id), DeleteReason::Excess);
            self.delete.push(d.if_still_pending());
            excess -= 1;
        }
        c.pending.sort_by_key(|p| (p.created_ms.unwrap_or(0), p.id));
        self.delete_pending_excess(c, excess, profile, |p| p.created_ms.is_none_or(old))
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
                profile: self.unack_profile.get(&id).copied().unwrap_or(0),
            });
        }
    }

    /// How long the creation back-off still holds creates, ms (`None`: not in force).
    fn backoff_remaining_ms(&self) -> Option<u64> {
        let b = self.backoff.as_ref()?;
        b.until_ms.checked_sub(self.now_ms).filter(|&r| r > 0)
    }

    /// The creation back-off in force, with a warning while it blocks growth.
    fn backoff_in_force(&mut self, short: bool) -> Option<Blocked> {
        let remaining_ms = self.backoff_remaining_ms()?;
        let b = self.backoff.as_ref()?;
        let message = b.reason.clone();
        if short {
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
    /// `--max-pending`: Spark 3.1+'s `maxPendingPods`, SPARK-36052), per resource profile in
    /// Spark's order (profile ids ascending, SPARK-33288): min(room, batch size) fresh ids of
    /// the app's one counter for each profile, unless a quota back-off or a crash-loop halt is
    /// in force. When a target is not reached and nothing is created, says why ([`Blocked`],
    /// as SPARK-42261 logs it).
    pub(super) fn create_batch(&mut self, c: &Census<'a>, halted: bool) -> CreateBatch {
        let short = self.short(c);
        let backing_off = self.backoff_in_force(short);
        let adaptive =
            AdaptiveBatch::before(self.prev, self.cfg, &c.pending, self.unack.is_empty());
        let batch = adaptive.as_ref().map_or(self.cfg.batch_size, |a| a.size());
        let (rooms, waiting) = self.rooms(c);
        let wanted: u64 = rooms.iter().map(|&(_, room)| room.min(batch) as u64).sum();
        let ids_left = MAX_EXECUTOR_ID.saturating_sub(self.last_id);
        if ids_left < wanted {
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
            _ if wanted == 0 => waiting,
            _ if ids_left == 0 => Some(Blocked::IdsExhausted),
            _ => None,
        };
        let made = blocked.is_none() && wanted > 0;
        if made {
            let mut left = ids_left;
            for (profile, room) in rooms {
                let n = (room.min(batch) as u64).min(left);
                left -= n;
                (0..n).for_each(|_| self.create_one(profile));
            }
        }
        CreateBatch {
            backing_off: backing_off.is_some(),
            blocked: blocked.filter(|_| self.create.is_empty() && short),
            adaptive: adaptive.map(|a| a.after(made, self.prev)),
        }
    }

    /// One fresh id of the app's counter, created for `profile`.
    fn create_one(&mut self, profile: u32) {
        self.last_id += 1;
        self.unack.insert(self.last_id, self.now_ms);
        if profile != 0 {
            self.unack_profile.insert(self.last_id, profile);
        }
        self.create.push(Create {
            executor_id: self.last_id,
            pod_name: self.name(self.last_id),
            retry: false,
            profile,
        });
    }

    /// Whether some profile runs fewer executors than its target.
    fn short(&self, c: &Census<'a>) -> bool {
        (self.targets().into_iter()).any(|(profile, target)| {
            let mine = c.running.iter().filter(|p| self.profile_of(p) == profile);
            (mine.count() as u64) < target as u64
        })
    }

    /// Each profile's room (before the batch size), in Spark's order, and what makes the
    /// first profile below its target wait, if anything.
    fn rooms(&self, c: &Census<'a>) -> (Vec<(u32, u32)>, Option<Blocked>) {
        let counts: Vec<Counts> = (self.targets().into_iter())
            .map(|(profile, target)| self.counts(c, profile, target))
            .collect();
        let shares = self.shares(&counts);
        let total_pending = counts
            .iter()
            .map(|k| k.pending)
            .fold(0, u32::saturating_add);
        let mut rooms = Vec::new();
        let mut blocked = None;
        for (k, share) in counts.iter().zip(shares) {
            let (room, why) = self.room(c, k, share, total_pending);
            rooms.push((k.profile, room));
            if blocked.is_none() && k.running < k.target {
                blocked = why;
            }
        }
        (rooms, blocked)
    }

    /// One profile's counts for rule 9. Pods in phase Unknown (not yet lost) and
    /// scheduling-gated pods count toward the target but never hold back a batch; with
    /// `--count-terminating`, terminating pods count as a ResourceQuota charges them
    /// ([`ExecutorPod::terminating_counts`]).
    fn counts(&self, c: &Census<'a>, profile: u32, target: u32) -> Counts {
        let mine = |p: &&&'a ExecutorPod| self.profile_of(p) == profile;
        let of = |v: &[&'a ExecutorPod]| v.iter().filter(mine).count() as u32;
        let gated = c.pending.iter().filter(mine).filter(|p| p.gated).count() as u32;
        let all_pending = of(&c.pending);
        let excess = (c.pending.iter().filter(mine))
            .filter(|p| c.excess_pending.contains(&p.id))
            .count() as u32;
        let lost = match self.cfg.policies.count_terminating {
            true => c
                .lost
                .iter()
                .filter(|&&l| self.profile_in(l) == profile)
                .count() as u32,
            false => 0,
        };
        let running = of(&c.running);
        let counted = (running.saturating_add(of(&self.counted_terminating(c))))
            .saturating_add(of(&c.unknown))
            .saturating_add(lost);
        Counts {
            profile,
            target,
            running,
            pending: all_pending - excess,
            gated,
            ungated: all_pending - gated,
            unack: self.unack_of(profile).len() as u32,
            counted,
        }
    }

    /// Under `--max-pending` (Spark 3.1+'s `maxPendingPods`, SPARK-36052): the pending slots
    /// left over all profiles — the cap less every profile's pending pods (not gated) and
    /// requests — split among the profiles that want pods (nothing unacknowledged, below
    /// target) as Spark's `splitSlots` does: the first `slots mod n` get one more.
    fn shares(&self, counts: &[Counts]) -> Vec<u32> {
        let mut shares = vec![0; counts.len()];
        let Some(max) = self.cfg.policies.max_pending else {
            return shares;
        };
        let not_running = (counts.iter())
            .map(|k| k.pending.saturating_sub(k.gated).saturating_add(k.unack))
            .fold(0, u32::saturating_add);
        let slots = max.saturating_sub(not_running);
        let wanting: Vec<usize> = (0..counts.len())
            .filter(|&i| counts[i].unack == 0 && counts[i].missing() > 0)
            .collect();
        if let Some(n) = u32::try_from(wanting.len()).ok().filter(|&n| n > 0) {
            for (j, &i) in wanting.iter().enumerate() {
                shares[i] = slots / n + u32::from((j as u32) < slots % n);
            }
        }
        shares
    }

    /// How many executors one profile may create (before the batch size), and what makes
    /// it wait, if anything; `share`: its pending slots under `--max-pending`.
    fn room(&self, c: &Census<'a>, k: &Counts, share: u32, pending: u32) -> (u32, Option<Blocked>) {
        let waiting = |pending| Blocked::Waiting {
            pending,
            unacknowledged: k.unack,
        };
        let (room, blocked) = match self.cfg.policies.max_pending {
            None if k.unack > 0 || k.ungated > 0 => (0, Some(waiting(k.ungated))),
            None => (
                k.target.saturating_sub(k.counted.saturating_add(k.gated)),
                None,
            ),
            Some(_) if k.unack > 0 => (0, Some(waiting(k.pending))),
            Some(max) => {
                let missing = k.missing();
                let blocked = match (missing, share) {
                    (0, _) if k.pending > k.gated => Some(waiting(k.pending)),
                    (1.., 0) => Some(Blocked::MaxPending { pending, cap: max }),
                    _ => None,
                };
                (missing.min(share), blocked)
            }
        };
        let held = (room == 0 && blocked.is_none()).then(|| self.held_by(c, k));
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

    /// What holds a profile below its target when every slot is taken by pods that are not
    /// running: scheduling-gated pods, then counted terminating pods, then Unknown ones.
    fn held_by(&self, c: &Census<'a>, k: &Counts) -> Option<Blocked> {
        if k.gated > 0 {
            return Some(Blocked::Gated { pods: k.gated });
        }
        let mine = |p: &&'a ExecutorPod| self.profile_of(p) == k.profile;
        let terminating: Vec<&'a ExecutorPod> = self
            .counted_terminating(c)
            .into_iter()
            .filter(mine)
            .collect();
        if !terminating.is_empty() {
            let oldest_ms = (terminating.iter())
                .filter_map(|p| p.deleted_at_ms())
                .map(|t| self.now_ms.saturating_sub(t))
                .max();
            let pods = terminating.len() as u32;
            return Some(Blocked::Terminating { pods, oldest_ms });
        }
        let unknown: BTreeSet<u64> = (c.unknown.iter().copied())
            .filter(mine)
            .map(|p| p.id)
            .collect();
        let since = (c.unknown_since.iter())
            .filter(|r| unknown.contains(&r.executor_id))
            .map(|r| r.since_ms)
            .min()?;
        Some(Blocked::Unknown {
            pods: unknown.len() as u32,
            lost_in_ms: (since.saturating_add(self.cfg.unknown_timeout()) + 1)
                .saturating_sub(self.now_ms),
        })
    }

    /// Each profile's target and its running and pending executors ([`Summary::profiles`]).
    fn profile_summaries(&self, c: &Census<'a>) -> BTreeMap<u32, super::ProfileSummary> {
        let targets = self.targets().into_iter();
        (targets.map(|(profile, target)| {
            let of = |pods: &[&ExecutorPod]| {
                pods.iter()
                    .filter(|p| self.profile_of(p) == profile)
                    .count() as u32
            };
            let (running, pending) = (of(&c.running), of(&c.pending));
            (
                profile,
                super::ProfileSummary {
                    target,
                    running,
                    pending,
                },
            )
        }))
        .collect()
    }

    /// Ends the step: the counts, "converged", the deleted ids still visible (Spark's
    /// `deletedExecutorIds`), when the next tick is due, and the state to persist.
    pub(super) fn finish(mut self, c: Census<'a>, guard: CrashLoopGuard, b: CreateBatch) -> Plan {
        let settled = self.settled(&c);
        let profiles = self.profile_summaries(&c);
        let mut s = c.summary;
        s.profiles = profiles;
        s.target = (self.targets().into_iter()).fold(0, |t, (_, n)| t.saturating_add(n));
        s.counts.running = c.running.len() as u32;
        s.counts.pending = c.pending.len() as u32;
        s.created = self.create.len() as u32;
        s.deleted = self.delete.len() as u32;
        s.converged = !b.backing_off
            && guard.halt.is_none()
            && self.create.is_empty()
            && self.delete.is_empty()
            && self.unack.is_empty()
            && c.pending.is_empty()
            && settled;
        let snap = self.snap;
        let mut deleted: BTreeSet<u64> = (self.prev.deleted.iter().copied())
            .filter(|id| snap.executors.contains_key(id))
            .collect();
        deleted.extend(self.delete.iter().map(|d| d.executor_id));
        let state = AllocatorState {
            version: STATE_VERSION,
            target: Some(self.target),
            profile_targets: self.profile_targets.clone(),
            last_executor_id: self.last_id,
            unacknowledged: (self.unack.iter())
                .map(|(&executor_id, &created_ms)| Unacknowledged {
                    executor_id,
                    created_ms,
                    retry: self.retry.contains(&executor_id),
                    profile: self.unack_profile.get(&executor_id).copied().unwrap_or(0),
                })
                .collect(),
            answered: (self.prev.answered.iter())
                .filter(|id| self.unack.contains_key(id) && !self.retry.contains(id))
                .copied()
                .collect(),
            deleted: deleted.into_iter().collect(),
            deleted_unseen: self.deleted_unseen(),
            removing: (self.delete.iter())
                .filter(|d| d.reason == DeleteReason::Removed)
                .map(|d| d.executor_id)
                .collect(),
            removing_evict: (self.delete.iter())
                .filter(|d| d.reason == DeleteReason::Removed)
                .map(|d| d.executor_id)
                .filter(|id| self.evict_asked.contains(id))
                .collect(),
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
            refused_removals: self.refused,
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
            .map(|d| d.executor_id)
            .chain(self.vanished.iter().copied())
            .filter_map(|id| {
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

    /// Whether every profile runs exactly its target, or more: running executors above the
    /// target stay (Spark's rule) unless `--scale-down-running`, so then there is nothing
    /// more to do, which counts as settled, with a warning.
    fn settled(&mut self, c: &Census<'a>) -> bool {
        let mut settled = true;
        for (profile, target) in self.targets() {
            let mine = c.running.iter().filter(|p| self.profile_of(p) == profile);
            let running = mine.count() as u64;
            let above = running > target as u64 && !self.cfg.policies.scale_down_running;
            if above {
                let of = match self.multi() {
                    true => format!(" of profile {profile}"),
                    false => String::new(),
                };
                self.warnings.push(format!(
                    "{running} running executors are above the target{of} {target} and are left \
                     running (as Spark does); pass --scale-down-running, or `podalloc remove \
                     ID…`, to stop some"
                ));
            }
            settled &= running == target as u64 || above;
        }
        settled
    }

    /// Spark's single-profile fast path: while no profile but 0 has a target, every pod and
    /// request is profile 0's, whatever its label.
    fn multi(&self) -> bool {
        !self.profile_targets.is_empty()
    }

    /// The profile a pod counts in: its label's (Spark groups pods by
    /// `spark-exec-resourceprofile-id`), or 0 on the single-profile fast path.
    fn profile_of(&self, p: &ExecutorPod) -> u32 {
        self.profile_in(p.profile)
    }

    /// A profile label as counted: itself, or 0 on the single-profile fast path.
    fn profile_in(&self, label: u32) -> u32 {
        if self.multi() {
            label
        } else {
            0
        }
    }

    /// The profile an unacknowledged request counts in.
    fn unack_profile_of(&self, id: u64) -> u32 {
        self.profile_in(self.unack_profile.get(&id).copied().unwrap_or(0))
    }

    /// The unacknowledged ids of one profile, ascending.
    fn unack_of(&self, profile: u32) -> Vec<u64> {
        (self.unack.keys().copied())
            .filter(|&id| self.unack_profile_of(id) == profile)
            .collect()
    }

    /// Every profile's target, profile ids ascending (Spark 3.1+ walks them in this order).
    fn targets(&self) -> Vec<(u32, u32)> {
        let others = self.profile_targets.iter().map(|(&p, &t)| (p, t));
        std::iter::once((0, self.target)).chain(others).collect()
    }

    /// Lowers a profile's target by one (a removal); a profile without a target has none to
    /// lower.
    fn lower_target(&mut self, profile: u32) {
        let target = match profile {
            0 => Some(&mut self.target),
            p => self.profile_targets.get_mut(&p),
        };
        if let Some(t) = target {
            *t = t.saturating_sub(1);
        }
    }
}

/// One profile's counts for rule 9 ([`Step::counts`]).
struct Counts {
    profile: u32,
    target: u32,
    running: u32,
    /// Pending pods not deleted as excess in this step, gated ones included.
    pending: u32,
    gated: u32,
    /// Pending pods not gated, excess ones included.
    ungated: u32,
    unack: u32,
    /// Running, Unknown, and (with `--count-terminating`) terminating and lost pods.
    counted: u32,
}

impl Counts {
    /// Executors missing below the target: target − (counted + pending).
    fn missing(&self) -> u32 {
        (self.target).saturating_sub(self.counted.saturating_add(self.pending))
    }
}

/// The targets after a request: profile 0's (an error when it has none and no other profile
/// has one; else 0 when only others have one), and the other profiles'.
fn targets_after(
    prev: &AllocatorState,
    req: &Request,
) -> Result<(u32, BTreeMap<u32, u32>), StepError> {
    let mut target = req.target.apply(prev.target);
    let mut others = prev.profile_targets.clone();
    for (&p, &change) in &req.profiles {
        match p {
            0 => target = change.apply(target),
            p => {
                if let Some(t) = change.apply(others.get(&p).copied()) {
                    others.insert(p, t);
                }
            }
        }
    }
    match target {
        Some(t) => Ok((t, others)),
        None if !others.is_empty() => Ok((0, others)),
        None => Err(StepError::NoTarget),
    }
}

/// The warning for an `add` that would take the target above the largest one (R3: the
/// target stops there instead of being saved out of range).
fn overflow_warning(prev: &AllocatorState, req: &Request) -> Option<String> {
    let super::TargetChange::Add(n) = req.target else {
        return None;
    };
    req.target.overflows(prev.target).then(|| {
        format!(
            "target {} + {n} is above the largest target {max}: the target is {max}",
            prev.target.unwrap_or(0),
            max = super::MAX_TARGET
        )
    })
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
