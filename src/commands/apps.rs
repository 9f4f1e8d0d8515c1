//! `podalloc apps`: many applications in one process, from an apps file (`--file`) or from
//! their driver pods (`--discover SELECTOR`).
//!
//! Each pass lists every namespace's executor pods once (`spark-role=executor`, paginated)
//! and splits the list by app ([`crate::multi::Split`]); then each app's tick runs on its own
//! share ([`reconcile::tick_listed`]) under its own state lock. One app's failure is one log
//! line naming it and never stops the others: a runtime error (exit 1) or a held lock (3) is
//! retried at the next pass; anything else (bad template, RBAC, the crash-loop guard) stops
//! that app; a finished driver (7) has its executors deleted and the app is dropped.

use super::env::now_ms;
use super::sim::{start_simulator, SimGuard};
use crate::alloc::Request;
use crate::alloc::StateOwner;
use crate::cli::{AppArgs, Cli, StateStoreKind};
use crate::cmstore::ConfigMapStore;
use crate::error::{Error, ExitCode, Result};
use crate::kube::{self, ClientOptions, ConnectionFlags, KubeClient, KubeError, PageSink};
use crate::leader::LeaderElection;
use crate::multi::{self, AppEntry, AppsArgs, Driver, Split};
use crate::reconcile::{self, App};
use crate::snapshot::{ExecutorState, Snapshot, LABEL_ROLE, ROLE_EXECUTOR};
use crate::state::{self, Bound, Holder, LockedStore, StateStore, StoreError};
use log::{error, info, warn};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a `--leader-elect` standby asks whether it leads now.
const STANDBY_POLL: Duration = Duration::from_millis(100);

/// One managed app.
struct Managed {
    ns: String,
    app: App,
    target: Option<u32>,
    store: Store,
    /// The driver's uid when the app was discovered from its driver pod.
    driver_uid: Option<String>,
    converged: bool,
}

/// Where an app's state lives.
enum Store {
    File(PathBuf),
    ConfigMap(String),
}

/// The clients (one per namespace), the flags they are made from, and the simulator.
struct Conn {
    flags: ConnectionFlags,
    /// Timeouts and page cap (`--request-timeout`, …), for every client.
    options: ClientOptions,
    /// How long one app's tick may call the API ([`super::env::tick_budget`]).
    tick_budget: Duration,
    default_ns: String,
    clients: BTreeMap<String, KubeClient>,
    state_dir: StateDir,
    /// `--leader-elect`: the election; every client gets its write fence. Dropped (the
    /// Lease released) before the simulator.
    leader: Option<LeaderElection>,
    _sim: Option<SimGuard>,
}

impl Conn {
    fn new(cli: &Cli, a: &AppsArgs) -> Result<Conn> {
        let (flags, sim) = if cli.conn.simulate {
            start_simulator(&cli.conn)?
        } else {
            (cli.conn.connection_flags(), None)
        };
        let cfg = kube::resolve(&flags).map_err(reconcile::kube_error)?;
        // Under --simulate the states live in the simulator's temporary directory.
        let state_dir = (a.state_dir.clone())
            .or_else(|| sim.as_ref().map(|s| s.state_file().with_file_name("apps")));
        let mut c = Conn {
            flags,
            options: cli.conn.client_options(),
            tick_budget: super::env::tick_budget(cli),
            default_ns: cfg.namespace.clone(),
            clients: BTreeMap::new(),
            state_dir: StateDir {
                dir: state_dir,
                configmap: a.state_configmaps.clone(),
            },
            leader: None,
            _sim: sim,
        };
        let client =
            KubeClient::with_options(cfg, c.options.clone()).map_err(reconcile::kube_error)?;
        c.clients.insert(c.default_ns.clone(), client);
        Ok(c)
    }

