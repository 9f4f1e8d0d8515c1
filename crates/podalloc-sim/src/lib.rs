//! A simulated Kubernetes API server, with a simulated scheduler and kubelet.
//!
//! It serves five kinds, listed once in a kind table (`resources.rs`) that routing, RBAC
//! messages, fault and `forbid` verb names, discovery, OpenAPI and field selectors all read:
//!
//! | kind | path | verbs |
//! |---|---|---|
//! | Pod | `/api/v1/[namespaces/{ns}/]pods[/{name}]` | list, get, create, patch, delete, deletecollection |
//! | ConfigMap | `/api/v1/[namespaces/{ns}/]configmaps[/{name}]` | list, get, create, update, delete |
//! | Lease | `/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]` | get, create, update, delete |
//! | Event | `/api/v1/[namespaces/{ns}/]events[/{name}]` | list, get, create, patch |
//! | Namespace | `/api/v1/namespaces[/{name}]` | list, get, create |
//!
//! over HTTPS with a generated CA, or plain HTTP, and answers the way kube-apiserver does:
//! the same `Status` bodies, codes, validation messages, pod defaulting, graceful deletion
//! rules, resource versions and gzip threshold. Lists take label and field selectors (each
//! kind's selectable fields); pod lists also `limit`/`continue` pagination. ConfigMaps,
//! Leases and Events live in one registry (`registry.rs`, as the apiserver's generic
//! registry with a strategy per kind): one lock and one resourceVersion counter with the
//! pods (etcd's revision), uids and timestamps from the seeded RNG and the wall clock,
//! dry runs (`dryRun=All`) that store nothing and take no resourceVersion, the optimistic
//! lock (Leases allow no update without a resourceVersion), delete preconditions, merge
//! and strategic merge patch. A create in a namespace that does not exist
//! ([`SimOptions::namespaces`]) is 404, as the NamespaceLifecycle admission plugin answers.
//! Pod creates honour `fieldValidation` (Strict: 400 `strict decoding error: unknown field
//! "…"`; Warn, the default: `Warning: 299` headers).
//!
//! Pods then live a simulated life: Pending → scheduled (node, host IP) → Running (or
//! Failed / crash-looping with `failure_rate`), and a deleted pod's containers stop, it
//! turns Failed and disappears. Pods may have several containers (sidecars), init
//! containers and native sidecars (`restartPolicy: Always` init containers), each with its
//! own status as the kubelet reports it; images listed in [`SimOptions::missing_images`]
//! fail to pull (ErrImagePull, then ImagePullBackOff, naming the image), a Secret volume or
//! a missing ConfigMap volume keeps a pod in ContainerCreating, and tests end one container
//! with [`SimServer::terminate_container`] or force a phase with
//! [`SimServer::set_pod_phase`].
//!
//! kubectl works against it: API discovery (`/api`, `/apis` with `coordination.k8s.io`,
//! `/api/v1`, `/apis/coordination.k8s.io[/v1]`, each resource with exactly the verbs the
//! router serves), the OpenAPI v3 entries its `--validate=strict` checks, and the `Table`
//! format of `kubectl get` for pods, events and namespaces.
//!
//! For testing clients against a misbehaving cluster it can inject faults per verb
//! ([`FaultRule`]: 429s in both shapes, 500/503/504, dropped connections, lost or
//! truncated responses, slow answers, 410 on list pages), enforce a `pods` ResourceQuota,
//! deny verbs the way RBAC does, add latency to every API request, and require client
//! certificates (mutual TLS; [`SimServer::generate_client_cert`]).
//!
//! Side doors for tests, never authenticated: `GET /sim/stats` (the [`SimStats`] as
//! JSON), `POST /sim/pods/{ns}` (seed a pod; a `status.phase` in the body is kept and the
//! kubelet leaves the pod in that phase; a `PodList` body seeds every item in one request,
//! in order, stopping at the first that fails), `POST /sim/pods/{ns}/{name}/phase` with
//! `{"phase":"Failed","exitCode":137,"reason":"OOMKilled","message":"..."}`,
//! `GET|POST /sim/faults` (a JSON list of rule strings replaces the rules),
//! `GET|POST /sim/quota` (`{"pods": N}` or `{"pods": null}`), `POST /sim/cut`
//! (`{"user": NAME, "seconds": S}`: a partition between that user and the API, see
//! [`SimServer::cut_off`]) and `GET /sim/log` (the last 1000 requests as JSON lines, with
//! the authenticated user and a pod create's `metadata.name`, without headers).
//!
//! Plain std threads: one accepting, one per connection (HTTP/1.1 keep-alive), one for
//! the kubelet. Kubelet transitions are due at fixed offsets from the events that cause
//! them and are applied, in order, before every request is handled, so what a client
//! sees depends only on the clock. This crate uses nothing of podalloc.

