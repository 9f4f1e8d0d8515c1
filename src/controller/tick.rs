//! The tick, the imperative shell around the pure core:
//! list → snapshot → plan → (write-ahead save) → delete/create calls → record results → save.
//!
//! The plan assumes nothing about whether calls succeed; the saved state records what really
//! happened. Creates are written to the state as unacknowledged *before* the calls are made,
//! so a crash between a create and the save can never lead to an id being reused or a pod
//! created twice: the next tick either sees the pod or times the id out.

use crate::engine::alloc::{self, AllocatorState, Outcomes, Plan, Request, Steering, Summary};
use crate::engine::podspec::Owner;
use crate::engine::snapshot::{
    DriverState, For, Snapshot, LABEL_APP, LABEL_EXEC_ID, LABEL_ROLE, ROLE_EXECUTOR,
};
use crate::error::{Error, Result};
use crate::kube::{FieldValidation, KubeClient, KubeError, ListParams, PageSink, PostParams, PODS};
use crate::store::file::{store_error, StateStore};
use log::{info, warn};
use serde_json::Value;
use std::collections::BTreeMap;

pub use super::app::App;
pub use super::points::CRASH_POINTS;
use super::services::Services;

/// What a tick remembers of its app between ticks: the runner's slot keeps one per app, a
/// one-shot command a fresh one.
#[derive(Debug, Default)]
pub struct Memory {
    /// The state this process last saved for the app (`None`: none yet, or its last save
    /// failed): a loaded state that is not this one was written by another process, and its
    /// unacknowledged creates are [`AllocatorState::inherited`].
    saved: Option<AllocatorState>,
    /// The blocked reason last logged (`None`: no tick yet; `Some(None)`: not blocked).
    last_blocked: Option<Option<String>>,
}

impl Memory {
    /// Whether `state` (just loaded) is the one this process last saved.
    fn written_here(&self, state: &AllocatorState) -> bool {
        state.unacknowledged.is_empty()
            || self.saved.as_ref().is_some_and(|s| {
                s.unacknowledged == state.unacknowledged
                    && s.last_executor_id == state.last_executor_id
            })
    }

    /// Whether `why` (the tick's blocked reason, `None`: not blocked) differs from the one
    /// last seen; remembers it. A first tick that is not blocked is no change.
    fn blocked_changed(&mut self, why: Option<&str>) -> bool {
        let before = self.last_blocked.replace(why.map(str::to_string));
        match before {
            None => why.is_some(),
            Some(b) => b.as_deref() != why,
        }
    }
}

/// What a tick works with besides the cluster and the store: the process's services and
/// the app's memory.
pub struct TickCx<'a> {
    /// The process's services (test points, Events, the delete mode per namespace).
    pub services: &'a Services,
    /// The app's memory ([`Memory`]).
    pub memory: &'a mut Memory,
}

/// What one tick did.
#[derive(Debug, Clone)]
pub struct TickReport {
    /// The plan as made.
    pub plan: Plan,
    /// Pods created (201, or 409 for our own pod).
    pub created: u32,
    /// Pods deleted (or already gone).
    pub deleted: u32,
    /// Unacknowledged executors after the tick.
    pub unacknowledged: u32,
    /// The first error of the tick, if any (state was saved before it was returned).
    pub error: Option<Error>,
    /// The state as saved at the end of the tick.
    pub state: AllocatorState,
    /// When the next tick is due at the latest, ms from the tick's start, from the saved state
    /// ([`alloc::requeue_after_ms`]); `None`: nothing waits on time.
    pub requeue_after_ms: Option<u64>,
    /// The steering requests this tick applied, in order.
    pub applied: Vec<Steering>,
    /// Steering requests still queued after this tick (they wait for the next one).
    pub pending_requests: u32,
    /// A create was refused in a way creation now backs off from (quota, template,
    /// admission): a loop goes on and lets the back-off pace it, where a one-shot command
    /// exits with `error`'s code.
    pub backing_off: bool,
}

impl TickReport {
    /// Converged: running = target with nothing pending, unacknowledged or planned.
    pub fn converged(&self) -> bool {
        self.plan.summary.converged && self.error.is_none()
    }

    /// The one summary line logged per tick.
    pub fn line(&self) -> String {
        let s: &Summary = &self.plan.summary;
        format!(
            "target={} running={} pending={} unacknowledged={} created={} deleted={}{}",
            s.target,
            s.counts.running,
            s.counts.pending,
            self.unacknowledged,
            self.created,
            self.deleted,
            if s.counts.failed > 0 {
                format!(" failed={}", s.counts.failed)
            } else {
                String::new()
            }
        )
    }
}