    /// The client for `ns`, made at first use. Errors (exit 2): a bad namespace.
    fn client(&mut self, ns: &str) -> Result<&KubeClient> {
        if !self.clients.contains_key(ns) {
            let mut flags = self.flags.clone();
            flags.namespace = Some(ns.to_string());
            let cfg = kube::resolve(&flags).map_err(reconcile::kube_error)?;
            let client = KubeClient::with_options(cfg, self.options.clone())
                .map_err(reconcile::kube_error)?;
            if let Some(le) = &self.leader {
                le.fence(&client);
            }
            self.clients.insert(ns.to_string(), client);
        }
        Ok(&self.clients[ns])
    }
}

/// `podalloc apps`.
pub(super) fn apps(cli: &Cli, a: &AppsArgs) -> Result<()> {
    for (given, flag) in [
        (
            matches!(cli.app.state_store, StateStoreKind::ConfigMap(_)),
            "--state-store configmap:NAME",
        ),
        (cli.app.app_id.is_some(), "--app-id"),
        (cli.app.state_file.is_some(), "--state-file"),
        (cli.app.driver_pod.is_some(), "--driver-pod"),
    ] {
        if given {
            return Err(Error::usage(format!(
                "apps: {flag} is one app's setting; give it per app in the apps file"
            )));
        }
    }
    if cli.metrics_file.is_some() {
        warn!("apps: --metrics-file is not written (metrics are per app in `run` only)");
    }
    let mut conn = Conn::new(cli, a)?;
    let mut apps = Apps::default();
    match (&a.file, &a.discover) {
        (Some(file), _) => apps.load_file(cli, &mut conn, file)?,
        (None, Some(sel)) => apps.discover = Some(Discovery::new(cli, sel)?),
        (None, None) => {
            return Err(Error::usage(
                "apps: give --file FILE or --discover SELECTOR",
            ))
        }
    }
    // One Lease for the process's apps, taken once the apps are known to be usable:
    // --leader-elect stands by while another holds it; without it, the same Lease is a
    // claim, and a second process refuses.
    let client = &conn.clients[&conn.default_ns];
    conn.leader = match super::elect::start_on(client, &a.leader, "apps")? {
        Some(le) => Some(le),
        None => Some(super::elect::claim_on(client, &a.leader, "apps")?),
    };
    // The clients the apps file made already get the fence too (later ones as made).
    if let Some(le) = &conn.leader {
        conn.clients.values().for_each(|c| le.fence(c));
    }
    apps.run(&mut conn, a, cli.app.batch_delay)
}

/// The managed apps and what became of the others.
#[derive(Default)]
struct Apps {
    managed: Vec<Managed>,
    /// Apps stopped by an error (name, error), in order.
    failed: Vec<(String, Error)>,
    discover: Option<Discovery>,
}

/// Why the wait between passes ended.
enum Wake {
    Pass,
    Signal,
    Deadline,
}

impl Apps {
    /// Reads the apps file. An app whose entry cannot be used (bad template, image, app id)
    /// is reported and left out; the others run. Errors (exit 2): the file itself.
    fn load_file(&mut self, cli: &Cli, conn: &mut Conn, file: &Path) -> Result<()> {
        let max = crate::kube::MAX_INPUT_FILE_BYTES;
        let text = crate::kube::read_regular_text(file, max).map_err(|e| {
            Error::usage(format!("cannot read the apps file {}: {e}", file.display()))
        })?;
        let parsed = multi::parse_apps_file(&text, &conn.default_ns)
            .map_err(|e| Error::usage(format!("apps file {}: {e}", file.display())))?;
        let dir = file.parent().unwrap_or(Path::new("."));
        for entry in parsed.apps {
            let name = entry.app_id.clone();
            match entry_app(cli, conn, dir, entry) {
                Ok(m) => self.managed.push(m),
                Err(e) => {
                    error!("app {name}: {e}; not managed");
                    self.failed.push((name, e));
                }
            }
        }
        Ok(())
    }

