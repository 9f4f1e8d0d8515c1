//! The settings and counters of a simulator, the data types of the crate's face (`lib.rs`
//! re-exports them): [`SimOptions`] for [`SimServer::start`](crate::SimServer::start), and
//! [`SimStats`], what [`SimServer::stats`](crate::SimServer::stats) and `GET /sim/stats`
//! report.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::faults::FaultRule;

/// Settings of a simulated API server. `Default` gives a loopback HTTPS server on an
/// ephemeral port with the latencies below.
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Address to listen on; default `127.0.0.1:0` (an ephemeral port; see
    /// [`SimServer::url`](crate::SimServer::url)).
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
    /// [`SimServer::set_faults`](crate::SimServer::set_faults) or `POST /sim/faults`. Default none.
    pub faults: Vec<FaultRule>,
    /// The `pods` hard limit of a ResourceQuota (`sim-quota`) in every namespace: a create
    /// that would make the namespace's pods that are not Succeeded/Failed exceed it gets
    /// 403 Forbidden. Change it with [`SimServer::set_pod_quota`](crate::SimServer::set_pod_quota) or `POST /sim/quota`.
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
    /// server's own CA (see [`SimServer::generate_client_cert`](crate::SimServer::generate_client_cert)). Needs `tls`.
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