mod api;
mod args;
mod configmap;
mod containers;
mod discovery;
pub mod emulator;
mod events;
mod faults;
mod http;
mod lease;
mod patch;
mod pod;
mod registry;
mod reqlog;
mod request;
mod resources;
mod schema;
mod selector;
mod status;
mod store;
mod strategy;
mod tls;
mod util;
mod validation;

#[cfg(test)]
mod container_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::pki_types::CertificateDer;
use store::{Store, StoreConfig};

pub use args::SimArgs;
pub use faults::{Fault, FaultRule, When};

/// How long an idle keep-alive connection is kept open.
const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a blocked write to a client may take before the connection is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings of a simulated API server. `Default` gives a loopback HTTPS server on an
/// ephemeral port with the latencies below.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Address to listen on; default `127.0.0.1:0` (an ephemeral port; see
    /// [`SimServer::url`]).
    pub listen: SocketAddr,
    /// Serve HTTPS with a freshly generated CA (default) instead of plain HTTP.
    pub tls: bool,
    /// Write the CA certificate (PEM) to this file, for clients'
    /// `--certificate-authority`. Written atomically; ignored without `tls`.
    pub ca_out: Option<PathBuf>,
    /// Bearer token every `/api/...` request must carry; `None`: no authentication.
    pub token: Option<String>,
    /// Time from creation to scheduling (`spec.nodeName` set); default 200 ms.
    pub schedule_latency: Duration,
    /// Time from scheduling to Running; default 1 s.
    pub startup_latency: Duration,
    /// A gracefully deleted pod's containers stop after `min(grace period, this)`;
    /// default 500 ms. The object is removed up to 100 ms later.
    pub stop_latency: Duration,
    /// Probability in `[0, 1]` that a pod fails instead of starting (exit code 1, reason
    /// `Error`): `Failed` with `restartPolicy: Never`, otherwise `Running` in
    /// `CrashLoopBackOff` as a real kubelet would show it. Default 0.
    pub failure_rate: f64,
    /// Seed for the failure draws (the n-th created pod's draw depends only on the seed
    /// and n).
    pub seed: u64,
    /// Cap on items per list page even when the client asks for more (`None`: honour
    /// `limit`). Lists without `limit` are never paginated.
    pub max_page: Option<usize>,
    /// Number of fake nodes (`sim-node-1`...) pods are spread over; default 3. With 0,
    /// pods stay Pending with `PodScheduled=False`, reason `Unschedulable`.
    pub nodes: usize,
    /// Age after which a list's continue tokens answer 410 Expired; default 5 minutes
    /// (the etcd compaction window). Lower it to test clients' handling of 410.
    pub continue_ttl: Duration,
    /// Fault rules, tried in order for every authenticated API request (the first that
    /// hits wins); see [`FaultRule::parse`]. Replace them while running with
    /// [`SimServer::set_faults`] or `POST /sim/faults`. Default none.
    pub faults: Vec<FaultRule>,
    /// The `pods` hard limit of a ResourceQuota (`sim-quota`) in every namespace: a create
    /// that would make the namespace's pods that are not Succeeded/Failed exceed it gets
    /// 403 Forbidden. Change it with [`SimServer::set_pod_quota`] or `POST /sim/quota`.
    /// Default `None` (no quota).
    pub pod_quota: Option<u64>,
    /// Verbs (the names of [`FaultRule::verb`]: `create`, `list`, `cm-update`...) that
    /// the authorizer denies with RBAC's 403. Default none.
    pub forbid: Vec<String>,
    /// PEM of the CA(s) that client certificates must chain to. When set, the TLS
    /// handshake requires and verifies a client certificate (unless
    /// `client_cert_optional`), and a request with a verified certificate is
    /// authenticated as its common name, without a bearer token. Needs `tls`.
    pub client_ca: Option<String>,
    /// Require client certificates; without `client_ca` they must be signed by the
    /// server's own CA (see [`SimServer::generate_client_cert`]). Needs `tls`.
    pub require_client_cert: bool,
    /// With `client_ca`: ask for a client certificate and verify it when one is sent, but
    /// let clients without one authenticate with the bearer token (what kube-apiserver's
    /// `--client-ca-file` does). Ignored when `require_client_cert` is set.
    pub client_cert_optional: bool,
    /// Added before handling every `/api/...` request (after reading it, before
    /// authentication), so that clients see slow responses. Default zero.
    pub latency: Duration,
    /// Image references (exact, e.g. `registry.example/spark:bad`) the simulated registry
    /// does not have: a container or init container using one waits in `ErrImagePull`, then
    /// `ImagePullBackOff`, naming the image, and the pod stays Pending. Default none.
    pub missing_images: Vec<String>,
    /// More bearer tokens, each authenticating as its own user, as kube-apiserver's static
    /// token file (`--token-auth-file`, lines `token,user,uid`) does: `(token, user)`. The
    /// request log names the user of every request, so tests can tell processes apart.
    /// Default none.
    pub users: Vec<(String, String)>,
    /// The namespaces that exist: a create in any other is 404 `namespaces "x" not
    /// found`, as the NamespaceLifecycle admission plugin answers. `None` (the default):
    /// every valid namespace name exists. `podalloc sim` passes `default,kube-system`
    /// unless told otherwise (`--namespaces`).
    pub namespaces: Option<Vec<String>>,
    /// Spread of the start-up latency: each pod starts `startup_latency × (1 + j × u)`
    /// after it is scheduled, `u` uniform in `[-1, 1]` and drawn from `seed` and the pod's
    /// creation number (deterministic). In `[0, 1]`; default 0 (every pod takes exactly
    /// `startup_latency`).
    pub startup_jitter: f64,
    /// Probability in `[0, 1]` that a pod reaching the scheduler before
    /// `unschedulable_until` (measured from the server's start) finds no room: it stays
    /// Pending with `PodScheduled=False`, reason `Unschedulable`, message `0/N nodes are
    /// available: N Insufficient cpu.`, until then ("a node is added"), when it is
    /// scheduled and starts after the start-up latency. Drawn from `seed` and the pod's
    /// creation number. Default 0.
    pub unschedulable_fraction: f64,
    /// See `unschedulable_fraction`; default zero.
    pub unschedulable_until: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
            tls: true,
            ca_out: None,
            token: None,
            schedule_latency: Duration::from_millis(200),
            startup_latency: Duration::from_secs(1),
            stop_latency: Duration::from_millis(500),
            failure_rate: 0.0,
            seed: 0,
            max_page: None,
            nodes: 3,
            continue_ttl: Duration::from_secs(300),
            faults: Vec::new(),
            pod_quota: None,
            forbid: Vec::new(),
            client_ca: None,
            require_client_cert: false,
            client_cert_optional: false,
            latency: Duration::ZERO,
            missing_images: Vec::new(),
            users: Vec::new(),
            startup_jitter: 0.0,
            unschedulable_fraction: 0.0,
            unschedulable_until: Duration::ZERO,
            namespaces: None,
        }
    }
}