    fn run(&mut self, conn: &mut Conn, a: &AppsArgs, batch_delay: Duration) -> Result<()> {
        let flag = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, Arc::clone(&flag))
                .map_err(|e| Error::runtime(format!("cannot install the signal handler: {e}")))?;
        }
        let interval = a.interval.unwrap_or(batch_delay);
        let started = Instant::now();
        let deadline = a.timeout.map(|t| started + t);
        let mut passes = 0u64;
        let mut waiting = false;
        loop {
            // --leader-elect: a standby makes no pass (no list, no write) and looks again
            // soon.
            let standby = conn.leader.as_ref().is_some_and(|le| !le.is_leader());
            if standby && !a.leader.leader_elect {
                claim_held(conn, &mut waiting)?;
            }
            if !standby {
                passes += 1;
                self.pass(conn, passes);
                // With --discover, "all converged" needs at least one app found.
                let done = self.managed.iter().all(|m| m.converged)
                    && (self.discover.is_none() || !self.managed.is_empty());
                if a.once || (a.until_converged && done) {
                    if a.until_converged {
                        info!(
                            "{} app(s) converged after {passes} pass(es) in {:.1}s",
                            self.managed.len(),
                            started.elapsed().as_secs_f64()
                        );
                    }
                    return self.outcome();
                }
            }
            let next = if standby {
                interval.min(STANDBY_POLL)
            } else {
                interval
            };
            match wait(Instant::now() + next, deadline, &flag) {
                Wake::Pass => {}
                Wake::Signal => {
                    info!("signal received: stopping after {passes} pass(es); states saved");
                    return Ok(());
                }
                Wake::Deadline if a.until_converged => {
                    let left: Vec<&str> = (self.managed.iter())
                        .filter(|m| !m.converged)
                        .map(|m| m.app.app_id.as_str())
                        .collect();
                    return Err(Error::timeout(format!(
                        "not converged after {passes} pass(es): {}",
                        left.join(", ")
                    )));
                }
                Wake::Deadline => return self.outcome(),
            }
        }
    }

    /// Exit 0, or the first failed app's error (naming it and how many failed).
    fn outcome(&self) -> Result<()> {
        match self.failed.first() {
            None => Ok(()),
            Some((name, e)) => Err(Error {
                code: e.code,
                message: format!(
                    "{} app(s) failed; the first, {name}: {}",
                    self.failed.len(),
                    e.message
                ),
            }),
        }
    }

    /// One pass: discovery (with `--discover`), then per namespace one list and every app's
    /// tick.
    fn pass(&mut self, conn: &mut Conn, pass: u64) {
        let mut gone = Vec::new();
        if let Some(d) = self.discover.as_mut() {
            gone = d.refresh(conn, &mut self.managed);
        }
        let namespaces: BTreeSet<String> = self.managed.iter().map(|m| m.ns.clone()).collect();
        let mut keep = vec![true; self.managed.len()];
        let budget = conn.tick_budget;
        let budget_what = format!(
            "the tick budget of {} (4 × --request-timeout)",
            humantime::format_duration(budget)
        );
        for ns in namespaces {
            let idx: Vec<usize> = (0..self.managed.len())
                .filter(|&i| self.managed[i].ns == ns)
                .collect();
            let client = match conn.client(&ns) {
                Ok(c) => c,
                Err(e) => {
                    for &i in &idx {
                        keep[i] = self.stop(i, e.clone());
                    }
                    continue;
                }
            };
            let ids: Vec<(&str, Option<&str>)> = (idx.iter())
                .map(|&i| {
                    let app = &self.managed[i].app;
                    (
                        app.app_id.as_str(),
                        app.settings.executor_container.as_deref(),
                    )
                })
                .collect();
            let split = match list_split(client, &ids, &gone) {
                Ok(s) => s,
                Err(e) => {
                    warn!("namespace {ns}: pass {pass}: {e}; retrying next pass");
                    continue;
                }
            };
            let mut split = split;
            for g in gone.iter().filter(|g| g.0 == ns) {
                delete_orphans(client, &g.1, split.snaps.remove(&g.1));
            }
            for &i in &idx {
                // Each app's tick has the budget of one `run` tick.
                client.set_deadline(Some(Instant::now() + budget), &budget_what);
                keep[i] = self.tick_app(client, i, &mut split, pass);
                client.set_deadline(None, "");
            }
        }
        let mut k = keep.into_iter();
        self.managed.retain(|_| k.next().unwrap_or(true));
    }

    /// Stops app `i` with `e` (reported); returns false (drop it).
    fn stop(&mut self, i: usize, e: Error) -> bool {
        let m = &self.managed[i];
        error!("app {} (namespace {}): {e}; stopped", m.app.app_id, m.ns);
        if let (Some(d), Some(uid)) = (self.discover.as_mut(), &m.driver_uid) {
            d.stopped.insert(uid.clone(), d.annotations_of(uid));
        }
        self.failed.push((m.app.app_id.clone(), e));
        false
    }

    /// Ticks app `i` on its share of the split; returns whether it stays managed.
    fn tick_app(&mut self, client: &KubeClient, i: usize, split: &mut Split, pass: u64) -> bool {
        let m = &mut self.managed[i];
        let id = m.app.app_id.clone();
        if let Some(e) = split.failed.remove(&id) {
            warn!("app {id}: pass {pass}: the pod list could not be used: {e}; retrying next pass");
            m.converged = false;
            return true;
        }
        let snap = split.snaps.remove(&id).unwrap_or_default();
        for w in &snap.warnings {
            warn!("app {id}: {w}");
        }
        let request = Request::target(m.target);
        let res = match open_store(client, m) {
            Ok(mut store) => reconcile::tick_listed(
                client,
                &m.app,
                store.as_mut(),
                &request,
                Some(snap),
                now_ms(),
            ),
            Err(StoreError::Locked(p, _)) => Err(Error::locked(format!(
                "another podalloc run holds {}; skipped",
                p.display()
            ))),
            Err(e) => Err(state::store_error(e)),
        };
        let err = match res {
            Ok(report) => {
                info!("app {id}: pass {pass}: {}", report.line());
                m.converged = report.converged();
                match report.error {
                    None => return true,
                    Some(e) => e,
                }
            }
            Err(e) => e,
        };
        m.converged = false;
        self.after_error(i, err, pass)
    }

    /// The per-app error policy (as `run`'s, per app); returns whether the app stays.
    fn after_error(&mut self, i: usize, e: Error, pass: u64) -> bool {
        let m = &self.managed[i];
        let id = &m.app.app_id;
        match e.code {
            ExitCode::Runtime | ExitCode::Locked => {
                warn!("app {id}: pass {pass}: {e}; retrying next pass");
                true
            }
            ExitCode::DriverEnded => {
                info!("app {id}: {e}; no longer managed");
                if let Store::File(p) = &m.store {
                    remove_state(p);
                }
                if let (Some(d), Some(uid)) = (self.discover.as_mut(), &m.driver_uid) {
                    d.done.insert(uid.clone());
                }
                false
            }
            _ => self.stop(i, e),
        }
    }
}