/// Converts a client error into the CLI's error with the right exit code: a bad
/// configuration is 2; refusals that another try would meet again (the pod template: 400,
/// 422; admission: Pod Security, webhooks, admission policies; RBAC; a quota that can never
/// admit the template; [`super::refusals`] names each) and TLS failures (untrusted
/// certificate, wrong host name) are permanent, 4; the rest is 1.
pub fn kube_error(e: KubeError) -> Error {
    let msg = e.to_string();
    if let Some(r) = super::refusals::classify(&e) {
        let line = format!("{msg} ({})", r.hint());
        return match r.is_permanent() {
            true => Error::refused(line),
            false => Error::runtime(line),
        };
    }
    match e {
        KubeError::Config(_) => Error::usage(msg),
        // An untrusted certificate or a wrong host name fails the same way every time.
        KubeError::Transport {
            kind: crate::kube::TransportKind::Tls,
            ..
        } => Error::refused(format!(
            "{msg} (retrying will not help: check the CA (--certificate-authority or the \
             kubeconfig's certificate-authority) and the server name)"
        )),
        _ => Error::runtime(msg),
    }
}

/// Collects the pages of the pod list into a snapshot. A 410 Gone restarts the list from
/// the first page: what was collected is dropped.
struct SnapshotSink<'a> {
    app_id: &'a str,
    container: Option<&'a str>,
    snap: Snapshot,
    /// Why a page could not be used, when that ended the list.
    parse_error: Option<String>,
}

impl PageSink for SnapshotSink<'_> {
    type Error = KubeError;

    /// Pages are decoded as they arrive (`Snapshot::read_page`).
    fn bounded_memory(&self) -> bool {
        true
    }

    /// The snapshot reads Protobuf pages too.
    fn accepts_protobuf(&self) -> bool {
        true
    }

    fn restart(&mut self) {
        self.snap = Snapshot::default();
    }

    fn page(&mut self, body: &[u8]) -> std::result::Result<Option<String>, KubeError> {
        self.snap
            .read_page(body, For::app(self.app_id).container(self.container))
            .map_err(|e| {
                self.parse_error = Some(e.to_string());
                KubeError::Decode {
                    what: "pod list".into(),
                    message: e.to_string(),
                }
            })
    }

    /// Decodes the page while it arrives (no copy of the page is held). A failed read is
    /// the client's to report, so it is not recorded as an unusable list.
    fn page_reader(
        &mut self,
        body: &mut dyn std::io::Read,
    ) -> std::result::Result<Option<String>, KubeError> {
        let res = (self.snap).read_page(body, For::app(self.app_id).container(self.container));
        res.map_err(|e| {
            if !matches!(e, crate::engine::snapshot::SnapshotError::Read(_)) {
                self.parse_error = Some(e.to_string());
            }
            KubeError::Decode {
                what: "pod list".into(),
                message: e.to_string(),
            }
        })
    }
}

/// Lists the app's executor pods into a snapshot (one list per tick, paginated).
///
/// Errors: the API's (exit 1/4), or a malformed PodList (exit 1: the server sent it).
pub fn list_snapshot(client: &KubeClient, app: &App) -> Result<Snapshot> {
    let selector = app.label_selector();
    let lp = ListParams {
        label_selector: &selector,
        field_selector: None,
        limit: (app.page_size > 0).then_some(app.page_size),
    };
    let mut sink = SnapshotSink {
        app_id: &app.app_id,
        container: app.settings.executor_container.as_deref(),
        snap: Snapshot::default(),
        parse_error: None,
    };
    let res = client.api(&PODS).list(&lp, &mut sink);
    if let Err(e) = res {
        return Err(match sink.parse_error {
            Some(p) => Error::runtime(format!(
                "the pod list from the API server (namespace {}) could not be used: {p}",
                client.namespace()
            )),
            None => kube_error(e),
        });
    }
    let snap = sink.snap;
    for w in &snap.warnings {
        warn!("{w}");
    }
    Ok(snap)
}

