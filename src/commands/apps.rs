//! `podalloc apps`: the runner ([`crate::controller::runner`]) with many apps, from an apps
//! file (`--file`) or from their driver pods (`--discover SELECTOR`).
//!
//! Every app gets what `run` gives its one app: its own next tick (the plan's requeue, the
//! idle interval at rest, at once on a queued steering request), its store held for the
//! process's life (the file lock; without `--leader-elect`, the ConfigMap holder record), so
//! that `scale`, `add` and `remove` hand their requests to this process; the signals and
//! `--timeout` (`Control::poll`), the leader gate, Events, `--metrics-file` (one series per app) and `app=`/`ns=` on the log
//! lines. A round lists each namespace's executor pods once (`spark-role=executor`,
//! paginated) and splits the list by app ([`crate::engine::snapshot::Split`]); each due app's tick runs
//! on its share ([`reconcile::tick_listed`]). One app's failure is one log line naming it
//! and never stops the others: a runtime error (exit 1) or a held lock (3) is retried at its
//! next tick; anything else (bad template, RBAC, the crash-loop guard) stops that app. An
//! app whose driver ended (7) or went away is ended by the step itself (rule
//! `driver-ended`: its executors deleted through the plan, write-ahead saved, Events) and
//! dropped, its state file removed.