/// Opens an app's store for one tick, as `run` does: the file store takes its lock with
/// this process as the holder; the state is bound to its cluster, namespace and app.
fn open_store<'a>(
    client: &'a KubeClient,
    m: &Managed,
) -> std::result::Result<Box<dyn StateStore + 'a>, StoreError> {
    let holder = Holder::current("apps");
    let (inner, check_server): (Box<dyn StateStore + 'a>, bool) = match &m.store {
        Store::File(p) => (Box::new(LockedStore::lock_as(p, &holder)?), true),
        Store::ConfigMap(name) => (
            Box::new(ConfigMapStore::new(client, name, &m.app.app_id)),
            false,
        ),
    };
    let owner = StateOwner {
        server: client.server().to_string(),
        namespace: m.ns.clone(),
        app_id: m.app.app_id.clone(),
    };
    Ok(Box::new(Bound::new(inner, owner, check_server)))
}

/// Removes an ended app's state file and its lock file (missing is fine).
fn remove_state(p: &Path) {
    for f in [p.to_path_buf(), state::lock_path(p)] {
        if let Err(e) = std::fs::remove_file(&f) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!("cannot remove {}: {e}", f.display());
            }
        }
    }
}

/// The pages of the namespace's executor list, split by app.
struct SplitSink {
    split: Split,
    parse_error: Option<String>,
}