/// Counters of a running simulator, also served as JSON at `GET /sim/stats`.
///
/// A pod is *live* while it exists, has no `deletionTimestamp` and is Pending or Running.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct SimStats {
    /// HTTP requests handled, except those to `/sim/...`.
    pub requests: u64,
    /// List calls (each page counts).
    pub lists: u64,
    /// Successful creates through the API (not seeded pods).
    pub creates: u64,
    /// Creates refused with 409 AlreadyExists.
    pub create_conflicts: u64,
    /// Successful (200) deletes through the API, one per pod for delete-collection.
    pub deletes: u64,
    /// Live pods now.
    pub live_pods: u64,
    /// Most live pods at any moment.
    pub max_live_pods: u64,
    /// Most live pods at any moment per `spark-app-selector` label value (pods without
    /// the label are not counted here).
    pub max_live_pods_by_app: BTreeMap<String, u64>,
    /// Successful API creates whose (`spark-app-selector`, `spark-exec-id`) label pair
    /// had been used by a pod created before (through the API or seeded, whether or not
    /// it still exists): duplicated and reused executor ids alike.
    pub duplicate_executor_ids: u64,
    /// Per `spark-app-selector`, the numeric `spark-exec-id` of every successful API
    /// create, in creation order.
    pub executor_ids_created: BTreeMap<String, Vec<u64>>,
    /// Successful API creates per `spark-app-selector`.
    pub creates_by_app: BTreeMap<String, u64>,
    /// Creates refused by the `pods` quota (403).
    pub quota_rejections: u64,
    /// Injected faults, keyed `VERB:FAULT` (e.g. `create:lost-response`).
    pub faults_injected: BTreeMap<String, u64>,
}

