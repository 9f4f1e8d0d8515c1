//! The set-up every connected command shares: [`connect`] lowers the flags, starts the
//! simulator when asked, resolves the connection and checks the namespace; [`Env`] then opens
//! the state store and runs ticks.

use super::sim::{start_simulator, SimGuard};
use crate::cli::{Cli, StateStoreKind};
use crate::controller::runner::{Control, StopHook};
use crate::controller::services::Services;
use crate::controller::tick::{self as reconcile, App, Memory, TickCx, TickReport};
use crate::engine::alloc::Request;
use crate::engine::alloc::{AllocatorState, StateOwner, Steering};
use crate::engine::podspec::PodTemplate;
use crate::error::{Error, Result};
use crate::kube::{self, KubeClient};
use crate::store::configmap::ConfigMapStore;
use crate::store::executorset::ExecutorSetStore;
use crate::store::file::{
    self as state, store_error, Bound, Holder, LockedStore, StateStore, StoreError,
};
use log::{info, warn};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use crate::clock::now_ms;

/// A connected environment: client, app, state path, and the simulator when `--simulate`.
pub(super) struct Env {
    pub(super) client: KubeClient,
    /// The store in use: `--state-store`, else the app's home found in its namespace
    /// ([`super::home::choose`]).
    pub(super) store_kind: StateStoreKind,
    /// `--state-store` was given.
    pub(super) store_given: bool,
    /// What the app's namespace held for it when the command connected.
    pub(super) found: super::home::Found,
    metrics_file: Option<PathBuf>,
    /// TLS verification is off (`--insecure-skip-tls-verify`): warned about every tick.
    insecure: bool,
    pub(super) app: App,
    pub(super) state_path: PathBuf,
    /// The cluster, namespace and app the state must belong to.
    owner: StateOwner,
    /// Where the connection settings came from (`flags`, `kubeconfig F (context C)`, …).
    conn_source: String,
    _sim: Option<SimGuard>,
    /// How long one tick may call the API ([`tick_budget`]).
    tick_budget: Duration,
    /// `run --timeout`: no call of a tick goes past it.
    pub(super) run_deadline: Option<Instant>,
    /// The process's services (Events, test points, the probe once the endpoints are on).
    pub(super) services: Services,
}

/// How long the API calls of one tick may take in all: 4 × `--request-timeout` (2 minutes
/// by default), so a server that answers every call at the last moment cannot hold a tick
/// for a call count times the request timeout. Calls after it fail at once; the next tick
/// starts afresh (state is saved before every call, so a cut tick leaves it consistent).
/// Starts `--metrics-bind-address` / `--health-probe-bind-address` for a loop ticking at
/// least every `slowest` (its idle interval): liveness fails once no pass has finished for
/// two of those plus a whole tick's budget. `None`: neither flag given.
///
/// Errors (exit 2): an address that cannot be bound, naming its flag.
pub(super) fn endpoints(
    cli: &Cli,
    slowest: Duration,
) -> Result<
    Option<(
        crate::controller::serve::Endpoints,
        crate::controller::serve::Probe,
    )>,
> {
    let stuck = tick_budget(cli) + 2 * slowest;
    crate::controller::serve::serve(
        cli.ops.metrics_bind_address.as_deref(),
        cli.ops.health_probe_bind_address.as_deref(),
        stuck,
    )
    .map_err(Error::usage)
}

pub(super) fn tick_budget(cli: &Cli) -> Duration {
    cli.conn.request_timeout.saturating_mul(4)
}

/// Lowers the flags ([`crate::cli::AppArgs::app`]), starts the simulator with `--simulate`,
/// and connects. `need_template`: the command may create pods, so a template is required.
///
/// Errors: exit 2 for bad flags, template, kubeconfig or namespace; exit 1 when the
/// simulator cannot start.
pub(super) fn connect(cli: &Cli, need_template: bool) -> Result<Env> {
    connect_with(cli, need_template, None)
}