impl PageSink for SplitSink {
    type Error = KubeError;

    fn restart(&mut self) {
        self.split.restart();
    }

    fn page(&mut self, body: &[u8]) -> std::result::Result<Option<String>, KubeError> {
        self.split.add_page(body).map_err(|e| {
            self.parse_error = Some(e.to_string());
            KubeError::Decode {
                what: "pod list".into(),
                message: e.to_string(),
            }
        })
    }
}

/// Lists the namespace's executor pods once (`spark-role=executor`), split among `ids`
/// (app id, executor container) and the apps whose driver went away (`gone`).
fn list_split(
    client: &KubeClient,
    ids: &[(&str, Option<&str>)],
    gone: &[(String, String)],
) -> Result<Split> {
    let all = (ids.iter().map(|i| i.0)).chain(gone.iter().map(|g| g.1.as_str()));
    let mut split = Split::for_apps(all);
    for (id, container) in ids {
        if let Some(c) = container {
            split.containers.insert(id.to_string(), c.to_string());
        }
    }
    let mut sink = SplitSink {
        split,
        parse_error: None,
    };
    let page_size = 500;
    let selector = format!("{LABEL_ROLE}={ROLE_EXECUTOR}");
    if let Err(e) = client.list_pods(&selector, None, Some(page_size), &mut sink) {
        return Err(match sink.parse_error {
            Some(p) => Error::runtime(format!("the pod list could not be used: {p}")),
            None => reconcile::kube_error(e),
        });
    }
    Ok(sink.split)
}

/// Deletes the executors of an app whose driver pod is gone (Kubernetes' garbage collector
/// would, through their ownerReference; this does not wait for it).
fn delete_orphans(client: &KubeClient, app_id: &str, snap: Option<Snapshot>) {
    let Some(snap) = snap else { return };
    let mut n = 0;
    for p in snap.executors.values() {
        if p.state == ExecutorState::Deleted {
            continue;
        }
        match client.delete_pod(&p.name, None) {
            Ok(_) => n += 1,
            Err(e) => warn!("app {app_id}: cannot delete executor pod {}: {e}", p.name),
        }
    }
    info!("app {app_id}: driver pod gone: {n} executor pod(s) deleted; no longer managed");
}

/// An apps-file entry lowered into a managed app: the global flags with the entry's
/// values over them.
fn entry_app(cli: &Cli, conn: &mut Conn, dir: &Path, e: AppEntry) -> Result<Managed> {
    let mut args: AppArgs = cli.app.clone();
    let ns = e
        .namespace
        .clone()
        .unwrap_or_else(|| conn.default_ns.clone());
    args.app_id = Some(e.app_id.clone());
    if e.template.is_some() || e.image.is_some() {
        args.template = e.template.map(|t| dir.join(t));
        args.image = e.image;
    }
    args.driver_pod = e.driver_pod;
    if let Some(b) = &e.batch_size {
        args.batch_size = multi::batch_size_of(b).map_err(Error::usage)?;
    }
    let app = args.app(cli.conn.simulate, true)?;
    conn.client(&ns)?;
    let store = match e.state_store.as_deref().map(crate::cli::parse_state_store) {
        Some(Err(msg)) => return Err(Error::usage(format!("state-store: {msg}"))),
        Some(Ok(StateStoreKind::ConfigMap(n))) => Store::ConfigMap(n),
        _ => match e.state_file {
            Some(p) => Store::File(dir.join(p)),
            None => conn.state_dir.store(&ns, &app.app_id),
        },
    };
    Ok(Managed {
        ns,
        app,
        target: e.target,
        store,
        driver_uid: None,
        converged: false,
    })
}