/// Reads the driver pod: its ownerReference for new executors, and its lifecycle
/// ([`DriverState`]). A missing driver pod is an error naming the pod and the namespace
/// (exit 2), as Spark's allocator refuses to start without it.
pub fn read_driver(client: &KubeClient, name: &str) -> Result<(Owner, DriverState)> {
    read_driver_if_any(client, name)?.ok_or_else(|| no_driver(client, name))
}

/// The error for a driver pod that does not exist (exit 2), naming it and the namespace.
fn no_driver(client: &KubeClient, name: &str) -> Error {
    Error::usage(format!(
        "no driver pod named {name:?} in namespace {:?}: check --driver-pod and -n/--namespace",
        client.namespace()
    ))
}

/// [`read_driver`], with `None` when the pod does not exist.
fn read_driver_if_any(client: &KubeClient, name: &str) -> Result<Option<(Owner, DriverState)>> {
    let Some(pod) = client.api(&PODS).get(name).map_err(kube_error)? else {
        return Ok(None);
    };
    let meta = &pod["metadata"];
    let uid = meta["uid"].as_str().unwrap_or_default().to_string();
    if uid.is_empty() {
        return Err(Error::runtime(format!(
            "driver pod {name:?} has no metadata.uid"
        )));
    }
    let deleting = !meta["deletionTimestamp"].is_null();
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    let owner = Owner {
        name: name.to_string(),
        uid,
    };
    Ok(Some((owner, DriverState::of(deleting, phase))))
}

/// Runs one tick under the held lock `store`: list → step → save (write-ahead) → apply →
/// record → save. `now_ms` is the wall clock in ms; `request` says how the target changes and
/// which executors to remove; `cx` the process's services and the app's memory.
///
/// Returns `Err` only when nothing was changed (listing failed, bad state, no target);
/// otherwise a report whose `error` says what went wrong after the state was saved.
pub fn tick(
    cx: &mut TickCx<'_>,
    client: &KubeClient,
    app: &App,
    store: &mut dyn StateStore,
    request: &Request,
    now_ms: u64,
) -> Result<TickReport> {
    tick_listed(cx, client, app, store, request, None, now_ms)
}

/// As [`tick`], with the app's executor pods already listed when `listed` is given (one list
/// call per namespace serving many apps: the caller splits it per app); `None` lists them.
pub fn tick_listed(
    cx: &mut TickCx<'_>,
    client: &KubeClient,
    app: &App,
    store: &mut dyn StateStore,
    request: &Request,
    listed: Option<Snapshot>,
    now_ms: u64,
) -> Result<TickReport> {
    client.reset_retry_budget();
    let errors_before = client.stats().errors_by_code;
    let res = tick_inner(
        cx,
        client,
        app,
        store,
        (request, listed),
        now_ms,
        &errors_before,
    );
    // A tick that failed before acting leaves the state untouched, its API errors included:
    // the metrics file shows the failure (`podalloc_tick_success 0`), the state file is
    // written only by ticks that act.
    res
}

/// API error responses since `before`, by HTTP code.
fn errors_since(client: &KubeClient, before: &BTreeMap<u16, u64>) -> BTreeMap<u16, u64> {
    let now = client.stats().errors_by_code;
    now.into_iter()
        .map(|(code, n)| {
            (
                code,
                n.saturating_sub(before.get(&code).copied().unwrap_or(0)),
            )
        })
        .filter(|&(_, n)| n > 0)
        .collect()
}