use super::discover::Discovery;
use super::env::{now_ms, StoreAt};
use super::sim::{start_simulator, SimGuard};
use crate::cli::apps_file::{self, AppEntry};
use crate::cli::AppsArgs;
use crate::cli::{AppArgs, Cli, StateStoreKind};
use crate::controller::runner::{self, Control, Feed, Options, Outcome, Shutdown, Slot};
use crate::controller::tick::{self as reconcile, App, TickCx};
use crate::engine::alloc::{Request, StateOwner, TargetChange};
use crate::engine::snapshot::Split;
use crate::engine::snapshot::{LABEL_ROLE, ROLE_EXECUTOR};
use crate::error::{Error, ExitCode, Result};
use crate::kube::{self, KubeClient, KubeError, PageSink};
use crate::store::file::{self as state, StateStore, StoreError};
use log::{error, info, warn};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The client (one connection for every namespace: each namespace's is a view of it,
/// [`KubeClient::in_namespace`]), the tick budget, where states live, and the simulator.
struct Conn {
    /// How long one app's tick may call the API ([`super::env::tick_budget`]).
    tick_budget: Duration,
    default_ns: String,
    /// The view of each namespace an app lives in; the default namespace's is made first.
    clients: BTreeMap<String, KubeClient>,
    state_dir: StateDir,
    /// The process's services (Events, test points, the probe once the endpoints are on).
    services: crate::controller::services::Services,
    _sim: Option<SimGuard>,
}

impl Conn {
    /// The connection to the cluster, its client built with `control`'s hook (signals are
    /// seen while an exec plugin fetches the first credential) and its plugin killed by
    /// `control`'s exit at once.
    fn new(cli: &Cli, a: &AppsArgs, control: &std::sync::Arc<Control>) -> Result<Conn> {
        let (flags, sim) = if cli.conn.simulate {
            start_simulator(&cli.conn)?
        } else {
            (cli.conn.connection_flags(), None)
        };
        let cfg = kube::resolve(&flags).map_err(reconcile::kube_error)?;
        // The process's own lines (discovery, leader election, the endpoints) are about
        // every app it manages: `app=* ns=DEFAULT`; an app's tick sets its own.
        cli.process.log.set_command("*", &cfg.namespace);
        // Under --simulate the states live in the simulator's temporary directory.
        let state_dir = (a.state_dir.clone())
            .or_else(|| sim.as_ref().map(|s| s.state_file().with_file_name("apps")));
        let mut c = Conn {
            tick_budget: super::env::tick_budget(cli),
            default_ns: cfg.namespace.clone(),
            clients: BTreeMap::new(),
            state_dir: StateDir {
                dir: state_dir,
                configmap: a.state_configmaps.clone(),
                server: cfg.server.clone(),
            },
            services: super::env::services(cli),
            _sim: sim,
        };
        let options = super::env::client_options(cli);
        let on_exit = |k| control.on_exit(k);
        let client = KubeClient::with_options_and_hook(cfg, options, control.waiter(), on_exit)
            .map_err(reconcile::kube_error)?;
        c.clients.insert(c.default_ns.clone(), client);
        Ok(c)
    }

    /// Makes the view of `ns` unless made. Errors (exit 2): an empty namespace.
    fn prepare(&mut self, ns: &str) -> Result<()> {
        if ns.trim().is_empty() {
            return Err(Error::usage(
                "an app's namespace is empty; give a namespace name",
            ));
        }
        if !self.clients.contains_key(ns) {
            let view = self.clients[&self.default_ns].in_namespace(ns);
            self.clients.insert(ns.to_string(), view);
        }
        Ok(())
    }

    /// The client of `ns` (made by [`Conn::prepare`]; else the default namespace's).
    fn client(&self, ns: &str) -> &KubeClient {
        (self.clients.get(ns)).unwrap_or_else(|| &self.clients[&self.default_ns])
    }
}

/// An app to manage, before its store is opened.
struct Entry {
    ns: String,
    app: App,
    target: Option<u32>,
    store: StoreAt,
}

/// `podalloc apps`.
pub(super) fn apps(cli: &Cli, a: &AppsArgs) -> Result<()> {
    refuse_app_flags(cli)?;
    if let Some(p) = &cli.ops.metrics_file {
        crate::controller::metrics::check_path(p).map_err(Error::usage)?;
    }
    // The signal handlers before the first request (the search for ConfigMaps, the Lease):
    // until the first round a signal ends the process at once, exit 0.
    let shutdown = Shutdown::install(cli.process.log.clone())?;
    let mut conn = Conn::new(cli, a, &shutdown.0)?;
    (conn.clients.values()).for_each(|c| shutdown.0.serve_between_requests(c));
    conn.services.set_waiter(shutdown.0.waiter());
    let mut failed = Vec::new();
    let interval = a.interval.unwrap_or(cli.app.batch_delay);
    let (entries, discover) = match (&a.file, &a.discover) {
        (Some(file), _) => (load_file(cli, &mut conn, file, &mut failed)?, None),
        (None, Some(sel)) => (Vec::new(), Some(Discovery::new(cli, sel, interval)?)),
        (None, None) => {
            return Err(Error::usage(
                "apps: give --file FILE or --discover SELECTOR",
            ))
        }
    };
    let o = Options {
        interval,
        idle_interval: a.idle_interval,
        timeout: a.timeout,
        until_converged: a.until_converged,
        once: a.once,
        started: Instant::now(),
    };
    let endpoints = super::env::endpoints(cli, o.interval.max(a.idle_interval))?;
    let _endpoints = endpoints.map(|(e, probe)| {
        conn.services.probe = Some(probe);
        e
    });
    shutdown.0.set_deadline(a.timeout.map(|t| o.started + t));
    // Between its requests and while they wait, the loop answers the endpoints, reads its
    // signals and renews its Lease (the views of namespaces share the default one's hook).
    shutdown.0.set_probe(conn.services.probe.as_ref());
    // The runner's fence on every client, before the election (whose own is then unused).
    conn.clients.values().for_each(|c| shutdown.0.fence(c));
    // One Lease for the process's apps, taken once the apps are known to be usable:
    // --leader-elect stands by while another holds it; without it, the same Lease is a
    // claim, and a second process refuses.
    let client = &conn.clients[&conn.default_ns];
    let led = if a.leader.leader_elect {
        what_led(client, a)
    } else {
        None
    };
    let le = match super::elect::start_on(client, &a.leader, "apps", led)? {
        Some(le) => le,
        None => super::elect::claim_on(client, &a.leader, "apps")?,
    };
    shutdown.0.set_leader(Some(le));
    let source = Source {
        entries,
        discover,
        failed,
    };
    let res = run_apps(cli, a, &conn, source, &o, &shutdown);
    shutdown.0.set_leader(None);
    res
}

/// What says an `apps` may have led in `client`'s namespace; `None`: nobody can have, so
/// `apps --leader-elect` creates a missing Lease at once, as `run --leader-elect` does on an
/// app of which the namespace holds nothing (it waited a lease duration, about 17 s, on
/// every first start): its apps are discovered there and keep their states in ConfigMaps
/// there (`--state-configmaps`), and the namespace holds no ConfigMap of podalloc's and no
/// ExecutorSet (the searches answered; an ExecutorSet kind not served counts as none). An
/// apps leader creates an app's ConfigMap before its first pod, or acts on the app's
/// ExecutorSet (discovery uses the home an app already has). Otherwise (an apps file, whose
/// entries may keep their states elsewhere; states in each replica's own files; a search
/// refused; a ConfigMap or ExecutorSet found, named in the answer) a missing Lease may be
/// one deleted under a running leader, and is created only once it has stayed missing for
/// a lease duration.
fn what_led(client: &KubeClient, a: &AppsArgs) -> Option<String> {
    if a.file.is_some() || a.discover.is_none() {
        return Some(
            "the apps come from an apps file, whose entries may keep their states elsewhere".into(),
        );
    }
    if a.state_configmaps.is_none() {
        return Some("the apps keep their states in files (no --state-configmaps)".into());
    }
    let sel = format!("{}=podalloc", crate::store::configmap::MANAGED_BY);
    let found = |res: &'static kube::Resource, sel: &str, kind: &str, whose: &str| {
        let lp = kube::ListParams {
            label_selector: sel,
            ..kube::ListParams::default()
        };
        match client.api(res).list_items(&lp) {
            Ok((items, _)) => items.first().map(|item| {
                let name = item["metadata"]["name"].as_str().unwrap_or("?");
                format!("the namespace holds {kind} {name}{whose}")
            }),
            Err(e) if res == &kube::EXECUTOR_SETS && e.status_code() == Some(404) => None,
            Err(e) => {
                log::debug!("the namespace's {} not searched: {e}", res.plural);
                Some(format!("the namespace's {} were not searched", res.plural))
            }
        }
    };
    let config_map = found(&kube::CONFIG_MAPS, &sel, "ConfigMap", " of podalloc's");
    config_map.or_else(|| found(&kube::EXECUTOR_SETS, "", "ExecutorSet", ""))
}