/// `--discover`: the driver pods, what their annotations asked for, what became of them.
struct Discovery {
    selector: String,
    /// The global flags: every discovered app's defaults.
    args: AppArgs,
    /// The template of `--template`/`--image`, for drivers without a template annotation.
    template: Option<crate::podspec::PodTemplate>,
    /// Driver uid → its annotations, as last seen.
    seen: BTreeMap<String, BTreeMap<String, String>>,
    /// Drivers whose app ended (driver finished): not managed again.
    done: BTreeSet<String>,
    /// Drivers whose app was stopped by an error, with their annotations then: managed
    /// again once the annotations change.
    stopped: BTreeMap<String, BTreeMap<String, String>>,
    /// The last warning per driver uid (so one bad annotation is one line, not one a pass).
    warned: BTreeMap<String, String>,
    /// ConfigMap name → (when read, the template).
    templates: BTreeMap<String, (Instant, crate::podspec::PodTemplate)>,
}

/// How long a template read from a ConfigMap is used before it is read again.
const TEMPLATE_TTL: Duration = Duration::from_secs(60);

impl Discovery {
    fn new(cli: &Cli, selector: &str) -> Result<Discovery> {
        let template =
            crate::template::load_template(cli.app.template.as_deref(), cli.app.image.as_deref())?;
        Ok(Discovery {
            selector: selector.to_string(),
            args: cli.app.clone(),
            template,
            seen: BTreeMap::new(),
            done: BTreeSet::new(),
            stopped: BTreeMap::new(),
            warned: BTreeMap::new(),
            templates: BTreeMap::new(),
        })
    }

    fn annotations_of(&self, uid: &str) -> BTreeMap<String, String> {
        self.seen.get(uid).cloned().unwrap_or_default()
    }

    /// Warns once per driver and message, in the log and as a Warning Event on the driver
    /// pod (reason `AllocationSkipped`), so `kubectl describe pod DRIVER` says why its
    /// executors are left as they are.
    fn warn_once(&mut self, client: &KubeClient, ns: &str, d: &Driver, msg: String) {
        if self.warned.get(&d.uid) != Some(&msg) {
            warn!("{msg}");
            let now = super::env::now_ms();
            crate::events::warn_on_pod(client, ns, &d.name, &d.uid, "AllocationSkipped", &msg, now);
            self.warned.insert(d.uid.clone(), msg);
        }
    }

    /// Lists the driver pods and brings `managed` in line: new drivers become apps, targets
    /// and batch sizes follow the annotations. Returns (namespace, app id) of the apps whose
    /// driver is gone (dropped from `managed`; their executors are deleted by the caller).
    fn refresh(&mut self, conn: &mut Conn, managed: &mut Vec<Managed>) -> Vec<(String, String)> {
        let ns = conn.default_ns.clone();
        let dir = conn.state_dir.clone();
        let Ok(client) = conn.client(&ns) else {
            return Vec::new();
        };
        let items = match client.list_pod_items(&self.selector, None, Some(500)) {
            Ok((items, _)) => items,
            Err(e) => {
                warn!(
                    "listing the driver pods ({}): {e}; retrying next pass",
                    self.selector
                );
                return Vec::new();
            }
        };
        let drivers: Vec<Driver> = items.iter().filter_map(Driver::of).collect();
        let live: BTreeSet<&str> = drivers.iter().map(|d| d.uid.as_str()).collect();
        let mut gone = Vec::new();
        managed.retain(|m| {
            let keep = m.driver_uid.as_deref().is_none_or(|u| live.contains(u));
            if !keep {
                if let Store::File(p) = &m.store {
                    remove_state(p);
                }
                gone.push((m.ns.clone(), m.app.app_id.clone()));
            }
            keep
        });
        self.done.retain(|u| live.contains(u.as_str()));
        self.seen.retain(|u, _| live.contains(u.as_str()));
        for d in drivers {
            self.admit(client, &ns, &dir, d, managed);
        }
        gone
    }