/// [`connect`] for a loop whose signal handlers are installed (`run`): `control`'s hook
/// runs between the client's requests and while they wait from its first request on (the
/// search for the app's home), so a signal ends the process during that search too.
pub(super) fn connect_with(
    cli: &Cli,
    need_template: bool,
    control: Option<&std::sync::Arc<Control>>,
) -> Result<Env> {
    let simulate = cli.conn.simulate;
    let app = cli.app.app(simulate, need_template)?;
    let (flags, sim) = if simulate {
        start_simulator(&cli.conn)?
    } else {
        (cli.conn.connection_flags(), None)
    };
    let cfg = kube::resolve(&flags).map_err(reconcile::kube_error)?;
    let namespace = cfg.namespace.clone();
    check_namespace(&namespace)?;
    cli.process.log.set_command(&app.app_id, &namespace);
    if let Some(p) = &cli.ops.metrics_file {
        crate::controller::metrics::check_path(p).map_err(Error::usage)?;
    }
    let insecure = cfg.tls.insecure_skip_tls_verify;
    let owner = StateOwner {
        server: cfg.server.clone(),
        namespace: namespace.clone(),
        app_id: app.app_id.clone(),
    };
    log::debug!("cluster: {} (namespace {namespace})", cfg.source);
    let conn_source = cfg.source.clone();
    // With a loop: its hook first, so that a signal is seen while an exec plugin fetches
    // the first credential; and a plugin still running when the loop exits at once dies.
    let options = client_options(cli);
    let client = match control {
        Some(c) => KubeClient::with_options_and_hook(cfg, options, c.waiter(), |k| c.on_exit(k)),
        None => KubeClient::with_options(cfg, options),
    }
    .map_err(reconcile::kube_error)?;
    let given = cli.app.state_store.clone();
    let state_path = match (&cli.app.state_file, &sim) {
        (Some(p), _) => p.clone(),
        (None, Some(s)) => s.state_file(),
        (None, None) => state::default_path_for(&owner.server, &namespace, &app.app_id),
    };
    let mut env = Env {
        client,
        store_kind: given.clone().unwrap_or(StateStoreKind::File),
        store_given: given.is_some(),
        found: super::home::Found::default(),
        metrics_file: cli.ops.metrics_file.clone(),
        insecure,
        app,
        state_path,
        owner,
        conn_source,
        _sim: sim,
        tick_budget: tick_budget(cli),
        run_deadline: None,
        services: services(cli),
    };
    if let Some(c) = control {
        c.serve_between_requests(&env.client);
        env.services.set_waiter(c.waiter());
    }
    env.find_home(given.as_ref())?;
    Ok(env)
}

/// The client options of the flags, remembering the tokens sent where the logger scrubs
/// them ([`crate::cli::Process::redactions`]).
pub(super) fn client_options(cli: &Cli) -> kube::ClientOptions {
    kube::ClientOptions {
        redactions: cli.process.redactions.clone(),
        ..cli.conn.client_options()
    }
}

/// The process's services for a command: Events unless `--no-events`, the log context
/// shared with the logger.
pub(super) fn services(cli: &Cli) -> Services {
    Services::new(cli.app.no_events, cli.process.log.clone())
}

/// Where an app's state lives: a state file, or a ConfigMap of its namespace.
#[derive(Clone, Debug)]
pub(super) enum StoreAt {
    /// The state file (its lock and request queue beside it).
    File(PathBuf),
    /// The ConfigMap of this name.
    ConfigMap(String),
    /// The ExecutorSet of this name.
    ExecutorSet(String),
}

/// Opens the store `at` of app `owner` for `command` (`run`, `apps`, a one-shot command):
/// the file store takes its lock (exit 3 when taken, naming the holder) and writes this
/// process into the lock file; the ConfigMap and ExecutorSet stores respect a running
/// loop's holder record (asking it whether it lives, `crate::store::liveness`; the
/// steering commands `scale`, `add` and `remove` do not ask), and with `loop_interval` (a
/// loop's `--interval`, behind its answer deadline, and its runner) write this process's
/// own once, when the loop claims the home (the ConfigMap's is given up if the runner stops
/// at once, [`Control::on_stop`]). The store is bound to the owner's cluster (file store),
/// namespace and app ([`Bound`]). Errors: the lock's.
pub(super) fn open_store<'a>(
    client: &'a KubeClient,
    at: &StoreAt,
    owner: &StateOwner,
    (command, services): (&str, &Services),
    loop_interval: Option<(Duration, &Control)>,
    seeds: &BTreeMap<u32, PodTemplate>,
) -> std::result::Result<Box<dyn StateStore + 'a>, StoreError> {
    let holder = Holder::current(command);
    // A loop answers pings between its ticks: its record's deadline covers a whole tick.
    let busy = client.request_timeout().saturating_mul(4);
    let steering = matches!(command, "scale" | "add" | "remove");
    let (inner, check_server): (Box<dyn StateStore + 'a>, bool) = match at {
        StoreAt::File(path) => (
            Box::new(LockedStore::lock_as(path, &holder, &services.swept)?),
            true,
        ),
        StoreAt::ConfigMap(name) => {
            let cm = ConfigMapStore::new(client, name, &owner.app_id);
            let cm = match loop_interval {
                Some((interval, shared)) => {
                    let release = release_hook(client, name, &owner.app_id, &holder, interval);
                    release.into_iter().for_each(|r| shared.on_stop(r));
                    cm.holding(holder, (interval, busy))
                }
                None if steering => cm.steering(),
                None => cm,
            };
            (Box::new(cm), false)
        }
        StoreAt::ExecutorSet(name) => {
            let events = services.events.enabled();
            let es = ExecutorSetStore::new(client, name, &owner.app_id, events).seeding(seeds);
            let es = match loop_interval {
                Some((interval, _)) => es.holding(holder, (interval, busy)),
                None => es.once(!steering),
            };
            (Box::new(es), false)
        }
    };
    Ok(Box::new(Bound::new(inner, owner.clone(), check_server)))
}

