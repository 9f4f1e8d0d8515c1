//! The tick, the imperative shell around the pure core:
//! list → snapshot → plan → (write-ahead save) → delete/create calls → record results → save.
//!
//! The plan assumes nothing about whether calls succeed; the saved state records what really
//! happened. Creates are written to the state as unacknowledged *before* the calls are made,
//! so a crash between a create and the save can never lead to an id being reused or a pod
//! created twice: the next tick either sees the pod or times the id out.

use crate::alloc::{self, AllocatorState, Outcomes, Plan, Request, Settings, Summary};
use crate::error::{Error, ExitCode, Result};
use crate::kube::{Deleted, KubeClient, KubeError, PageSink};
use crate::podspec::{Owner, PodTemplate};
use crate::snapshot::{Snapshot, LABEL_APP, LABEL_EXEC_ID, LABEL_ROLE, ROLE_EXECUTOR};
use crate::state::{store_error, StateStore};
use log::{info, warn};
use serde_json::Value;
use std::collections::BTreeMap;

/// Everything a tick needs to know about the application.
#[derive(Debug, Clone)]
pub struct App {
    /// The application id (`spark-app-selector`), already validated as a label value.
    pub app_id: String,
    /// Allocation settings.
    pub settings: Settings,
    /// The executor pod template; `None` only for read-only commands (status, dry run).
    pub template: Option<PodTemplate>,
    /// Driver pod name for ownerReferences.
    pub driver_pod: Option<String>,
    /// Pods per list page (0: no pagination).
    pub page_size: u32,
}

impl App {
    /// The label selector of the app's executor pods:
    /// `spark-app-selector=<app id>,spark-role=executor`.
    pub fn label_selector(&self) -> String {
        format!("{LABEL_APP}={},{LABEL_ROLE}={ROLE_EXECUTOR}", self.app_id)
    }
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
            s.running,
            s.pending,
            self.unacknowledged,
            self.created,
            self.deleted,
            if s.failed > 0 {
                format!(" failed={}", s.failed)
            } else {
                String::new()
            }
        )
    }
}

/// Converts a client error into the CLI's error with the right exit code.
pub fn kube_error(e: KubeError) -> Error {
    let msg = e.to_string();
    match e {
        KubeError::Config(_) => Error::usage(msg),
        KubeError::Api { ref status, .. } if status.code == 403 && !e.is_quota() => {
            Error::refused(format!(
                "{msg} (grant the service account pods get/list/create/delete in this namespace)"
            ))
        }
        KubeError::Api { ref status, .. } if status.code == 422 => {
            Error::refused(format!("{msg} (fix the pod template)"))
        }
        _ => Error::runtime(msg),
    }
}

/// Collects the pages of the pod list into a snapshot. A 410 Gone restarts the list from
/// the first page: what was collected is dropped.
struct SnapshotSink<'a> {
    app_id: &'a str,
    snap: Snapshot,
    /// Why a page could not be used, when that ended the list.
    parse_error: Option<String>,
}

