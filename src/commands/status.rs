//! `podalloc status`: the counts of the app's executors and whether they have converged.
//! Read-only: no lock, no save, no API writes.

use super::env::{connect, now_ms};
use crate::cli::{Cli, Output, StatusArgs};
use crate::controller::tick as reconcile;
use crate::engine::alloc::{self, Request};
use crate::engine::snapshot::ExecutorState;
use crate::error::Result;
use std::collections::BTreeMap;

/// Counts shown by `status`.
#[derive(serde::Serialize, Debug, Default)]
pub struct StatusCounts {
    /// The app id.
    pub app_id: String,
    /// The namespace.
    pub namespace: String,
    /// Where the app's intent and state live (its home), in `--state-store` syntax:
    /// `executorset:NAME`, `configmap:NAME`, or `file:PATH` (the state file). Named
    /// `state_file` before, which it was only for the file store.
    pub home: String,
    /// The target (total expected executors), if one was ever set: with resource profiles,
    /// the sum of every profile's (each one's is in `profiles`).
    pub target: Option<u32>,
    /// The executors by state: the snapshot's, and the requests not yet seen in it.
    #[serde(flatten)]
    pub counts: alloc::PhaseCounts,
    /// The highest executor id handed out or seen.
    pub last_executor_id: u64,
    /// The app has converged, as the allocation step defines it
    /// ([`crate::engine::alloc::Summary::converged`]): running = target with nothing pending,
    /// unacknowledged or planned.
    pub converged: bool,
    /// Why nothing would be created although the target is not reached (the plan's
    /// `blocked`), if so.
    pub blocked: Option<crate::engine::alloc::Blocked>,
    /// Why the app is not converged, one sentence each (empty when converged).
    pub not_converged_because: Vec<String>,
    /// Executor ids by state (`running`, `pending`, `failed`, `succeeded`, `deleted`,
    /// `unknown`): the ids `podalloc remove` takes.
    pub executors: BTreeMap<ExecutorState, Vec<u64>>,
    /// Totals across ticks: executors created/deleted, API errors by code, last success.
    pub counters: crate::engine::alloc::Counters,
    /// The quota back-off in force, if any.
    pub create_backoff: Option<crate::engine::alloc::Backoff>,
    /// Steering requests (`scale`, `add`, `remove` handed to a running loop) queued and not
    /// yet applied, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queued_requests: Vec<crate::engine::alloc::Steering>,
    /// The loop that owns the app (holds the state's lock or a fresh ConfigMap holder
    /// record: a `run` or `apps` process), which applies steering requests; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The leader-election Lease, when one exists (`run --leader-elect`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderInfo>,
    /// Each resource profile's counts, by profile id, when the app has profiles other than
    /// 0 (Spark 3.1+'s stage-level scheduling); the counts above are the app's totals.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub profiles: BTreeMap<u32, ProfileCounts>,
}

/// One resource profile's counts, as `status` shows them.
#[derive(serde::Serialize, Debug, Default, PartialEq, Eq)]
pub struct ProfileCounts {
    /// The profile's target.
    pub target: u32,
    /// Its running executors.
    pub running: u32,
    /// Its pending executors.
    pub pending: u32,
    /// Its executors created and not yet seen.
    pub unacknowledged: u32,
}

/// The counts of each profile of `state` and `plan` (empty: profile 0 only).
fn profile_counts(
    state: &alloc::AllocatorState,
    plan: Option<&alloc::Plan>,
    snap: &crate::engine::snapshot::Snapshot,
) -> BTreeMap<u32, ProfileCounts> {
    let (Some(plan), false) = (plan, state.profile_targets.is_empty()) else {
        return BTreeMap::new();
    };
    (plan.summary.profiles.iter())
        .map(|(&p, s)| {
            let unack = (state.unacknowledged.iter())
                .filter(|u| u.profile == p && !snap.executors.contains_key(&u.executor_id))
                .count() as u32;
            let counts = ProfileCounts {
                target: s.target,
                running: s.running,
                pending: s.pending,
                unacknowledged: unack,
            };
            (p, counts)
        })
        .collect()
}

/// The leader-election Lease as `status` shows it.
#[derive(serde::Serialize, Debug, Default)]
pub struct LeaderInfo {
    /// The Lease name.
    pub lease: String,
    /// `spec.holderIdentity`; empty when released.
    pub holder: String,
    /// `spec.renewTime` (RFC 3339, microseconds).
    pub renew_time: String,
    /// `spec.leaseTransitions`.
    pub transitions: u64,
}