/// Refuses one app's flags (exit 2): they are given per app in the apps file.
fn refuse_app_flags(cli: &Cli) -> Result<()> {
    for (given, flag) in [
        (
            (cli.app.state_store.as_ref()).is_some_and(|k| !matches!(k, StateStoreKind::File)),
            "--state-store configmap:NAME or executorset:NAME",
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
    Ok(())
}

/// Where the apps come from: the apps file's usable entries and those it could not use, or
/// discovery.
struct Source {
    entries: Vec<Entry>,
    discover: Option<Discovery>,
    failed: Vec<(String, Error)>,
}

/// The runner over the apps file's entries or the discovered drivers.
fn run_apps(
    cli: &Cli,
    a: &AppsArgs,
    conn: &Conn,
    source: Source,
    o: &Options,
    shutdown: &Shutdown,
) -> Result<()> {
    let mut feed = AppsFeed {
        conn,
        discover: source.discover,
        failed: source.failed,
        // Under --leader-elect the Lease says which replica acts: no holder records.
        // Each holder record carries the answer deadline of a loop that reads its home every
        // --interval (3 × interval + 2 s + the tick budget): the pings it finds are answered within it. An
        // app's ConfigMap is read only at its ticks (`Lazy::intent_changed`): its deadline
        // follows --idle-interval.
        holding: (!a.leader.leader_elect).then_some((o.interval, o.idle_interval)),
        leader_elect: a.leader.leader_elect,
        waiting: false,
        stores: BTreeMap::new(),
        metrics_file: cli.ops.metrics_file.clone(),
        metrics: BTreeMap::new(),
        shown: None,
        log_every: a.log_every,
    };
    let slots = (source.entries.into_iter())
        .map(|e| {
            let request = e.target.map(|n| Request {
                target: TargetChange::Seed(n),
                ..Request::default()
            });
            feed.slot(e.ns, e.app, e.store, request, &shutdown.0)
        })
        .collect();
    runner::run(o, slots, &mut feed, shutdown, &conn.services)
}

/// Reads the apps file. An app whose entry cannot be used (bad template, image, app id,
/// namespace) is reported, added to `failed` and left out; the others run. Errors (exit 2):
/// the file itself.
fn load_file(
    cli: &Cli,
    conn: &mut Conn,
    file: &Path,
    failed: &mut Vec<(String, Error)>,
) -> Result<Vec<Entry>> {
    let text = crate::cli::read_input_file(file, "the apps file")?;
    let parsed = apps_file::parse_apps_file(&text, &conn.default_ns)
        .map_err(|e| Error::usage(format!("apps file {}: {e}", file.display())))?;
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for entry in parsed.apps {
        let name = entry.app_id.clone();
        match entry_app(cli, conn, dir, entry) {
            Ok(m) => out.push(m),
            Err(e) => {
                error!("app {name}: {e}; not managed");
                failed.push((name, e));
            }
        }
    }
    Ok(out)
}

/// `apps`' feed: the apps' stores, discovery, the failed apps, the metrics.
struct AppsFeed<'c> {
    conn: &'c Conn,
    discover: Option<Discovery>,
    /// Apps stopped by an error (name, error), in order.
    failed: Vec<(String, Error)>,
    /// `--interval` and `--idle-interval`, behind a holder record's answer deadline (`None`
    /// under `--leader-elect`: no holder record).
    holding: Option<(Duration, Duration)>,
    leader_elect: bool,
    /// The "waiting for a stale claim" line was logged.
    waiting: bool,
    /// Where each app's state lives, by `namespace/app id`.
    stores: BTreeMap<String, StoreAt>,
    metrics_file: Option<PathBuf>,
    /// The last exposition of each app, by `namespace/app id`, and the process's own
    /// (its requests and leadership) under the empty key.
    metrics: BTreeMap<String, String>,
    /// The leadership (the election's, or the claim's) the process's own series last showed.
    shown: Option<(bool, u64)>,
    log_every: Duration,
}

fn key(ns: &str, app_id: &str) -> String {
    format!("{ns}/{app_id}")
}

impl<'c> AppsFeed<'c> {
    /// A slot for `app`, its store opened at its first tick ([`Lazy`]).
    fn slot(
        &mut self,
        ns: String,
        app: App,
        store: StoreAt,
        first: Option<Request>,
        shared: &Arc<Control>,
    ) -> Slot<'c> {
        let client = self.conn.client(&ns);
        self.stores.insert(key(&ns, &app.app_id), store.clone());
        let lazy = Lazy {
            client,
            spec: store,
            owner: StateOwner {
                server: client.server().to_string(),
                namespace: ns.clone(),
                app_id: app.app_id.clone(),
            },
            holding: self.holding,
            shared: Arc::clone(shared),
            services: &self.conn.services,
            inner: None,
        };
        let label = format!("app {}: ", app.app_id);
        let mut slot = Slot::new(app, &ns, Box::new(lazy), shared, self.log_every);
        slot.first = first;
        slot.label = label;
        slot
    }

    /// One app's tick on its share of the namespace's list, with the tick budget of one
    /// `run` tick; records its metrics.
    fn tick_one(
        &mut self,
        slot: &mut Slot<'c>,
        split: &mut Split,
        shared: &Control,
    ) -> Option<Outcome> {
        let client = self.conn.client(&slot.ns);
        let id = slot.app.app_id.clone();
        let snap = match split.failed.remove(&id) {
            Some(e) => {
                let e = Error::runtime(format!("the pod list could not be used: {e}"));
                return Some(Outcome::Failed(e));
            }
            None => split.snaps.remove(&id).unwrap_or_default(),
        };
        let budget = self.conn.tick_budget;
        let what = format!(
            "the tick budget of {} (4 × --request-timeout)",
            humantime::format_duration(budget)
        );
        let started = Instant::now();
        let mut state = None;
        let services = &self.conn.services;
        let outcome = slot.tick(shared, services, |app, store, memory, request| {
            for w in &snap.warnings {
                warn!("{w}");
            }
            client.set_deadline(Some(Instant::now() + budget), &what);
            let mut cx = TickCx { services, memory };
            let listed = Some(snap);
            let res =
                reconcile::tick_listed(&mut cx, client, app, store, request, listed, now_ms());
            client.set_deadline(None, "");
            state = match &res {
                Ok(r) => Some(r.state.clone()),
                Err(_) => store.load().ok().flatten(),
            };
            res
        })?;
        let probe = services.probe.as_ref();
        let wanted = self.metrics_file.is_some() || probe.is_some();
        if let (true, Some(state)) = (wanted, state) {
            let report = match &outcome {
                Outcome::Done(r) => Some(r.as_ref()),
                _ => None,
            };
            let text = crate::controller::metrics::render(
                &id,
                &slot.ns,
                report,
                &state,
                started.elapsed(),
                // One Lease for every app: the leadership series are the process's own
                // (`process_metrics`), never an app's, or `sum(podalloc_is_leader)` counts
                // the leader once per app and once more.
                None,
            );
            probe.inspect(|p| p.set_app_metrics(&slot.ns, &id, text.clone()));
            self.metrics.insert(key(&slot.ns, &id), text);
        }
        Some(outcome)
    }

    /// Renders the process's own series: its API requests ([`render_requests`]) and its
    /// `leadership` ([`render_leadership`]: one Lease for every app, so no app labels; what a
    /// standby, which knows no app, shows), for `/metrics` and `--metrics-file`.
    ///
    /// [`render_requests`]: crate::controller::metrics::render_requests
    /// [`render_leadership`]: crate::controller::metrics::render_leadership
    fn process_metrics(&mut self, leadership: Option<(bool, u64)>) {
        let probe = self.conn.services.probe.as_ref();
        if self.metrics_file.is_none() && probe.is_none() {
            return;
        }
        // Every namespace's view shares the connection's counters.
        let stats = self.conn.client(&self.conn.default_ns).stats();
        let mut text = crate::controller::metrics::render_requests(&stats);
        if let Some(l) = leadership {
            text.push_str(&crate::controller::metrics::render_leadership(l));
        }
        probe.inspect(|p| p.set_process_metrics(text.clone()));
        self.metrics.insert(String::new(), text);
        self.shown = leadership;
    }

    /// Writes `--metrics-file`: every app's series, one family at a time.
    fn write_metrics(&self) {
        let Some(path) = &self.metrics_file else {
            return;
        };
        let text =
            crate::controller::serve::merge_families(self.metrics.values().map(String::as_str));
        if let Err(e) = crate::controller::metrics::write_atomic(path, &text) {
            warn!("cannot write the metrics file {}: {e}", path.display());
        }
    }
}