impl PageSink for SnapshotSink<'_> {
    type Error = KubeError;

    fn restart(&mut self) {
        self.snap = Snapshot::default();
    }

    fn page(&mut self, body: &[u8]) -> std::result::Result<Option<String>, KubeError> {
        self.snap.add_page(body, self.app_id).map_err(|e| {
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
        let res =
            self.snap
                .add_page_reader(body, self.app_id, crate::snapshot::ListSource::ApiServer);
        res.map_err(|e| {
            if !matches!(e, crate::snapshot::SnapshotError::Read(_)) {
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
    let limit = (app.page_size > 0).then_some(app.page_size);
    let mut sink = SnapshotSink {
        app_id: &app.app_id,
        snap: Snapshot::default(),
        parse_error: None,
    };
    let res = client.list_pods(&selector, None, limit, &mut sink);
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

/// Reads the driver pod for the ownerReference. A missing driver pod is an error naming the
/// pod and the namespace (exit 2), as Spark's allocator refuses to start without it.
pub fn driver_owner(client: &KubeClient, name: &str) -> Result<Owner> {
    match client.get_pod(name).map_err(kube_error)? {
        Some(pod) => {
            let uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if uid.is_empty() {
                return Err(Error::runtime(format!(
                    "driver pod {name:?} has no metadata.uid"
                )));
            }
            Ok(Owner {
                name: name.to_string(),
                uid,
            })
        }
        None => Err(Error::usage(format!(
            "no driver pod named {name:?} in namespace {:?}: check --driver-pod and -n/--namespace",
            client.namespace()
        ))),
    }
}

/// Runs one tick under the held lock `store`: list → step → save (write-ahead) → apply →
/// record → save. `now_ms` is the wall clock in ms; `request` says how the target changes and
/// which executors to remove.
///
/// Returns `Err` only when nothing was changed (listing failed, bad state, no target);
/// otherwise a report whose `error` says what went wrong after the state was saved.
pub fn tick(
    client: &KubeClient,
    app: &App,
    store: &mut dyn StateStore,
    request: &Request,
    now_ms: u64,
) -> Result<TickReport> {
    client.reset_retry_budget();
    let errors_before = client.stats().errors_by_code;
    let res = tick_inner(client, app, store, request, now_ms, &errors_before);
    if let Err(e) = &res {
        // A tick that failed before acting still counts its API errors (for metrics).
        if matches!(e.code, ExitCode::Runtime | ExitCode::Refused) {
            if let Ok(Some(mut state)) = store.load() {
                if state
                    .counters
                    .add_api_errors(&errors_since(client, &errors_before))
                {
                    let _ = store.save(&state);
                }
            }
        }
    }
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
    client: &KubeClient,
    app: &App,
    store: &mut dyn StateStore,
    request: &Request,
    now_ms: u64,
    errors_before: &BTreeMap<u16, u64>,
) -> Result<TickReport> {
    let state = store.load().map_err(store_error)?;
    let state = state.unwrap_or_else(AllocatorState::new);
    let snapshot = list_snapshot(client, app)?;
    crash_point("after-list");
    let plan = alloc::step(&snapshot, &state, &app.settings, request, now_ms)
        .map_err(|e| Error::usage(e.to_string()))?;
    log_plan(&state, &snapshot, &plan);
    let owner = driver_for_creates(client, app, &plan)?;
    // Write-ahead: the ids about to be created are recorded before any call is made.
    crash_point("before-write-ahead");
    store.save(&plan.state).map_err(store_error)?;
    crash_point("after-write-ahead");
    let Applied { mut out, error } = apply(client, app, &plan, owner.as_ref());
    out.api_errors = errors_since(client, errors_before);
    out.throttled = (out.api_errors.keys()).any(|&code| code == 429 || code >= 500);
    let state = alloc::record(&plan, &out, &app.settings, now_ms);
    if state != plan.state {
        crash_point("before-final-save");
        store.save(&state).map_err(store_error)?;
    }
    crash_point("after-final-save");
    log_outcomes(&plan, &out, &state);
    Ok(TickReport {
        unacknowledged: state.unacknowledged.len() as u32,
        plan,
        created: out.created.len() as u32,
        deleted: out.deleted,
        error,
        state,
    })
}

/// Logs a target change and the step's own warnings (the snapshot's were logged at listing).
fn log_plan(state: &AllocatorState, snapshot: &Snapshot, plan: &Plan) {
    if plan.state.target != state.target {
        let from = state.target.map_or("unset".to_string(), |t| t.to_string());
        info!("target {from} → {}", plan.summary.target);
    }
    for w in plan.warnings.iter().skip(snapshot.warnings.len()) {
        warn!("{w}");
    }
    if let Some(b) = &plan.blocked {
        let s = &plan.summary;
        info!(
            "target {} not reached (running {}): no executor created: {b}",
            s.target, s.running
        );
    }
}

/// The driver pod's ownerReference, read only when the plan creates pods.
fn driver_for_creates(client: &KubeClient, app: &App, plan: &Plan) -> Result<Option<Owner>> {
    match (&app.driver_pod, plan.create.is_empty()) {
        (Some(name), false) => Ok(Some(driver_owner(client, name)?)),
        _ => Ok(None),
    }
}

/// Logs what the calls did: the quota back-off now in force, the pods created.
fn log_outcomes(plan: &Plan, out: &Outcomes, state: &AllocatorState) {
    if let (Some(reason), Some(b)) = (&out.quota, &state.create_backoff) {
        warn!(
            "pod creation rejected by a quota; no creates for {}: {reason}",
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

/// What [`apply`] did: the outcomes for [`alloc::record`], and the tick's first error.
#[derive(Default)]
struct Applied {
    out: Outcomes,
    error: Option<Error>,
}

impl Applied {
    /// The batch stops before `rest`: fresh ids are dropped (never created, ids stay
    /// consumed); ids sent again because an earlier create's outcome is unknown stay
    /// ambiguous (a quota or other rejection of a second create does not prove the first one
    /// failed).
    fn stop_batch(&mut self, rest: &[alloc::Create]) {
        for c in rest {
            match c.retry {
                true => self.out.ambiguous.push(c.executor_id),
                false => self.out.dropped.push(c.executor_id),
            }
        }
    }
}

/// Makes the plan's calls, deletes first, and reports what happened. Decides nothing: a batch
/// stops at its first error as Kubernetes' controllers stop theirs.
fn apply(client: &KubeClient, app: &App, plan: &Plan, owner: Option<&Owner>) -> Applied {
    let mut a = Applied {
        error: plan.halt.clone().map(Error::crash_loop),
        ..Applied::default()
    };
    for d in &plan.delete {
        delete_logged(client, d, &mut a);
    }
    for (i, c) in plan.create.iter().enumerate() {
        let rest = &plan.create[i..];
        let Some(template) = app.template.as_ref() else {
            // Only `remove` runs without a template: it never creates replacements.
            a.stop_batch(rest);
            warn!(
                "{} executor(s) missing but no pod template given (--template or --image): \
                 none created",
                plan.create.len() - i
            );
            break;
        };
        let pod = template.build(&app.app_id, c.executor_id, &c.pod_name, owner);
        crash_point("before-create");
        let outcome = create_one(client, app, c.executor_id, &c.pod_name, &pod);
        crash_point("after-create");
        let stop = match outcome {
            CreateOutcome::Created => {
                a.out.created.push(c.executor_id);
                None
            }
            CreateOutcome::NotOurs => {
                a.out.dropped.push(c.executor_id);
                None
            }
            CreateOutcome::Quota(e) => {
                // The rejected ids never existed (not unacknowledged); creation backs off.
                a.stop_batch(rest);
                a.out.quota = Some(e.message.clone());
                Some(e)
            }
            CreateOutcome::Rejected(e) => {
                // Definitely not created: this id and the rest of the batch are dropped.
                a.stop_batch(rest);
                Some(e)
            }
            CreateOutcome::Ambiguous(e) => {
                // May have happened: stays unacknowledged and is sent again by name next tick;
                // the rest is not attempted.
                a.out.ambiguous.push(c.executor_id);
                a.stop_batch(&rest[1..]);
                Some(e)
            }
        };
        if let Some(e) = stop {
            a.error.get_or_insert(e);
            break;
        }
    }
    a.out.failed = a.error.is_some();
    a
}

/// One planned delete, logged, its outcome counted.
fn delete_logged(client: &KubeClient, d: &alloc::Delete, a: &mut Applied) {
    crash_point("before-delete");
    let res = delete_one(client, d);
    crash_point("after-delete");
    match res {
        Ok(true) => {
            a.out.deleted += 1;
            info!(
                "deleted executor {} ({}, {})",
                d.executor_id, d.pod_name, d.reason
            );
        }
        Ok(false) => {}
        Err(e) => {
            warn!(
                "could not delete executor {} ({}): {e}",
                d.executor_id, d.pod_name
            );
            a.error.get_or_insert(kube_error(e));
        }
    }
}

/// Deletes one pod. `Ok(true)` when deleted or already gone, `Ok(false)` when skipped because
/// it is no longer pending (excess deletes only) or changed since it was read.
fn delete_one(client: &KubeClient, d: &alloc::Delete) -> std::result::Result<bool, KubeError> {
    if d.if_pending {
        // Spark restricts excess deletes to status.phase=Pending: read the pod now, and delete
        // it only if still pending, with preconditions so a change in between is a 409.
        let Some(pod) = client.get_pod(&d.pod_name)? else {
            return Ok(true);
        };
        let meta = &pod["metadata"];
        if !meta["deletionTimestamp"].is_null() {
            return Ok(true);
        }
        let phase = pod["status"]["phase"].as_str().unwrap_or("");
        if phase != "Pending" {
            info!(
                "executor {} ({}) is {phase} now, not pending: not deleted as excess",
                d.executor_id, d.pod_name
            );
            return Ok(false);
        }
        let uid = meta["uid"].as_str().unwrap_or("");
        let rv = meta["resourceVersion"].as_str().unwrap_or("");
        return match client.delete_pod(&d.pod_name, Some((uid, rv))) {
            Ok(_) => Ok(true),
            Err(KubeError::Api { ref status, .. }) if status.code == 409 => {
                info!(
                    "executor {} ({}) changed since it was read: left for the next tick",
                    d.executor_id, d.pod_name
                );
                Ok(false)
            }
            Err(e) => Err(e),
        };
    }
    match client.delete_pod(&d.pod_name, None)? {
        Deleted::Deleted | Deleted::NotFound => Ok(true),
    }
}

enum CreateOutcome {
    Created,
    Quota(Error),
    NotOurs,
    Rejected(Error),
    Ambiguous(Error),
}

fn create_one(client: &KubeClient, app: &App, id: u64, name: &str, pod: &Value) -> CreateOutcome {
    match client.create_pod(pod) {
        Ok(_) => CreateOutcome::Created,
        Err(KubeError::Api { ref status, .. })
            if status.code == 409 && status.reason == "AlreadyExists" =>
        {
            // A create whose response was lost may have happened: a pod of ours with this id
            // is success; anything else under that name is not ours and is left alone.
            match client.get_pod(name) {
                Ok(Some(existing)) if is_our_pod(&existing, &app.app_id, id) => {
                    info!("pod {name} already exists and is ours: counted as created");
                    CreateOutcome::Created
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
        Err(e) if e.is_quota() => CreateOutcome::Quota(Error::runtime(e.to_string())),
        Err(e @ KubeError::Api { .. }) if !e.is_retryable() => {
            CreateOutcome::Rejected(kube_error(e))
        }
        Err(e @ (KubeError::Config(_) | KubeError::Auth(_))) => {
            CreateOutcome::Rejected(kube_error(e))
        }
        Err(e) => CreateOutcome::Ambiguous(kube_error(e)),
    }
}

fn is_our_pod(pod: &Value, app_id: &str, id: u64) -> bool {
    let l = &pod["metadata"]["labels"];
    l[LABEL_APP] == app_id
        && l[LABEL_ROLE] == ROLE_EXECUTOR
        && l[LABEL_EXEC_ID] == id.to_string().as_str()
}

/// Crash points of a tick, for the crash-safety harness (tests/crash.rs): with
/// `PODALLOC_CRASH_AT=POINT[:N]` in the environment the process kills itself with SIGKILL at
/// the N-th (default first) time it reaches POINT. Points: `after-list`, `before-write-ahead`,
/// `after-write-ahead`, `before-delete`, `after-delete`, `before-create`, `after-create`,
/// `before-final-save`, `after-final-save`. Unset (always, outside tests), this does nothing.
pub const CRASH_POINTS: &[&str] = &[
    "after-list",
    "before-write-ahead",
    "after-write-ahead",
    "before-delete",
    "after-delete",
    "before-create",
    "after-create",
    "before-final-save",
    "after-final-save",
];

fn crash_point(point: &str) {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    static SPEC: OnceLock<Option<(String, u32)>> = OnceLock::new();
    static SEEN: AtomicU32 = AtomicU32::new(0);
    let spec = SPEC.get_or_init(|| {
        let v = std::env::var("PODALLOC_CRASH_AT").ok()?;
        let (p, n) = v.split_once(':').unwrap_or((v.as_str(), "1"));
        Some((p.to_string(), n.parse().unwrap_or(1)))
    });
    if let Some((p, n)) = spec {
        if p == point && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            let _ = signal_hook::low_level::raise(signal_hook::consts::SIGKILL);
        }
    }
}