/// The release of `holder`'s record on ConfigMap `name` when the runner stops at once: on a
/// client of its own (the loop's may be blocked in a call) with one-second timeouts and no
/// retries. `None` when that client cannot be made (the record then goes stale).
fn release_hook(
    client: &KubeClient,
    name: &str,
    app_id: &str,
    holder: &Holder,
    interval: Duration,
) -> Option<StopHook> {
    let mut options = kube::ClientOptions::default();
    options.timeouts.connect = Duration::from_secs(1);
    options.timeouts.per_read = Duration::from_secs(1);
    options.timeouts.global = Duration::from_secs(1);
    options.retry = kube::RetryPolicy::none();
    let own = client.derive(options).ok()?;
    let (name, app_id, holder) = (name.to_string(), app_id.to_string(), holder.clone());
    Some(Box::new(move || {
        let mut cm =
            ConfigMapStore::new(&own, &name, &app_id).holding(holder, (interval, Duration::ZERO));
        if let Err(e) = cm.release() {
            log::warn!("could not give up the holder record of ConfigMap {name}: {e}");
        }
    }))
}

/// A namespace name is a DNS-1123 label: lower-case letters, digits and '-', at most 63,
/// alphanumeric at both ends. Errors (exit 2): naming the flag and the context as the sources.
fn check_namespace(namespace: &str) -> Result<()> {
    let ok = !namespace.is_empty()
        && namespace.len() <= 63
        && namespace
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !namespace.starts_with('-')
        && !namespace.ends_with('-');
    if ok {
        return Ok(());
    }
    Err(Error::usage(format!(
        "namespace {:?} is not a valid namespace name (lower-case letters, digits and '-', \
         at most 63): check -n/--namespace or the kubeconfig context",
        namespace.chars().take(80).collect::<String>()
    )))
}

impl Env {
    /// Looks for the app's home in its namespace ([`super::home::look`]) and picks the store
    /// from it and `given` (`--state-store`, [`super::home::choose`]). Errors: exit 2 as
    /// `choose` says; the API's, explained.
    fn find_home(&mut self, given: Option<&StateStoreKind>) -> Result<()> {
        let found =
            super::home::look(&self.client, &self.app.app_id).map_err(|e| self.explain(e))?;
        let ns = self.client.namespace().to_string();
        self.store_kind = super::home::choose(given, &found, &self.app.app_id, &ns)?;
        self.found = found;
        // Each profile's ExecutorSet carries its own template: none is profile 0's.
        self.app.own_profile_templates = matches!(self.store_kind, StateStoreKind::ExecutorSet(_));
        Ok(())
    }