/// Reads the app's Lease (`--leader-elect-resource-name`, else `podalloc-<app id>`);
/// `None` when there is none or it cannot be read (logged at debug: RBAC may not grant
/// leases to a read-only user).
fn leader_info(env: &super::env::Env, name: Option<&str>) -> Result<Option<LeaderInfo>> {
    let name = super::elect::lease_name(name, &env.app.app_id)?;
    match env.client.api(&crate::kube::LEASES).get(&name) {
        Ok(Some(v)) => {
            let r = crate::controller::leader::Observed::from_lease(&v).record;
            Ok(Some(LeaderInfo {
                lease: name,
                holder: r.holder_identity,
                renew_time: r.renew_time,
                transitions: r.lease_transitions,
            }))
        }
        Ok(None) => Ok(None),
        Err(e) => {
            log::debug!("no leader shown: {e}");
            Ok(None)
        }
    }
}

/// Lists the app's pods, reads the state (unlocked), runs the allocation step on them
/// (nothing is applied or saved) and prints the counts, whether the app has converged and
/// why not. Changes nothing.
pub(super) fn status(cli: &Cli, a: &StatusArgs) -> Result<()> {
    let env = connect(cli, false)?;
    let state = env.read_state()?;
    let snap = reconcile::list_snapshot(&env.client, &env.app).map_err(|e| env.explain(e))?;
    let count = |s| snap.count(s) as u32;
    let unack = state
        .unacknowledged
        .iter()
        .filter(|u| !snap.executors.contains_key(&u.executor_id))
        .count() as u32;
    let mut executors: BTreeMap<ExecutorState, Vec<u64>> = BTreeMap::new();
    for (id, pod) in &snap.executors {
        executors.entry(pod.state).or_default().push(*id);
    }
    // Without --template/--image, status does not know the template in use: a refusal's
    // back-off (tied to the refused template's fingerprint) is shown as in force, not
    // dropped as "for another template" (a new user read "the next tick would create 3"
    // while the error had sent them to status for the back-off).
    let mut settings = env.app.settings.clone();
    if env.app.template.is_none() {
        settings.template_fingerprint = (state.create_backoff.as_ref())
            .and_then(|b| b.template.clone())
            .or(settings.template_fingerprint);
    }
    // The one definition of "converged": the step's own, on this snapshot and state.
    let plan = alloc::step(&snap, &state, &settings, &Request::target(None), now_ms());
    let (converged, blocked, why) = match &plan {
        Ok(plan) => (
            plan.summary.converged,
            plan.blocked.clone(),
            reasons(plan, &snap),
        ),
        Err(e) => (false, None, vec![e.to_string()]),
    };
    let c = StatusCounts {
        app_id: env.app.app_id.clone(),
        namespace: env.client.namespace().to_string(),
        home: home(&env),
        target: total_target(&state),
        counts: alloc::PhaseCounts {
            running: count(ExecutorState::Running),
            pending: count(ExecutorState::Pending),
            unacknowledged: unack,
            failed: count(ExecutorState::Failed),
            succeeded: count(ExecutorState::Succeeded),
            deleting: count(ExecutorState::Deleted),
            unknown: count(ExecutorState::Unknown),
        },
        last_executor_id: state.last_executor_id.max(snap.max_id()),
        converged,
        blocked,
        not_converged_because: why,
        executors,
        counters: state.counters.clone(),
        // As the step reads it: within the documented cap.
        create_backoff: (plan.as_ref().ok()).and_then(|p| p.state.create_backoff.clone()),
        owner: env.owner()?,
        leader: leader_info(&env, a.leader_elect_resource_name.as_deref())?,
        queued_requests: env.queued()?,
        profiles: profile_counts(&state, plan.as_ref().ok(), &snap),
    };
    match a.output {
        Output::Json => super::print_out(&serde_json::to_string_pretty(&c).expect("serializes")),
        Output::Text => super::print_out(&text(&c)),
    }
}

/// The app's target over all its resource profiles (`None`: none was ever set), as the
/// counts beside it are: profile 0's alone read as "target 2, running 5" for an app with 3
/// running in profile 1.
fn total_target(state: &alloc::AllocatorState) -> Option<u32> {
    let all = state.targets();
    (!all.is_empty()).then(|| all.values().fold(0u32, |t, n| t.saturating_add(*n)))
}