fn tick_inner(
    cx: &mut TickCx<'_>,
    client: &KubeClient,
    app: &App,
    store: &mut dyn StateStore,
    (request, listed): (&Request, Option<Snapshot>),
    now_ms: u64,
    errors_before: &BTreeMap<u16, u64>,
) -> Result<TickReport> {
    let loaded = store.load().map_err(store_error)?;
    let loaded = loaded.unwrap_or_else(AllocatorState::new);
    let points = &cx.services.points;
    let state = if cx.memory.written_here(&loaded) {
        loaded.clone()
    } else {
        loaded.clone().inherited()
    };
    let queue = store.requests().map_err(store_error)?;
    let (mut request, taken) = queued_requests(&state, &queue, request);
    let home_app = follow_home(store, app, &mut request)?;
    let app = home_app.as_ref().unwrap_or(app);
    let mut snapshot = listed.map_or_else(|| list_snapshot(client, app), Ok)?;
    let owner = driver_owner(client, app, &state, &mut snapshot)?;
    points.crash("after-list");
    let mut plan = alloc::step(&snapshot, &state, &app.settings, &request, now_ms)
        .map_err(|e| Error::usage(e.to_string()))?;
    plan.state.applied_requests = applied_after(&state, &queue, &taken);
    log_plan(cx.memory, &state, &snapshot, &plan);
    log_taken(&taken);
    // Write-ahead: the ids about to be created, and the requests applied, are recorded
    // before any call is made. A tick that changes nothing writes nothing.
    points.crash("before-write-ahead");
    // Compared with what the store holds (not the inherited reading of it).
    if plan.state != loaded {
        store.save(&plan.state).map_err(store_error)?;
        cx.memory.saved = Some(plan.state.clone());
    }
    points.crash("after-write-ahead");
    points.pause("after-write-ahead", |d| cx.services.nap(d));
    // The requests the saved state lists as applied leave the queue (also those of an
    // earlier tick that died before removing them).
    let ids = &plan.state.applied_requests;
    let gone = match ids.is_empty() {
        true => Vec::new(),
        false => store.consumed(ids),
    };
    let Applied {
        mut out,
        mut error,
        uids,
    } = apply(
        cx.services,
        client,
        app,
        (&plan, owner.as_ref()),
        errors_before,
    );
    if let (Some(why), Some(name)) = (&plan.driver_ended, &app.driver_pod) {
        error.get_or_insert(Error::driver_ended(format!(
            "driver pod {name:?} {why}: its {} executor pod(s) deleted, none will be created; \
             the application has ended",
            out.deleted
        )));
    }
    out.api_errors = errors_since(client, errors_before);
    out.throttled = throttled(&out.api_errors);
    let mut state = alloc::record(&plan, &out, &app.settings, now_ms);
    state.applied_requests.retain(|id| !gone.contains(id));
    final_save(cx, store, &plan, &state)?;
    log_outcomes(&plan, &out, &state);
    let done = crate::controller::events::Done {
        out: &out,
        uids: &uids,
        error: error.as_ref(),
        driver: owner.as_ref(),
        app_id: &app.app_id,
    };
    let poster = &cx.services.events;
    crate::controller::events::record_tick(poster, client, &snapshot, &plan, &done, now_ms);
    let pending_requests = (queue.iter())
        .filter(|r| !plan.state.applied_requests.contains(&r.id))
        .count() as u32;
    Ok(TickReport {
        requeue_after_ms: alloc::requeue_after_ms(&state, &app.settings, now_ms),
        unacknowledged: state.unacknowledged.len() as u32,
        plan,
        created: out.created.len() as u32,
        deleted: out.deleted,
        error,
        state,
        applied: taken,
        pending_requests,
        backing_off: out.refused.is_some() || out.quota.is_some(),
    })
}

/// After the calls: hands the store what the tick saw ([`StateStore::observe`]), saves
/// `state` when it changed beyond the clock (a converged tick writes nothing), then publishes
/// the rest ([`StateStore::publish`]: a failure there is a warning, written again next
/// tick). Errors: the save's (this process then reads the store back as a successor would).
fn final_save(
    cx: &mut TickCx<'_>,
    store: &mut dyn StateStore,
    plan: &Plan,
    state: &AllocatorState,
) -> Result<()> {
    store.observe(&plan.summary, plan.blocked.as_ref());
    if changed_beyond_clock(state, &plan.state) {
        cx.services.points.crash("before-final-save");
        if let Err(e) = store.save(state) {
            // The store keeps the write-ahead state, whose unacknowledged creates this tick
            // may or may not have made (a leader fenced mid-tick made none): this process
            // reads it back as a successor would, so the next step settles them by name
            // instead of waiting out the creation timeout.
            cx.memory.saved = None;
            return Err(store_error(e));
        }
        cx.memory.saved = Some(state.clone());
    }
    cx.services.points.crash("after-final-save");
    cx.services
        .points
        .pause("after-final-save", |d| cx.services.nap(d));
    if let Err(e) = store.publish() {
        warn!("{e}; the status is written again next tick");
    }
    Ok(())
}

/// The step's request: `request` (the caller's own) followed by the queued steering
/// requests not yet applied that one step can take ([`alloc::take_requests`]), and those.
fn queued_requests(
    state: &AllocatorState,
    queue: &[Steering],
    request: &Request,
) -> (Request, Vec<Steering>) {
    let fresh: Vec<Steering> = (queue.iter())
        .filter(|r| !state.applied_requests.contains(&r.id))
        .cloned()
        .collect();
    let (request, n) = alloc::take_requests(request, &fresh);
    (request, fresh.into_iter().take(n).collect())
}