type ConnMap = HashMap<u64, (TcpStream, Option<JoinHandle<()>>)>;

/// State shared by the server's threads.
pub(crate) struct Shared {
    pub(crate) store: Mutex<Store>,
    /// Wakes the kubelet thread when new events are queued (and on shutdown).
    pub(crate) kubelet: Condvar,
    pub(crate) token: Option<String>,
    pub(crate) requests: AtomicU64,
    pub(crate) faults: Mutex<faults::FaultState>,
    /// Verbs denied as RBAC would.
    pub(crate) forbid: Vec<String>,
    /// Added before every `/api` request.
    pub(crate) latency: Duration,
    pub(crate) log: Mutex<reqlog::RequestLog>,
    /// `SimOptions::users`.
    pub(crate) users: Vec<(String, String)>,
    /// Users cut off from the API until the given time ([`SimServer::cut_off`]).
    pub(crate) cuts: Mutex<HashMap<String, Instant>>,
    tls: Option<Arc<rustls::ServerConfig>>,
    stopping: AtomicBool,
    stopped: Mutex<bool>,
    stopped_cv: Condvar,
    conns: Mutex<ConnMap>,
    next_conn: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    wake_addr: SocketAddr,
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The counters now, for [`SimServer::stats`] and `GET /sim/stats`.
pub(crate) fn collect_stats(shared: &Shared, now: Instant) -> SimStats {
    let mut s = relock(&shared.store).stats(now);
    s.requests = shared.requests.load(Ordering::Relaxed);
    s.faults_injected = relock(&shared.faults).injected();
    s
}

fn invalid_input(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Shared {
    /// Whether namespace `ns` exists (see [`SimOptions::namespaces`]).
    pub(crate) fn namespace_exists(&self, ns: &str) -> bool {
        relock(&self.store).reg.namespace_exists(ns)
    }

    fn shutdown(&self) {
        if self.stopping.swap(true, Ordering::SeqCst) {
            self.wait_stopped(None);
            return;
        }
        // Wake the acceptor blocked in accept(); if that fails it is left detached.
        let woke = TcpStream::connect_timeout(&self.wake_addr, Duration::from_secs(1)).is_ok();
        {
            let _g = relock(&self.store);
            self.kubelet.notify_all();
        }
        let threads: Vec<JoinHandle<()>> = std::mem::take(&mut *relock(&self.threads));
        for (i, h) in threads.into_iter().enumerate() {
            // Thread 0 is the acceptor.
            if i > 0 || woke {
                let _ = h.join();
            }
        }
        let conns: Vec<(TcpStream, Option<JoinHandle<()>>)> =
            relock(&self.conns).drain().map(|(_, c)| c).collect();
        for (s, _) in &conns {
            let _ = s.shutdown(Shutdown::Both);
        }
        for (_, h) in conns {
            if let Some(h) = h {
                let _ = h.join();
            }
        }
        *relock(&self.stopped) = true;
        self.stopped_cv.notify_all();
    }

    /// Waits until stopped, at most `timeout`; true when stopped.
    fn wait_stopped(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut g = relock(&self.stopped);
        while !*g {
            match deadline {
                None => g = self.stopped_cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return false;
                    }
                    g = self
                        .stopped_cv
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        true
    }
}

/// A running simulated API server. Dropping it (or [`SimServer::stop`]) closes the
/// listener and every connection and joins the server's threads.
pub struct SimServer {
    shared: Arc<Shared>,
    url: String,
    ca_pem: Option<String>,
    pki: Option<tls::Pki>,
}

/// A cloneable handle that stops a [`SimServer`] from another thread (for example a
/// signal handler's loop while the main thread sits in [`SimServer::wait`]).
#[derive(Clone)]
pub struct SimStopHandle {
    shared: Arc<Shared>,
}

impl SimStopHandle {
    /// Stops the server (idempotent); returns once its threads have exited.
    pub fn stop(&self) {
        self.shared.shutdown();
    }
}

fn write_atomically(path: &std::path::Path, contents: &str) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(&dir)?;
    tmp.write_all(contents.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Checks the settings [`SimServer::start`] cannot take (`InvalidInput`) and parses
/// `client_ca`: its certificates, if given.
fn check_options(opts: &SimOptions) -> io::Result<Option<Vec<CertificateDer<'static>>>> {
    if !(0.0..=1.0).contains(&opts.failure_rate) {
        return Err(invalid_input(format!(
            "failure_rate must be within [0, 1], got {}",
            opts.failure_rate
        )));
    }
    for r in &opts.faults {
        r.validate()
            .map_err(|e| invalid_input(format!("fault rule \"{r}\": {e}")))?;
    }
    for v in &opts.forbid {
        faults::check_verb(v).map_err(|e| invalid_input(format!("forbid: {e}")))?;
    }
    let client_certs = opts.client_ca.is_some() || opts.require_client_cert;
    if client_certs && !opts.tls {
        return Err(invalid_input(
            "client certificates (client_ca, require_client_cert) need tls".to_string(),
        ));
    }
    match &opts.client_ca {
        Some(pem) => Ok(Some(tls::parse_pem_certs(pem)?)),
        None => Ok(None),
    }
}

/// The server's TLS set-up (with `opts.tls`): a fresh PKI whose server certificate also
/// names `addr`'s IP when it is neither loopback nor unspecified, the CA written to
/// `ca_out`, and client certificates checked against `client_roots` (or the simulator's
/// own CA with `require_client_cert`). Returns the rustls config, the CA PEM and the PKI;
/// all `None` for plain HTTP.
fn setup_tls(
    opts: &SimOptions,
    addr: SocketAddr,
    client_roots: Option<Vec<CertificateDer<'static>>>,
) -> io::Result<TlsSetup> {
    if !opts.tls {
        if opts.ca_out.is_some() {
            log::warn!("sim: ca_out is ignored without TLS");
        }
        return Ok((None, None, None));
    }
    let extra: Vec<IpAddr> = [addr.ip()]
        .into_iter()
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .collect();
    let pki = tls::Pki::generate(&extra)?;
    if let Some(path) = &opts.ca_out {
        write_atomically(path, &pki.ca_pem)?;
    }
    let roots = match client_roots {
        Some(r) => Some(r),
        None if opts.require_client_cert => Some(vec![pki.ca_der().clone()]),
        None => None,
    };
    let optional = opts.client_cert_optional && !opts.require_client_cert;
    let cfg = pki.server_config(roots.as_deref(), optional)?;
    Ok((Some(cfg), Some(pki.ca_pem.clone()), Some(pki)))
}

/// What [`setup_tls`] returns: the rustls server config, the CA PEM, the PKI.
type TlsSetup = (
    Option<Arc<rustls::ServerConfig>>,
    Option<String>,
    Option<tls::Pki>,
);

/// The store (pods, ConfigMaps, the kubelet's schedule) `opts` asks for.
fn new_store(opts: &SimOptions) -> Store {
    let cfg = StoreConfig {
        schedule_latency: opts.schedule_latency,
        startup_latency: opts.startup_latency,
        stop_latency: opts.stop_latency,
        failure_rate: opts.failure_rate,
        seed: opts.seed,
        nodes: opts.nodes,
        max_page: opts.max_page,
        continue_ttl: opts.continue_ttl,
        pod_quota: opts.pod_quota,
        startup_jitter: opts.startup_jitter,
        unschedulable_fraction: opts.unschedulable_fraction,
        unschedulable_until: opts.unschedulable_until,
    };
    let mut store = Store::new(cfg, util::WallClock::new());
    store.set_missing_images(opts.missing_images.clone());
    store.reg.set_namespaces(
        opts.namespaces
            .as_ref()
            .map(|n| n.iter().cloned().collect()),
    );
    store
}

impl SimServer {
    /// Binds `opts.listen`, generates the PKI (with `tls`), writes `ca_out` and starts
    /// the threads.
    ///
    /// # Errors
    ///
    /// The address cannot be bound, `ca_out` cannot be written, the TLS setup fails, a
    /// thread cannot be spawned, or (`InvalidInput`) `failure_rate` is outside `[0, 1]`,
    /// a fault rule or a `forbid` verb is invalid, `client_ca` holds no certificate, or
    /// client certificates are asked for without `tls`.
    pub fn start(opts: SimOptions) -> io::Result<SimServer> {
        let client_roots = check_options(&opts)?;
        let listener = TcpListener::bind(opts.listen)?;
        let addr = listener.local_addr()?;
        let host_ip = match addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let wake_addr = SocketAddr::new(host_ip, addr.port());
        let (tls, ca_pem, pki) = setup_tls(&opts, addr, client_roots)?;
        let scheme = if opts.tls { "https" } else { "http" };
        let url = match host_ip {
            IpAddr::V4(ip) => format!("{scheme}://{ip}:{}", addr.port()),
            IpAddr::V6(ip) => format!("{scheme}://[{ip}]:{}", addr.port()),
        };
        let shared = Arc::new(Shared {
            store: Mutex::new(new_store(&opts)),
            kubelet: Condvar::new(),
            token: opts.token.clone(),
            requests: AtomicU64::new(0),
            faults: Mutex::new(faults::FaultState::new(opts.faults.clone(), opts.seed)),
            forbid: opts.forbid.clone(),
            latency: opts.latency,
            log: Mutex::new(reqlog::RequestLog::new()),
            users: opts.users.clone(),
            cuts: Mutex::new(HashMap::new()),
            tls,
            stopping: AtomicBool::new(false),
            stopped: Mutex::new(false),
            stopped_cv: Condvar::new(),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            wake_addr,
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("sim-accept".into())
                .spawn(move || accept_loop(&shared, listener))?
        };
        relock(&shared.threads).push(acceptor);
        let kubelet = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("sim-kubelet".into())
                .spawn(move || kubelet_loop(&shared))
        };
        match kubelet {
            Ok(h) => relock(&shared.threads).push(h),
            Err(e) => {
                shared.shutdown();
                return Err(e);
            }
        }
        log::info!("sim: serving the pods API at {url}");
        Ok(SimServer {
            shared,
            url,
            ca_pem,
            pki,
        })
    }

    /// Base URL without a trailing slash: `https://127.0.0.1:PORT` (or `http://...`).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The CA certificate (PEM) that signed the server certificate; `None` without TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The counters now (pending kubelet transitions are applied first).
    pub fn stats(&self) -> SimStats {
        collect_stats(&self.shared, Instant::now())
    }

    /// Replaces the fault rules (as `POST /sim/faults` does); the per-verb request
    /// numbers that [`When::Nth`] counts start again from 1.
    ///
    /// # Panics
    ///
    /// When a rule does not pass [`FaultRule::validate`] (rules from
    /// [`FaultRule::parse`] always do); see [`SimServer::try_set_faults`].
    pub fn set_faults(&self, rules: Vec<FaultRule>) {
        if let Err(e) = self.try_set_faults(rules) {
            panic!("set_faults: {e}");
        }
    }

    /// [`SimServer::set_faults`] that reports an invalid rule instead of panicking.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when a rule does not pass [`FaultRule::validate`]; the rules in
    /// force are then left unchanged.
    pub fn try_set_faults(&self, rules: Vec<FaultRule>) -> io::Result<()> {
        for r in &rules {
            r.validate()
                .map_err(|e| invalid_input(format!("fault rule \"{r}\": {e}")))?;
        }
        relock(&self.shared.faults).replace(rules);
        Ok(())
    }

    /// The fault rules in force.
    pub fn faults(&self) -> Vec<FaultRule> {
        relock(&self.shared.faults).rules().to_vec()
    }

    /// Sets (or, with `None`, lifts) the `pods` quota of every namespace (as
    /// `POST /sim/quota` does).
    pub fn set_pod_quota(&self, pods: Option<u64>) {
        relock(&self.shared.store).set_pod_quota(pods);
    }

    /// The last (up to 1000) API requests as JSON lines, oldest first (what
    /// `GET /sim/log` serves): `seq`, `ms` since start, `method`, `path`, `query` (with
    /// secret-looking values redacted), `verb`, `user` (the authenticated user, see
    /// [`SimOptions::users`]), `status` (null when no response was sent) and `fault`.
    /// Headers are never logged.
    pub fn request_log(&self) -> String {
        relock(&self.shared.log).render()
    }

    /// Cuts `user` (a [`SimOptions::users`] name, the token user
    /// `system:serviceaccount:default:podalloc`, or a client certificate's common name) off
    /// from the API for `duration` from now, as a network partition between that client and
    /// the API server would: each of its API requests in that time hangs until the cut ends
    /// and is then answered 504 Timeout without being carried out (logged with the fault
    /// `504`). A new call replaces the user's cut; a zero duration ends it.
    pub fn cut_off(&self, user: &str, duration: Duration) {
        relock(&self.shared.cuts).insert(user.to_string(), Instant::now() + duration);
    }

    /// Issues a client certificate for `common_name` (the user it authenticates as),
    /// signed by the server's CA; returns (certificate PEM, private key PEM). Use with
    /// `require_client_cert`.
    ///
    /// # Panics
    ///
    /// Without `tls` (there is no CA), or if key generation fails.
    pub fn generate_client_cert(&self, common_name: &str) -> (String, String) {
        let pki = self
            .pki
            .as_ref()
            .expect("generate_client_cert needs a TLS simulator (SimOptions::tls)");
        pki.issue_client_cert(common_name)
            .unwrap_or_else(|e| panic!("cannot issue a client certificate: {e}"))
    }

    /// A handle that can stop the server from another thread.
    pub fn stop_handle(&self) -> SimStopHandle {
        SimStopHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops the server: closes the listener and all connections, joins the threads.
    pub fn stop(self) {
        drop(self);
    }

    /// Forces pod `ns/name` into `phase` (`Pending`, `Running`, `Succeeded`, `Failed`,
    /// `Unknown`), as `POST /sim/pods/{ns}/{name}/phase` does: the containers' statuses follow
    /// (terminated with exit 0 `Completed` or 1 `Error` for the terminal phases) and the
    /// kubelet leaves the pod in that phase (it still carries out a deletion).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an unknown phase, `NotFound` when there is no such pod.
    pub fn set_pod_phase(&self, ns: &str, name: &str, phase: &str) -> io::Result<()> {
        let phase = pod::Phase::parse(phase)
            .ok_or_else(|| invalid_input(format!("unknown pod phase {phase:?}")))?;
        let o = store::PhaseOverride {
            phase,
            exit_code: None,
            reason: None,
            message: None,
            disruption: None,
            waiting: None,
        };
        relock(&self.shared.store)
            .set_phase(ns, name, &o, Instant::now())
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("{e:?}")))?;
        self.shared.kubelet.notify_all();
        Ok(())
    }

    /// Ends one running container of pod `ns/name` with `exit_code` (reason `Completed` for
    /// 0, else `Error`, unless `reason` is given, e.g. `OOMKilled`), as the kubelet reports
    /// a container that exited: while another container of the pod runs (a sidecar), the
    /// pod stays Running and not Ready; once none does, the kubelet stops the native
    /// sidecars (exit 143) and the pod ends Succeeded, or Failed when a container exited
    /// non-zero (`restartPolicy: Never`). The kubelet leaves the pod alone from then on.
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming the problem: no such pod, no such container, or the container
    /// is not running.
    pub fn terminate_container(
        &self,
        ns: &str,
        name: &str,
        container: &str,
        exit_code: i64,
        reason: Option<&str>,
    ) -> io::Result<()> {
        relock(&self.shared.store)
            .terminate_container(ns, name, container, exit_code, reason, Instant::now())
            .map_err(invalid_input)?;
        self.shared.kubelet.notify_all();
        Ok(())
    }

    /// Blocks until the server has been stopped through a [`SimStopHandle`].
    pub fn wait(&self) {
        self.shared.wait_stopped(None);
    }

    /// Like [`SimServer::wait`] for at most `timeout`; true when the server has stopped.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.shared.wait_stopped(Some(timeout))
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        self.shared.shutdown();
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: TcpListener) {
    for conn in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            break;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                log::debug!("sim: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        let id = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        relock(&shared.conns).insert(id, (clone, None));
        let sh = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("sim-conn".into())
            .spawn(move || {
                serve_connection(&sh, stream);
                relock(&sh.conns).remove(&id);
            });
        match spawned {
            Ok(h) => {
                if let Some(entry) = relock(&shared.conns).get_mut(&id) {
                    entry.1 = Some(h);
                }
            }
            Err(e) => {
                log::warn!("sim: cannot start a connection thread: {e}");
                relock(&shared.conns).remove(&id);
            }
        }
    }
}

fn kubelet_loop(shared: &Shared) {
    let mut store = relock(&shared.store);
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        store.advance(now);
        let wait = store
            .next_due()
            .map_or(Duration::from_secs(1), |d| d.saturating_duration_since(now))
            .min(Duration::from_secs(1));
        store = shared
            .kubelet
            .wait_timeout(store, wait)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

fn serve_connection(shared: &Shared, tcp: TcpStream) {
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_read_timeout(Some(IDLE_TIMEOUT));
    let _ = tcp.set_write_timeout(Some(WRITE_TIMEOUT));
    match &shared.tls {
        Some(cfg) => {
            let conn = match rustls::ServerConnection::new(Arc::clone(cfg)) {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("sim: TLS session setup failed: {e}");
                    return;
                }
            };
            let mut stream = rustls::StreamOwned::new(conn, tcp);
            // Finish the handshake first: the client certificate names the user.
            while stream.conn.is_handshaking() {
                match stream.conn.complete_io(&mut stream.sock) {
                    Ok((0, 0)) => return,
                    Ok(_) => {}
                    Err(e) => {
                        log::debug!("sim: TLS handshake failed: {e}");
                        return;
                    }
                }
            }
            let user = stream
                .conn
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| tls::subject_common_name(c.as_ref()))
                .filter(|cn| !cn.is_empty());
            if serve_http(shared, &mut stream, user.as_deref()) {
                // Abort: no close_notify, as when the server process dies mid-request.
                let _ = stream.sock.shutdown(Shutdown::Both);
                return;
            }
            stream.conn.send_close_notify();
            let _ = stream.flush();
        }
        None => {
            let mut tcp = tcp;
            if serve_http(shared, &mut tcp, None) {
                let _ = tcp.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Serves requests until the connection ends; true when it must be aborted (a fault
/// dropped or truncated a response).
fn serve_http<S: io::Read + Write>(
    shared: &Shared,
    stream: &mut S,
    client_user: Option<&str>,
) -> bool {
    let mut conn = http::Conn::new(stream);
    loop {
        match conn.read_request() {
            Ok(None) => return false,
            Ok(Some(req)) => {
                let resp = match api::handle(shared, &req, client_user) {
                    api::Reply::Send(r) => r,
                    api::Reply::Drop => return true,
                    api::Reply::Truncate(r) => {
                        let _ = http::write_truncated(&mut conn.stream, r);
                        return true;
                    }
                    api::Reply::Trickle(r, every) => {
                        let _ = http::write_trickled(&mut conn.stream, r, every);
                        return false;
                    }
                };
                let keep = req.keep_alive && !shared.stopping.load(Ordering::SeqCst);
                let mut w = BufWriter::with_capacity(64 * 1024, &mut conn.stream);
                let written = http::write_response(&mut w, resp, keep, req.accepts_gzip())
                    .and_then(|()| w.flush());
                if written.is_err() || !keep {
                    return false;
                }
            }
            Err(http::ReadError::Bad(msg)) => {
                log::debug!("sim: malformed request: {msg}");
                let _ = http::write_plain_error(&mut conn.stream, 400);
                return false;
            }
            Err(http::ReadError::TooLarge(413)) => {
                let body = status::ApiError::too_large(http::MAX_BODY).to_json();
                let _ = http::write_response(
                    &mut conn.stream,
                    http::Response::json(413, body),
                    false,
                    false,
                );
                return false;
            }
            Err(http::ReadError::TooLarge(code)) => {
                let _ = http::write_plain_error(&mut conn.stream, code);
                return false;
            }
            Err(http::ReadError::Io(e)) => {
                log::trace!("sim: connection closed: {e}");
                return false;
            }
        }
    }
}