impl<'c> Feed<'c> for AppsFeed<'c> {
    /// Also shows a change of leadership in the process's own series at once, the
    /// standby's `podalloc_is_leader 0` included (it runs no round that would).
    fn may_act(&mut self, shared: &Control) -> Result<bool> {
        let ns = &self.conn.default_ns;
        let leadership = shared.with_leader(|le| {
            let Some(le) = le else { return Ok(None) };
            let leadership = le.leadership();
            let standby = !leadership.0;
            if standby && self.leader_elect {
                super::elect::refused(
                    le,
                    "apps --leader-elect",
                    "the election needs it to choose the one replica that acts",
                )?;
            } else if standby {
                claim_held(le, ns, &mut self.waiting)?;
            }
            Ok(Some(leadership))
        })?;
        if leadership.is_some() && leadership != self.shown {
            self.process_metrics(leadership);
            self.write_metrics();
        }
        Ok(leadership.is_none_or(|(leading, _)| leading))
    }

    fn refresh(&mut self, slots: &mut Vec<Slot<'c>>, shared: &Arc<Control>) {
        let Some(mut d) = self.discover.take() else {
            return;
        };
        let ns = &self.conn.default_ns;
        let via = (self.conn.client(ns), &self.conn.services.events);
        let found = d.refresh(via, ns, slots);
        for (driver, app, targets, home) in found {
            let ns = self.conn.default_ns.clone();
            // The home the app already has (found as `run` finds it), else discovery's own.
            let store = match home {
                Some(super::home::Home::ExecutorSet(n)) => StoreAt::ExecutorSet(n),
                Some(super::home::Home::ConfigMap(n)) => StoreAt::ConfigMap(n),
                None => self.conn.state_dir.store(&ns, &app.app_id),
            };
            // Seeds: each fills an empty home only. After a failover (`--leader-elect`) or a
            // restart, the home's targets (steered meanwhile with `add`, `scale`) win; a
            // change of the annotations while this process runs is a `scale` (discover.rs),
            // but for an app on an ExecutorSet, whose spec alone is its target.
            let first = Some(super::discover::request_of(&targets, TargetChange::Seed));
            let mut slot = self.slot(ns, app, store, first, shared);
            slot.driver_uid = Some(driver);
            slots.push(slot);
        }
        self.discover = Some(d);
    }

    fn refresh_every(&self) -> Option<Duration> {
        self.discover.as_ref().map(|d| d.interval)
    }

    fn round(
        &mut self,
        slots: &mut [Slot<'c>],
        due: &[usize],
        shared: &Control,
    ) -> Vec<(usize, Outcome)> {
        let namespaces: BTreeSet<String> = due.iter().map(|&i| slots[i].ns.clone()).collect();
        let mut out = Vec::new();
        for ns in namespaces {
            if shared.requested() {
                break;
            }
            let idx: Vec<usize> = (due.iter().copied())
                .filter(|&i| slots[i].ns == ns)
                .collect();
            let ids: Vec<(&str, Option<&str>)> = (idx.iter())
                .map(|&i| {
                    let app = &slots[i].app;
                    let container = app.settings.executor_container.as_deref();
                    (app.app_id.as_str(), container)
                })
                .collect();
            let mut split = match list_split(self.conn.client(&ns), &ids) {
                Ok(s) => s,
                Err(e) => {
                    // Each app's line says it (and that it retries at its next tick).
                    let e = Error {
                        code: e.code,
                        message: format!("namespace {ns}: {}", e.message),
                    };
                    out.extend(idx.iter().map(|&i| (i, Outcome::Failed(e.clone()))));
                    continue;
                }
            };
            for i in idx {
                if let Some(o) = self.tick_one(&mut slots[i], &mut split, shared) {
                    out.push((i, o));
                }
            }
        }
        // Once a round.
        let leadership = shared.with_leader(|le| le.map(|le| le.leadership()));
        self.process_metrics(leadership);
        self.write_metrics();
        out
    }

    fn finish(&mut self, slot: &mut Slot<'c>, e: Error) -> Option<Error> {
        let k = key(&slot.ns, &slot.app.app_id);
        self.metrics.remove(&k);
        let store = self.stores.remove(&k);
        let label = &slot.label;
        if slot.ending || e.code == ExitCode::DriverEnded {
            match slot.ending && e.code != ExitCode::DriverEnded {
                true => info!("{label}driver pod gone ({e}); no longer managed"),
                false => info!("{label}{e}; no longer managed"),
            }
            if let Some(StoreAt::File(p)) = &store {
                remove_state(p);
            }
            if let (Some(d), Some(uid)) = (self.discover.as_mut(), &slot.driver_uid) {
                d.done.insert(uid.clone());
            }
            return None;
        }
        error!("{label}(namespace {}): {e}; stopped", slot.ns);
        if let (Some(d), Some(uid)) = (self.discover.as_mut(), &slot.driver_uid) {
            d.stopped.insert(uid.clone(), d.annotations_of(uid));
        }
        self.failed.push((slot.app.app_id.clone(), e));
        None
    }

    fn all_converged(&self, slots: &[Slot<'c>]) -> bool {
        // With --discover, "all converged" needs at least one app found.
        slots.iter().all(Slot::converged) && (self.discover.is_none() || !slots.is_empty())
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
}

/// An app's store, opened at its first claim (each tick claims first), so an app whose file
/// lock another process holds retries at its next tick (exit 3) instead of being refused;
/// once open it stays open: the file lock and the ConfigMap holder record stay this
/// process's, and `scale`, `add` and `remove` find the owner and hand their requests over.
struct Lazy<'c> {
    client: &'c KubeClient,
    spec: StoreAt,
    owner: StateOwner,
    /// `--interval` and `--idle-interval` (see `AppsFeed::holding`).
    holding: Option<(Duration, Duration)>,
    /// The runner (a stop at once gives up the holder record).
    shared: Arc<Control>,
    /// The process's services (its swept directories, whether Events are on).
    services: &'c crate::controller::services::Services,
    inner: Option<Box<dyn StateStore + 'c>>,
}

impl<'c> Lazy<'c> {
    /// The open store. Errors: opening it (a held lock: [`StoreError::Locked`]).
    fn open(&mut self) -> std::result::Result<&mut (dyn StateStore + 'c), StoreError> {
        if self.inner.is_none() {
            // How often the loop reads this app's home, so answers a ping: an ExecutorSet every
            // --interval, a ConfigMap only at the app's ticks (--idle-interval at rest).
            let every = |(interval, idle): (Duration, Duration)| match self.spec {
                StoreAt::ConfigMap(_) => interval.max(idle),
                _ => interval,
            };
            let holding = self.holding.map(|h| (every(h), self.shared.as_ref()));
            let by = ("apps", self.services);
            let none = std::collections::BTreeMap::new();
            let store =
                super::env::open_store(self.client, &self.spec, &self.owner, by, holding, &none)?;
            self.inner = Some(store);
        }
        match self.inner.as_deref_mut() {
            Some(s) => Ok(s),
            None => Err(StoreError::Backend("the store is not open".into())),
        }
    }
}

impl StateStore for Lazy<'_> {
    fn describe(&self) -> String {
        match &self.spec {
            StoreAt::File(p) => format!("state file {}", p.display()),
            StoreAt::ConfigMap(n) => format!("ConfigMap {n}"),
            StoreAt::ExecutorSet(n) => format!("ExecutorSet {n}"),
        }
    }
    fn load(
        &mut self,
    ) -> std::result::Result<Option<crate::engine::alloc::AllocatorState>, StoreError> {
        self.open()?.load()
    }
    fn save(
        &mut self,
        s: &crate::engine::alloc::AllocatorState,
    ) -> std::result::Result<(), StoreError> {
        self.open()?.save(s)
    }
    fn claim(&mut self) -> std::result::Result<(), StoreError> {
        self.open()?.claim()
    }
    fn release(&mut self) -> std::result::Result<(), StoreError> {
        self.inner.as_mut().map_or(Ok(()), |s| s.release())
    }
    fn requests(&mut self) -> std::result::Result<Vec<crate::engine::alloc::Steering>, StoreError> {
        self.open()?.requests()
    }
    fn consumed(&mut self, ids: &[String]) -> Vec<String> {
        self.inner
            .as_mut()
            .map_or_else(Vec::new, |s| s.consumed(ids))
    }
    fn queue_marker(&self) -> Option<std::time::SystemTime> {
        self.inner.as_ref().and_then(|s| s.queue_marker())
    }
    fn home_target(&mut self) -> Option<u32> {
        self.inner.as_mut().and_then(|s| s.home_target())
    }
    fn home_template(
        &self,
    ) -> std::result::Result<Option<crate::engine::podspec::PodTemplate>, StoreError> {
        self.inner.as_ref().map_or(Ok(None), |s| s.home_template())
    }
    fn home_profiles(
        &mut self,
    ) -> std::result::Result<
        std::collections::BTreeMap<u32, crate::store::file::HomeProfile>,
        StoreError,
    > {
        (self.inner.as_mut()).map_or(Ok(Default::default()), |s| s.home_profiles())
    }
    fn observe(
        &mut self,
        summary: &crate::engine::alloc::Summary,
        blocked: Option<&crate::engine::alloc::Blocked>,
    ) {
        if let Some(s) = self.inner.as_mut() {
            s.observe(summary, blocked);
        }
    }
    fn publish(&mut self) -> std::result::Result<(), StoreError> {
        self.inner.as_mut().map_or(Ok(()), |s| s.publish())
    }
    /// An ExecutorSet's intent is read every `--interval`; a ConfigMap's is not: one GET a
    /// second per app for every app of a namespace (`--state-configmaps`) would cost more
    /// than the shared pod list it spares, so its requests and annotation edits wait for the
    /// app's next tick (`--idle-interval` at rest), as before.
    fn intent_changed(&mut self) -> std::result::Result<bool, StoreError> {
        if matches!(self.spec, StoreAt::ConfigMap(_)) {
            return Ok(false);
        }
        self.inner
            .as_mut()
            .map_or(Ok(false), |s| s.intent_changed())
    }
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

    /// The split snapshot reads Protobuf pages too.
    fn accepts_protobuf(&self) -> bool {
        true
    }

    fn restart(&mut self) {
        self.split.restart();
    }

    /// Pages are decoded as they arrive ([`Split::read_page`]).
    fn bounded_memory(&self) -> bool {
        true
    }

    fn page(&mut self, body: &[u8]) -> std::result::Result<Option<String>, KubeError> {
        self.page_reader(&mut &body[..])
    }

    /// Decodes the page while it arrives. A failed read is the client's to report, so it is
    /// not recorded as an unusable list.
    fn page_reader(
        &mut self,
        body: &mut dyn std::io::Read,
    ) -> std::result::Result<Option<String>, KubeError> {
        self.split.read_page(body).map_err(|e| {
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

/// Lists the namespace's executor pods once (`spark-role=executor`), split among `ids`
/// (app id, executor container). Errors (exit 1 or 4): the API's, a list that cannot be used.
fn list_split(client: &KubeClient, ids: &[(&str, Option<&str>)]) -> Result<Split> {
    let mut split = Split::for_apps(ids.iter().map(|i| i.0));
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
    let lp = crate::kube::ListParams {
        label_selector: &selector,
        field_selector: None,
        limit: Some(page_size),
    };
    if let Err(e) = client.api(&crate::kube::PODS).list(&lp, &mut sink) {
        return Err(match sink.parse_error {
            Some(p) => Error::runtime(format!("the pod list could not be used: {p}")),
            None => reconcile::kube_error(e),
        });
    }
    Ok(sink.split)
}

/// An apps-file entry lowered into an app: the global flags with the entry's values over
/// them. Errors (exit 2): the entry's template, image, batch size, namespace or store.
fn entry_app(cli: &Cli, conn: &mut Conn, dir: &Path, e: AppEntry) -> Result<Entry> {
    let mut args: AppArgs = cli.app.clone();
    let ns = (e.namespace.clone()).unwrap_or_else(|| conn.default_ns.clone());
    args.app_id = Some(e.app_id.clone());
    if e.template.is_some() || e.image.is_some() {
        args.template = e.template.map(|t| dir.join(t));
        args.image = e.image;
    }
    args.driver_pod = e.driver_pod;
    if let Some(b) = &e.batch_size {
        args.batch_size = apps_file::batch_size_of(b).map_err(Error::usage)?;
    }
    let app = args.app(cli.conn.simulate, true)?;
    conn.prepare(&ns)?;
    let store = match e.state_store.as_deref().map(crate::cli::parse_state_store) {
        Some(Err(msg)) => return Err(Error::usage(format!("state-store: {msg}"))),
        Some(Ok(StateStoreKind::ConfigMap(n))) => StoreAt::ConfigMap(n),
        Some(Ok(StateStoreKind::ExecutorSet(n))) => StoreAt::ExecutorSet(n),
        _ => match e.state_file {
            Some(p) => StoreAt::File(dir.join(p)),
            None => conn.state_dir.store(&ns, &app.app_id),
        },
    };
    Ok(Entry {
        ns,
        app,
        target: e.target,
        store,
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
    /// The API server, which keys the default state path ([`state::default_path_for`]).
    server: String,
}

impl StateDir {
    /// Where app `app_id` of `ns` keeps its state when its entry does not say.
    fn store(&self, ns: &str, app_id: &str) -> StoreAt {
        if let Some(prefix) = &self.configmap {
            return StoreAt::ConfigMap(crate::controller::leader::dns_subdomain(&format!(
                "{prefix}-{app_id}"
            )));
        }
        StoreAt::File(match &self.dir {
            Some(d) => d.join(ns).join(format!("{app_id}.json")),
            None => state::default_path_for(&self.server, ns, app_id),
        })
    }
}

/// `apps` without `--leader-elect` that does not hold its claim (the Lease `le` of namespace
/// `ns`): exit 3 when another process holds it and renews it (two such processes would
/// manage the same apps twice); else, once, a line saying that it waits for a stale holder
/// (a killed process) to expire. Errors: exit 3, held by a live process; exit 4, leases
/// forbidden by RBAC.
fn claim_held(
    le: &crate::controller::leader::LeaderElection,
    ns: &str,
    waiting: &mut bool,
) -> Result<()> {
    super::elect::refused(
        le,
        "apps",
        "it is the claim that keeps a second apps process from managing the same apps",
    )?;
    if let Some(h) = le.renewed_by_other() {
        return Err(Error::locked(format!(
            "another podalloc apps ({h}) holds the apps Lease of namespace {ns} and renews it: \
             this process did nothing (give every replica --leader-elect to run standbys)"
        )));
    }
    if let Some(h) = le.holder().filter(|h| !h.is_empty() && !*waiting) {
        *waiting = true;
        info!(
            "the apps Lease of namespace {ns} names {h}: waiting for it to go stale (one lease \
             duration without a renewal) before acting"
        );
    }
    Ok(())
}