/// The step's request and app as the store's home sets them: its target
/// ([`StateStore::home_target`]) and each other resource profile's
/// ([`StateStore::home_profiles`]) as [`alloc::TargetChange::Absolute`] over `request`'s (a
/// seed only fills an empty home), its templates ([`StateStore::home_template`], each
/// profile's) over the flags'; `None`: `app` as it is. Errors: an unusable template in the
/// home (exit 2), a target set by the command (`reconcile --target`, `run --force-target`)
/// that differs from the home's (exit 2: the home's target is changed with `scale`, which
/// keeps the object's history and its clamp; it was silently ignored).
fn follow_home(
    store: &mut dyn StateStore,
    app: &App,
    request: &mut Request,
) -> Result<Option<App>> {
    if let Some(n) = store.home_target() {
        if let alloc::TargetChange::Set(m) = request.target {
            if m != n {
                return Err(Error::usage(format!(
                    "--target {m} conflicts with the target of {}, {n} (its spec.replicas, \
                     clamped): change that target with `podalloc scale {m}` (or `kubectl scale \
                     executorset NAME --replicas {m}`), or leave --target out",
                    store.describe()
                )));
            }
        }
        request.target = alloc::TargetChange::Absolute(n);
    }
    let template = store.home_template().map_err(store_error)?;
    let profiles = store.home_profiles().map_err(store_error)?;
    let mut templates = BTreeMap::new();
    for (p, home) in profiles {
        if let Some(n) = home.target {
            request.profiles.insert(p, alloc::TargetChange::Absolute(n));
        }
        templates.extend(home.template.map(|t| (p, t)));
    }
    if template.is_none() && templates.is_empty() {
        return Ok(None);
    }
    let mut app = app.clone();
    app.template = template.or(app.template);
    app.profile_templates.extend(templates);
    Ok(Some(app))
}

/// Logs the steering requests a tick applies, one line each.
fn log_taken(taken: &[Steering]) {
    for r in taken {
        info!(
            "applying steering request {} ({}) from {}",
            r.id, r.op, r.by
        );
    }
}

/// The ids the saved state lists as applied: those of `state` whose records are still
/// queued (a record once gone never comes back: ids are unique), plus `taken`.
fn applied_after(state: &AllocatorState, queue: &[Steering], taken: &[Steering]) -> Vec<String> {
    let mut ids: Vec<String> = (state.applied_requests.iter())
        .filter(|id| queue.iter().any(|r| &r.id == *id))
        .cloned()
        .collect();
    ids.extend(taken.iter().map(|r| r.id.clone()));
    ids
}

/// Whether `after` differs from `before` in more than the time of the last success, which
/// changes every tick and is folded into the next write that happens anyway (a converged
/// tick writes nothing; `last_success_ms` in the store is that of the last tick that wrote).
fn changed_beyond_clock(after: &AllocatorState, before: &AllocatorState) -> bool {
    let mut a = after.clone();
    a.counters.last_success_ms = before.counters.last_success_ms;
    a != *before
}

/// With `--driver-pod`: reads the driver into `snapshot.driver` and returns it as the owner
/// of new executors. A driver that is gone after this app had executors has ended (deleted,
/// and garbage-collected with its pod); one never seen is a mistake in the flags (exit 2).
fn driver_owner(
    client: &KubeClient,
    app: &App,
    state: &AllocatorState,
    snapshot: &mut Snapshot,
) -> Result<Option<Owner>> {
    let Some(name) = &app.driver_pod else {
        return Ok(None);
    };
    let ran = state.last_executor_id > 0 || !snapshot.executors.is_empty();
    match read_driver_if_any(client, name)? {
        Some((owner, driver)) => {
            snapshot.driver = Some(driver);
            Ok(Some(owner))
        }
        None if ran => {
            snapshot.driver = Some(DriverState::Gone);
            Ok(None)
        }
        None => Err(no_driver(client, name)),
    }
}