/// Why the plan says the app is not converged: the blocked reason, then what the next tick
/// would do and what it waits for. Empty when converged.
fn reasons(plan: &alloc::Plan, snap: &crate::engine::snapshot::Snapshot) -> Vec<String> {
    let s = &plan.summary;
    if s.converged {
        return Vec::new();
    }
    let mut why = Vec::new();
    match &plan.blocked {
        // The halt below says it with the reason.
        Some(alloc::Blocked::CrashLoop) | None => {}
        Some(b) => why.push(format!("creation is blocked: {b}")),
    }
    if let Some(h) = &plan.halt {
        why.push(format!("the crash-loop guard halted creation: {h}"));
    }
    let (n, target) = (&s.counts, s.target);
    if n.running < target {
        why.push(format!("running {} of target {target}", n.running));
    } else if n.running > target {
        why.push(format!("running {} above target {target}", n.running));
    }
    if n.pending > 0 {
        why.push(format!("{} pending{}", n.pending, pending_why(snap)));
    }
    if n.unacknowledged > 0 {
        why.push(format!("{} created but not yet seen", n.unacknowledged));
    }
    if s.created > 0 || s.deleted > 0 {
        why.push(format!(
            "the next tick would create {} and delete {}",
            s.created, s.deleted
        ));
    }
    why
}

/// The app's home for `status` ([`StatusCounts::home`]).
fn home(env: &super::env::Env) -> String {
    match &env.store_kind {
        crate::cli::StateStoreKind::File => format!("file:{}", env.state_path.display()),
        _ => env.state_location(),
    }
}

/// The text output: the app, the counts, the ids by state, converged or why not.
fn text(c: &StatusCounts) -> String {
    let target = c.target.map_or("unset".to_string(), |t| t.to_string());
    let n = &c.counts;
    let mut out = format!(
        "app {} in namespace {} (home {})\n\
         target={target} running={} pending={} unacknowledged={} failed={} succeeded={} deleting={} unknown={}\n",
        c.app_id, c.namespace, c.home,
        n.running, n.pending, n.unacknowledged, n.failed, n.succeeded, n.deleting, n.unknown
    );
    for (p, k) in &c.profiles {
        out.push_str(&format!(
            "profile {p}: target={} running={} pending={} unacknowledged={}\n",
            k.target, k.running, k.pending, k.unacknowledged
        ));
    }
    for (state, ids) in &c.executors {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        let name = serde_json::to_value(state).expect("serializes");
        out.push_str(&format!(
            "{}: {}\n",
            name.as_str().unwrap_or("?"),
            ids.join(" ")
        ));
    }
    if let Some(o) = &c.owner {
        out.push_str(&format!(
            "owner: {o}; scale, add and remove are applied at its next tick\n"
        ));
    }
    if let Some(l) = &c.leader {
        let holder = match l.holder.is_empty() {
            true => "none (released)",
            false => &l.holder,
        };
        out.push_str(&format!(
            "leader: {holder} (lease {}, renewed {}, {} transitions)\n",
            l.lease, l.renew_time, l.transitions
        ));
    }
    for r in &c.queued_requests {
        out.push_str(&format!(
            "queued: {} (request {}, from {}), applied at the owner's next tick\n",
            r.op, r.id, r.by
        ));
    }
    if c.converged {
        out.push_str("converged");
        if let Some(t) = c.target.filter(|t| c.counts.running > *t) {
            // As Spark's allocator: lowering the target deletes excess pending pods and
            // requests, never running executors.
            out.push_str(&format!(
                " ({} running above the target of {t}: running executors are not deleted to \
                 shrink; `remove ID…` deletes named ones)",
                c.counts.running - t
            ));
        }
    } else {
        out.push_str("not converged: ");
        out.push_str(&c.not_converged_because.join("; "));
    }
    out
}

/// What keeps the pending pods from running, as the snapshot shows it: their waiting reasons
/// (with the image, e.g. `ImagePullBackOff (image X)`) and Unschedulable, with counts; empty
/// when they are simply starting.
fn pending_why(snap: &crate::engine::snapshot::Snapshot) -> String {
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    for p in snap.executors.values() {
        if p.state != ExecutorState::Pending {
            continue;
        }
        let why = match (&p.waiting, p.unschedulable) {
            (Some(w), _) => w.clone(),
            (None, true) => "Unschedulable".to_string(),
            (None, false) => continue,
        };
        *by.entry(why).or_insert(0) += 1;
    }
    if by.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = by.iter().map(|(w, n)| format!("{w} ×{n}")).collect();
    format!(": {}", parts.join(", "))
}