    /// Opens the state store for `command` ([`open_store`]), bound to this cluster,
    /// namespace and app; `loop_interval`: a `run` loop's `--interval` (behind its holder
    /// record's answer deadline).
    pub(super) fn open_store(
        &self,
        command: &str,
        loop_interval: Option<(Duration, &Control)>,
    ) -> std::result::Result<Box<dyn StateStore + '_>, StoreError> {
        let at = match &self.store_kind {
            StateStoreKind::File => StoreAt::File(self.state_path.clone()),
            StateStoreKind::ConfigMap(name) => StoreAt::ConfigMap(name.clone()),
            StateStoreKind::ExecutorSet(name) => StoreAt::ExecutorSet(name.clone()),
        };
        let by = (command, &self.services);
        let seeds = &self.app.profile_templates;
        open_store(&self.client, &at, &self.owner, by, loop_interval, seeds)
    }

    /// Reads the state without locking (read-only commands), checking that it belongs to
    /// this cluster, namespace and app.
    pub(super) fn read_state(&self) -> Result<AllocatorState> {
        let (st, check_server) = match &self.store_kind {
            StateStoreKind::File => (state::load(&self.state_path), true),
            StateStoreKind::ConfigMap(name) => (
                ConfigMapStore::new(&self.client, name, &self.app.app_id)
                    .read_only()
                    .load(),
                false,
            ),
            StateStoreKind::ExecutorSet(name) => (
                ExecutorSetStore::new(&self.client, name, &self.app.app_id, false).load(),
                false,
            ),
        };
        let st = st.map_err(store_error)?;
        if let Some(st) = &st {
            state::check_owner(st, &self.owner, check_server, &self.state_location())
                .map_err(store_error)?;
        }
        Ok(st.unwrap_or_else(AllocatorState::new))
    }

    /// Queues steering request `req` for the app's owner in its store (file store: a file
    /// in the queue beside the state; ConfigMap store: the ConfigMap's request key).
    /// Errors: the store's (exit 1 for I/O and the API, 2 for a store that is not ours).
    pub(super) fn submit(&self, req: &Steering) -> Result<()> {
        match &self.store_kind {
            StateStoreKind::File => {
                crate::store::queue::FileQueue::beside(&self.state_path).submit(req)
            }
            StateStoreKind::ConfigMap(name) => {
                crate::store::configmap::submit(&self.client, name, &self.app.app_id, req)
            }
            StateStoreKind::ExecutorSet(name) => {
                crate::store::executorset::submit(&self.client, name, &self.app.app_id, req, None)
                    .map(|_| ())
            }
        }
        .map_err(store_error)
    }

    /// The steering requests queued in the store, oldest first, not yet applied (those the
    /// state lists in `applied_requests` left out). Errors: as [`Env::read_state`].
    pub(super) fn queued(&self) -> Result<Vec<Steering>> {
        let queue = match &self.store_kind {
            StateStoreKind::File => crate::store::queue::FileQueue::beside(&self.state_path).list(),
            StateStoreKind::ConfigMap(name) => {
                crate::store::configmap::queued(&self.client, name, &self.app.app_id)
            }
            StateStoreKind::ExecutorSet(name) => {
                ExecutorSetStore::new(&self.client, name, &self.app.app_id, false).queued()
            }
        }
        .map_err(store_error)?;
        let applied = self.read_state()?.applied_requests;
        Ok(queue
            .into_iter()
            .filter(|r| !applied.contains(&r.id))
            .collect())
    }

    /// The loop that owns the app now, read without taking anything (for `status`): the
    /// holder of the state file's lock, or the holder record of the state ConfigMap or the
    /// ExecutorSet when it looks live (not asked); `None` when no loop owns it. Errors: the
    /// read's (exit 1).
    pub(super) fn owner(&self) -> Result<Option<String>> {
        Ok(match &self.store_kind {
            StateStoreKind::File => {
                crate::store::file::lock_holder(&self.state_path).map(|h| h.to_string())
            }
            StateStoreKind::ConfigMap(name) => {
                crate::store::configmap::holder(&self.client, name, &self.app.app_id)
                    .map_err(store_error)?
                    .map(|h| h.to_string())
            }
            StateStoreKind::ExecutorSet(name) => {
                crate::store::executorset::holder(&self.client, name, &self.app.app_id)
                    .map_err(store_error)?
                    .map(|h| h.to_string())
            }
        })
    }

    /// The live holder of the app's leader-election Lease (`podalloc-<app id>`), read again
    /// and judged as [`super::home::read_lease`] does (a Lease judged stale when the command
    /// looked for the app's home is not watched again); `None` when nobody holds it or it
    /// cannot be read (logged at debug: RBAC may not grant leases).
    pub(super) fn lease_leader(&self) -> Option<String> {
        let stale = self.found.stale_lease.as_deref();
        super::home::read_lease(&self.client, &self.app.app_id, stale).leader
    }

    /// Refuses (exit 3) a command that acts on the app by itself (`reconcile`, a `run`
    /// without `--leader-elect`) while another identity holds the app's Lease: that leader
    /// owns the app, whichever store this command would use. The Lease is the one read when
    /// the command looked for the app's home ([`super::home::look`]): no second GET.
    pub(super) fn refuse_under_leader(&self, command: &str) -> Result<()> {
        match self.found.leader.clone() {
            None => Ok(()),
            Some(leader) => Err(Error::locked(format!(
                "app {} is owned by {leader}, a `run --leader-elect` replica: this {command} \
                 did nothing (exit 3); steer it with scale, add or remove, or stop it first",
                self.app.app_id
            ))),
        }
    }

    /// Adds the API server and the source of the connection settings to an error of an API
    /// call (exit 1 or 4), so a connection failure says where it tried to connect and why
    /// there. State file errors are left as they are.
    pub(super) fn explain(&self, mut e: Error) -> Error {
        use crate::error::ExitCode;
        let api = matches!(e.code, ExitCode::Runtime | ExitCode::Refused)
            && !e.message.starts_with("state file");
        if api {
            e.message = format!(
                "{} [API server {}; connection settings from {}]",
                e.message, self.owner.server, self.conn_source
            );
        }
        e
    }

    /// The ExecutorSet the app's intent lives in (`--state-store executorset:NAME`), if so.
    pub(super) fn executor_set(&self) -> Option<&str> {
        match &self.store_kind {
            StateStoreKind::ExecutorSet(name) => Some(name),
            _ => None,
        }
    }

    /// Where the state lives, for `status`.
    pub(super) fn state_location(&self) -> String {
        match &self.store_kind {
            StateStoreKind::File => self.state_path.display().to_string(),
            StateStoreKind::ConfigMap(name) => format!("configmap:{name}"),
            StateStoreKind::ExecutorSet(name) => format!("executorset:{name}"),
        }
    }

    /// Runs one tick with the app's `memory`, warning first when TLS verification is off,
    /// and writes the metrics file (and `/metrics`' text) after it; `leader`: the election's
    /// [`crate::controller::leader::LeaderElection::leadership`], for the metrics.
    pub(super) fn tick(
        &self,
        store: &mut dyn StateStore,
        change: &Request,
        memory: &mut Memory,
        leader: Option<(bool, u64)>,
    ) -> Result<TickReport> {
        if self.insecure {
            // Its own target: a security warning is repeated every tick, never collapsed.
            warn!(
                target: "podalloc::security",
                "TLS certificate verification is disabled (--insecure-skip-tls-verify): \
                 anyone on the path can impersonate the API server"
            );
        }
        let started = Instant::now();
        let budget = started + self.tick_budget;
        let (at, what) = match self.run_deadline {
            Some(d) if d < budget => (d, "run --timeout".to_string()),
            _ => (
                budget,
                format!(
                    "the tick budget of {} (4 × --request-timeout)",
                    humantime::format_duration(self.tick_budget)
                ),
            ),
        };
        self.client.set_deadline(Some(at), &what);
        let mut cx = TickCx {
            services: &self.services,
            memory,
        };
        let res = reconcile::tick(&mut cx, &self.client, &self.app, store, change, now_ms())
            .map(|mut report| {
                report.error = report.error.map(|e| self.explain(e));
                report
            })
            .map_err(|e| self.explain(e));
        // Calls between ticks (events, a status read) have only their own request timeout.
        self.client.set_deadline(None, "");
        self.publish_metrics(store, &res, started.elapsed(), leader);
        res
    }
}