/// Logs a target change and the step's own warnings (the snapshot's were logged at listing).
fn log_plan(memory: &mut Memory, state: &AllocatorState, snapshot: &Snapshot, plan: &Plan) {
    if plan.state.target != state.target {
        let from = state.target.map_or("unset".to_string(), |t| t.to_string());
        info!("target {from} → {}", plan.summary.target);
    }
    for w in plan.warnings.iter().skip(snapshot.warnings.len()) {
        warn!("{w}");
    }
    let s = &plan.summary;
    let why = plan.blocked.as_ref().map(|b| b.to_string());
    // Logged when it changes (an operator sees `waiting: … ImagePullBackOff (image …)` once,
    // not every tick); at debug level while it stays the same.
    let level = match memory.blocked_changed(why.as_deref()) {
        true => log::Level::Info,
        false => log::Level::Debug,
    };
    if let Some(b) = &why {
        log::log!(
            level,
            "target {} not reached (running {}): no executor created: {b}",
            s.target,
            s.counts.running
        );
    } else if level == log::Level::Info {
        log::info!(
            "no longer blocked: running {} of {}",
            s.counts.running,
            s.target
        );
    }
}

/// Logs what the calls did: the quota back-off now in force, the pods created.
fn log_outcomes(plan: &Plan, out: &Outcomes, state: &AllocatorState) {
    let refusal = out.refused.as_ref().or(out.quota.as_ref());
    if let (Some(reason), Some(b)) = (refusal, &state.create_backoff) {
        warn!(
            "pod creation refused by the API server ({} in a row); no creates for {} \
             (back-off 10s doubling to 6m): {reason}",
            b.refusals,
            humantime::format_duration(std::time::Duration::from_millis(b.delay_ms)),
        );
    }
    if !out.created.is_empty() {
        let names: Vec<&str> = (plan.create.iter())
            .filter(|c| out.created.contains(&c.executor_id))
            .map(|c| c.pod_name.as_str())
            .collect();
        info!(
            "created {} executor pod(s): {}",
            out.created.len(),
            names.join(", ")
        );
    }
}

/// What [`apply`] did: the outcomes for [`alloc::record`], the tick's first error, and the
/// uids of the pods it created.
#[derive(Default)]
struct Applied {
    out: Outcomes,
    error: Option<Error>,
    /// Executor id → `metadata.uid` of the pod created this tick, from the create's response
    /// (or, after a 409 AlreadyExists for our own pod, from the GET that recognised it), so
    /// that the tick's Events name the pod without reading it again. An id created without
    /// a uid in hand is absent.
    uids: BTreeMap<u64, String>,
}

impl Applied {
    /// The batch stops before `rest`: fresh ids are returned (no pod ever had them:
    /// [`Outcomes::returned`]); ids sent again because an earlier create's outcome is
    /// unknown stay ambiguous (a refusal of a second create does not prove the first one
    /// failed: admission runs before the name is checked).
    fn stop_batch(&mut self, rest: &[alloc::Create]) {
        for c in rest {
            match c.retry {
                true => self.out.ambiguous.push(c.executor_id),
                false => self.out.returned.push(c.executor_id),
            }
        }
    }
}

/// Makes the plan's calls, deletes first, and reports what happened. Decides nothing: a batch
/// stops at its first error as Kubernetes' controllers stop theirs, and a slow-start batch
/// also between two of its groups ([`Plan::create_groups`]) once the server throttles.
fn apply(
    services: &Services,
    client: &KubeClient,
    app: &App,
    (plan, owner): (&Plan, Option<&Owner>),
    errors_before: &BTreeMap<u16, u64>,
) -> Applied {
    let mut a = Applied {
        error: plan.halt.clone().map(Error::crash_loop),
        ..Applied::default()
    };
    let deleted = super::deletes::delete_all(services, client, app, &plan.delete);
    a.out.deleted = deleted.ids.len() as u32;
    a.out.deleted_ids = deleted.ids;
    a.out.not_now = deleted.not_now;
    if let Some(e) = deleted.error {
        a.error.get_or_insert(kube_error(e));
    }
    let group_ends: Vec<usize> = (plan.create_groups.iter())
        .scan(0usize, |end, &g| {
            *end += g as usize;
            Some(*end)
        })
        .collect();
    let mut untemplated = BTreeMap::<u32, u32>::new();
    for (i, c) in plan.create.iter().enumerate() {
        let rest = &plan.create[i..];
        if c.profile != 0 && app.own_profile_templates && app.template_for(c.profile).is_none() {
            // Never profile 0's shape under profile P's label: P's creates wait for its own.
            a.stop_batch(std::slice::from_ref(c));
            *untemplated.entry(c.profile).or_default() += 1;
            continue;
        }
        let Some(template) = app.template_for(c.profile) else {
            // Only `remove` runs without a template: it never creates replacements.
            a.stop_batch(rest);
            warn!(
                "{} executor(s) missing but no pod template given (--template or --image): \
                 none created",
                plan.create.len() - i
            );
            break;
        };
        let pod = template.build_for(&app.app_id, c.executor_id, c.profile, &c.pod_name, owner);
        services.points.crash("before-create");
        let outcome = create_one(client, app, c.executor_id, &c.pod_name, &pod);
        services.points.crash("after-create");
        if let Some(e) = a.take(c, outcome, rest) {
            a.error.get_or_insert(e);
            break;
        }
        let group_done = group_ends.contains(&(i + 1)) && i + 1 < plan.create.len();
        if group_done && throttled(&errors_since(client, errors_before)) {
            info!(
                "slow-start stopped after {} of {} creates: the API server is throttling",
                i + 1,
                plan.create.len()
            );
            a.stop_batch(&plan.create[i + 1..]);
            break;
        }
    }
    for (p, n) in untemplated {
        warn!(
            "{n} executor(s) of resource profile {p} missing but profile {p} has no pod \
             template (its ExecutorSet, spec.resourceProfile: {p}, has no spec.template, and \
             no --profile-template {p}=FILE was given): none created; profile 0's template is \
             not used (its shape is not profile {p}'s): set spec.template of profile {p}'s \
             ExecutorSet, or run with --profile-template {p}=FILE"
        );
    }
    a.out.failed = a.error.is_some();
    a
}