    /// One driver: updates its app, makes it, or reports why not.
    fn admit(
        &mut self,
        client: &KubeClient,
        ns: &str,
        dir: &StateDir,
        d: Driver,
        managed: &mut Vec<Managed>,
    ) {
        if self.done.contains(&d.uid) {
            return;
        }
        self.seen.insert(d.uid.clone(), d.annotations.clone());
        if let Some(was) = self.stopped.get(&d.uid) {
            if *was == d.annotations {
                return;
            }
            self.stopped.remove(&d.uid);
        }
        let Some(app_id) = d.app_id.clone() else {
            let msg = format!(
                "driver pod {:?} has no spark-app-selector label: skipped",
                d.name
            );
            return self.warn_once(client, ns, &d, msg);
        };
        let wanted = match d.wanted() {
            Ok(w) => w,
            Err(msg) => return self.warn_once(client, ns, &d, msg),
        };
        self.warned.remove(&d.uid);
        let existing = managed
            .iter()
            .position(|m| m.driver_uid.as_deref() == Some(&d.uid));
        if existing.is_none() && managed.iter().any(|m| m.ns == ns && m.app.app_id == app_id) {
            let msg = format!(
                "driver pod {:?}: app {app_id} is already managed for another driver: skipped",
                d.name
            );
            return self.warn_once(client, ns, &d, msg);
        }
        let template = match self.template_for(client, &d, &wanted) {
            Ok(t) => t,
            Err(msg) => return self.warn_once(client, ns, &d, msg),
        };
        let app = match discovered_app(&self.args, &app_id, &wanted, template, &d.name) {
            Ok(app) => app,
            Err(msg) => return self.warn_once(client, ns, &d, msg),
        };
        match existing {
            Some(i) => {
                let m = &mut managed[i];
                if m.target != Some(wanted.target) {
                    info!(
                        "app {app_id}: target {} (annotation {})",
                        wanted.target,
                        multi::ANNOTATION_EXECUTORS
                    );
                    m.converged = false;
                }
                m.target = Some(wanted.target);
                m.app = app;
            }
            None => {
                info!(
                    "app {app_id}: driver pod {:?} found, target {}",
                    d.name, wanted.target
                );
                managed.push(Managed {
                    ns: ns.to_string(),
                    store: dir.store(ns, &app_id),
                    app,
                    target: Some(wanted.target),
                    driver_uid: Some(d.uid.clone()),
                    converged: false,
                });
            }
        }
    }

    /// The executor template of a driver's app: its ConfigMap's, else the global one.
    /// Errors: a warning naming the driver.
    fn template_for(
        &mut self,
        client: &KubeClient,
        d: &Driver,
        wanted: &multi::Wanted,
    ) -> std::result::Result<crate::podspec::PodTemplate, String> {
        let template = match &wanted.template {
            None => self.template.clone(),
            Some(cm) => Some(self.template_from(client, cm).map_err(|msg| {
                format!(
                    "driver pod {:?}: {msg}; its executors are left as they are",
                    d.name
                )
            })?),
        };
        template.ok_or_else(|| {
            format!(
                "driver pod {:?}: no executor template: annotate it with {} or give --template/--image",
                d.name,
                multi::ANNOTATION_TEMPLATE
            )
        })
    }

    /// The template in ConfigMap `name` (key [`multi::TEMPLATE_KEY`]), read at most once a
    /// [`TEMPLATE_TTL`].
    fn template_from(
        &mut self,
        client: &KubeClient,
        name: &str,
    ) -> std::result::Result<crate::podspec::PodTemplate, String> {
        if let Some((at, t)) = self.templates.get(name) {
            if at.elapsed() < TEMPLATE_TTL {
                return Ok(t.clone());
            }
        }
        let key = multi::TEMPLATE_KEY;
        let cm = client
            .get_configmap(name)
            .map_err(|e| format!("cannot read ConfigMap {name:?}: {e}"))?
            .ok_or_else(|| {
                format!(
                    "no ConfigMap {name:?} (annotation {})",
                    multi::ANNOTATION_TEMPLATE
                )
            })?;
        let text = cm["data"][key]
            .as_str()
            .ok_or_else(|| format!("ConfigMap {name:?} has no key {key:?}"))?;
        let value = crate::template::parse_template_text(text)
            .map_err(|e| format!("ConfigMap {name:?} key {key:?} is not YAML or JSON: {e}"))?;
        let t = crate::podspec::PodTemplate::from_value(value, None)
            .map_err(|e| format!("ConfigMap {name:?} key {key:?}: {e}"))?;
        self.templates
            .insert(name.to_string(), (Instant::now(), t.clone()));
        Ok(t)
    }
}