impl Env {
    /// After every tick, failed ones too (their API errors are counted): the app's and the
    /// process's metrics to `/metrics` and the metrics file, when either is on.
    fn publish_metrics(
        &self,
        store: &mut dyn StateStore,
        res: &Result<TickReport>,
        took: Duration,
        leader: Option<(bool, u64)>,
    ) {
        let probe = self.services.probe.as_ref();
        if self.metrics_file.is_none() && probe.is_none() {
            return;
        }
        let state = match res {
            Ok(report) => Some(report.state.clone()),
            Err(_) => store.load().ok().flatten(),
        };
        let Some(state) = state else { return };
        let (app, ns) = (&self.app.app_id, self.client.namespace());
        let text =
            crate::controller::metrics::render(app, ns, res.as_ref().ok(), &state, took, leader);
        let requests = crate::controller::metrics::render_requests(&self.client.stats());
        if let Some(p) = probe {
            p.set_app_metrics(ns, app, text.clone());
            p.set_process_metrics(requests.clone());
        }
        if let Some(path) = &self.metrics_file {
            let text = format!("{text}{requests}");
            if let Err(e) = crate::controller::metrics::write_atomic(path, &text) {
                warn!("cannot write the metrics file {}: {e}", path.display());
            }
        }
    }
}

/// Logs a one-shot tick's line and turns its first error into the command's.
pub(super) fn finish(report: TickReport) -> Result<()> {
    info!("{}", report.line());
    match report.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