/// 429 or 5xx among `errors` (by HTTP code): the server asks us to slow down.
fn throttled(errors: &BTreeMap<u16, u64>) -> bool {
    errors.keys().any(|&code| code == 429 || code >= 500)
}

impl Applied {
    /// Records one create's outcome; the error that stops the batch, if any. `rest` is this
    /// create and the ones after it.
    fn take(
        &mut self,
        c: &alloc::Create,
        outcome: CreateOutcome,
        rest: &[alloc::Create],
    ) -> Option<Error> {
        match outcome {
            CreateOutcome::Created(uid) => {
                self.out.created.push(c.executor_id);
                if let Some(uid) = uid {
                    self.uids.insert(c.executor_id, uid);
                }
                None
            }
            CreateOutcome::NotOurs => {
                self.out.dropped.push(c.executor_id);
                None
            }
            CreateOutcome::Quota(e) => {
                // The rejected ids never existed (not unacknowledged); creation backs off.
                self.stop_batch(rest);
                self.out.quota = Some(e.message.clone());
                Some(e)
            }
            CreateOutcome::Refused(e, quoted) => {
                // Another create would meet the same refusal: creation backs off.
                self.stop_batch(rest);
                self.out.refused = Some(quoted);
                Some(e)
            }
            CreateOutcome::Rejected(e) => {
                // Definitely not created: this id and the rest of the batch are dropped.
                self.stop_batch(rest);
                Some(e)
            }
            CreateOutcome::Ambiguous(e) => {
                // May have happened: stays unacknowledged and is sent again by name next tick;
                // the rest is not attempted.
                self.out.ambiguous.push(c.executor_id);
                self.stop_batch(&rest[1..]);
                Some(e)
            }
        }
    }
}

enum CreateOutcome {
    /// Created (201, or 409 for our own pod), with the pod's `metadata.uid` when the answer
    /// carried one.
    Created(Option<String>),
    /// A full ResourceQuota: the batch stops, creation backs off.
    Quota(Error),
    /// A refusal another create would meet again (template, admission, a quota that can
    /// never admit the pod), with the server's words to quote: the batch stops, creation
    /// backs off.
    Refused(Error, String),
    NotOurs,
    /// Certainly not created (RBAC, credentials, a conflict that outlasted the retries):
    /// the batch stops.
    Rejected(Error),
    Ambiguous(Error),
}

/// How often a create answered 409 `Conflict` (the quota admission lost a race on the
/// ResourceQuota: nothing was created) is sent again at once before the batch stops.
const CONFLICT_RETRIES: u32 = 3;