/// The app of driver pod `driver` as its annotations (`wanted`) and the global flags
/// (`args`) make it. Errors: an `--executor-container` the template does not have, naming
/// the driver.
fn discovered_app(
    args: &AppArgs,
    app_id: &str,
    wanted: &multi::Wanted,
    template: crate::podspec::PodTemplate,
    driver: &str,
) -> std::result::Result<App, String> {
    let mut args = args.clone();
    if let Some(b) = wanted.batch_size {
        args.batch_size = b;
    }
    let mut settings = args.settings(app_id);
    if let Some(name) = &settings.executor_container {
        (template.check_executor_container(name))
            .map_err(|msg| format!("driver pod {driver:?}: {msg}"))?;
    }
    if settings.executor_container.is_none() {
        // As `AppArgs::app`: the template's first container is the executor's.
        settings.executor_container = Some(template.first_container().to_string());
    }
    Ok(App {
        settings,
        app_id: app_id.to_string(),
        template: Some(template),
        driver_pod: Some(driver.to_string()),
        page_size: args.page_size,
    })
}

/// Where apps keep their state: DIR/<namespace>/<app id>.json, or by default where
/// `--state-file` defaults to; with `--state-configmaps PREFIX`, ConfigMaps.
#[derive(Clone)]
struct StateDir {
    /// `--state-dir`.
    dir: Option<PathBuf>,
    /// `--state-configmaps PREFIX`: every app's state in the ConfigMap
    /// `PREFIX-<app id>` of its namespace instead (what replicas under `--leader-elect`
    /// share).
    configmap: Option<String>,
}

impl StateDir {
    /// Where app `app_id` of `ns` keeps its state when its entry does not say.
    fn store(&self, ns: &str, app_id: &str) -> Store {
        if let Some(prefix) = &self.configmap {
            return Store::ConfigMap(crate::leader::dns_subdomain(&format!("{prefix}-{app_id}")));
        }
        Store::File(match &self.dir {
            Some(d) => d.join(ns).join(format!("{app_id}.json")),
            None => state::default_path(ns, app_id),
        })
    }
}

/// `apps` without `--leader-elect` that does not hold its claim (the Lease): exit 3 when
/// another process holds it and renews it (two such processes would manage the same apps
/// twice); else, once, a line saying that it waits for a stale holder (a killed process)
/// to expire. Errors: exit 3, held by a live process; exit 4, leases forbidden by RBAC.
fn claim_held(conn: &Conn, waiting: &mut bool) -> Result<()> {
    let Some(le) = &conn.leader else {
        return Ok(());
    };
    if le.forbidden() {
        return Err(Error::refused(format!(
            "apps: the apps Lease of namespace {} cannot be read or written (403): grant \
             leases get/create/update in API group coordination.k8s.io; it is the claim that \
             keeps a second apps process from managing the same apps",
            conn.default_ns
        )));
    }
    if let Some(h) = le.renewed_by_other() {
        return Err(Error::locked(format!(
            "another podalloc apps ({h}) holds the apps Lease of namespace {} and renews it: \
             this process did nothing (give every replica --leader-elect to run standbys)",
            conn.default_ns
        )));
    }
    if let Some(h) = le.holder().filter(|h| !h.is_empty() && !*waiting) {
        *waiting = true;
        info!(
            "the apps Lease of namespace {} names {h}: waiting for it to go stale (one lease \
             duration without a renewal) before acting",
            conn.default_ns
        );
    }
    Ok(())
}

/// Sleeps until `next`, waking every 50 ms for a signal and the deadline.
fn wait(next: Instant, deadline: Option<Instant>, flag: &AtomicBool) -> Wake {
    loop {
        if flag.load(Ordering::Relaxed) {
            return Wake::Signal;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Wake::Deadline;
        }
        if now >= next {
            return Wake::Pass;
        }
        std::thread::sleep((next - now).min(Duration::from_millis(50)));
    }
}