fn create_one(client: &KubeClient, app: &App, id: u64, name: &str, pod: &Value) -> CreateOutcome {
    let pods = client.api(&PODS);
    let strict = PostParams {
        field_validation: Some(FieldValidation::Strict),
    };
    let mut res = pods.create(pod, &strict);
    for _ in 0..CONFLICT_RETRIES {
        match &res {
            Err(e) if super::refusals::classify(e) == Some(super::refusals::Refusal::Conflict) => {
                info!("creating pod {name}: {e}; sending it again");
                res = pods.create(pod, &strict);
            }
            _ => break,
        }
    }
    match res {
        Ok(created) => {
            for w in created.warnings {
                warn!("creating pod {name}: the API server warns: {w}");
            }
            CreateOutcome::Created(pod_uid(&created.object))
        }
        Err(e) if e.is_already_exists() => {
            // A create whose response was lost may have happened: a pod of ours with this id
            // is success; anything else under that name is not ours and is left alone.
            match pods.get(name) {
                Ok(Some(existing)) if is_our_pod(&existing, &app.app_id, id) => {
                    info!("pod {name} already exists and is ours: counted as created");
                    CreateOutcome::Created(pod_uid(&existing))
                }
                Ok(_) => {
                    warn!(
                        "pod {name} already exists and is not executor {id} of {}: skipped that id",
                        app.app_id
                    );
                    CreateOutcome::NotOurs
                }
                Err(e) => CreateOutcome::Ambiguous(kube_error(e)),
            }
        }
        Err(e @ KubeError::Api { .. }) if !e.is_retryable() => {
            confirm_refused(&pods, app, id, name, refused(e))
        }
        Err(e @ (KubeError::Config(_) | KubeError::Auth(_))) => {
            CreateOutcome::Rejected(kube_error(e))
        }
        Err(e) => CreateOutcome::Ambiguous(kube_error(e)),
    }
}

/// The outcome of a create the API server answered with a non-retryable error: a full quota
/// backs off; a refusal another create would meet again backs off and quotes the server;
/// the rest (RBAC, a lasting conflict) stops the batch.
fn refused(e: KubeError) -> CreateOutcome {
    use super::refusals::Refusal;
    let quoted = e
        .api_status()
        .map(|s| s.message.clone())
        .unwrap_or_default();
    match super::refusals::classify(&e) {
        Some(Refusal::QuotaExceeded) => CreateOutcome::Quota(kube_error(e)),
        Some(
            Refusal::Template
            | Refusal::Admission(_)
            | Refusal::QuotaNeverAdmits { .. }
            | Refusal::QuotaTooSmall { .. }
            | Refusal::NoNamespace(_)
            | Refusal::NamespaceTerminating(_),
        ) => CreateOutcome::Refused(kube_error(e), quoted),
        _ => CreateOutcome::Rejected(kube_error(e)),
    }
}

/// `outcome`, a refusal that would give executor `id` back (a full quota, a template or
/// admission refusal), checked with a GET of pod `name`: when our pod is there, an earlier
/// send of the same create was carried out and its answer lost, and the client's resend met
/// the refusal (kube-apiserver's quota admission runs before the name is checked, so the
/// resend of a create that filled the quota is a 403 `exceeded quota`, not 409
/// `AlreadyExists`): counted as created, and the id is never handed out again. A GET that
/// fails leaves the id unacknowledged (ambiguous), never given back.
fn confirm_refused(
    pods: &crate::kube::Api<'_>,
    app: &App,
    id: u64,
    name: &str,
    outcome: CreateOutcome,
) -> CreateOutcome {
    if !matches!(
        outcome,
        CreateOutcome::Quota(_) | CreateOutcome::Refused(..)
    ) {
        return outcome;
    }
    match pods.get(name) {
        Ok(Some(existing)) if is_our_pod(&existing, &app.app_id, id) => {
            info!(
                "pod {name} exists and is ours although its create was refused: an earlier \
                 send of it was carried out and its answer lost; counted as created"
            );
            CreateOutcome::Created(pod_uid(&existing))
        }
        Ok(_) => outcome,
        Err(e) => CreateOutcome::Ambiguous(kube_error(e)),
    }
}

/// A pod's non-empty `metadata.uid`, if it has one.
fn pod_uid(pod: &Value) -> Option<String> {
    (pod["metadata"]["uid"].as_str())
        .filter(|u| !u.is_empty())
        .map(str::to_string)
}

fn is_our_pod(pod: &Value, app_id: &str, id: u64) -> bool {
    let l = &pod["metadata"]["labels"];
    l[LABEL_APP] == app_id
        && l[LABEL_ROLE] == ROLE_EXECUTOR
        && l[LABEL_EXEC_ID] == id.to_string().as_str()
}
