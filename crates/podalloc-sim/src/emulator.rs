//! A kubelet and a one-node scheduler for a **real** kube-apiserver, the way kwok drives one:
//! the simulator's own kubelet model (the status functions of `pod.rs` and `containers.rs`,
//! the same start-up latency, jitter and failure draws) applied to pods on a real server
//! through the real API, so the end-to-end tests run unchanged against both servers.
//!
//! What it does, as the real components do it:
//! - keeps one Node (`emu-node-0`) with a Ready status (`PUT nodes/NAME/status`);
//! - **binds** each new pod of a managed namespace after the schedule latency with `POST
//!   pods/NAME/binding` (the scheduler's call: the server sets `spec.nodeName` and
//!   `PodScheduled=True`); a pod it is told to leave unscheduled ([`KubeletEmulator::hold`])
//!   instead gets `PodScheduled=False`, reason `Unschedulable`, on its status;
//! - reports the pod's life through the **status subresource** (`PUT pods/NAME/status` with
//!   the object's `resourceVersion`, so a lost race is a 409 and is retried on the newer
//!   object): ContainerCreating, then Running (or Failed at the failure rate), image pull
//!   errors and back-off, init containers and native sidecars, a volume that never mounts;
//! - finishes a graceful delete as the kubelet's status manager does: the containers are
//!   stopped (exit 143), then `DELETE` with `gracePeriodSeconds: 0` and a **uid
//!   precondition**, so a pod recreated under the same name is never deleted by mistake.
//!
//! It follows the pods with one cluster-wide watch (`GET /api/v1/pods?watch=1`, resumed from
//! the last resourceVersion, a fresh list after a 410), so its counters see every state a
//! pod was in: the live pods per app and their maximum, and executor ids created twice
//! ([`KubeletEmulator::stats`], the same [`SimStats`] the simulator keeps). Only namespaces
//! handed to [`KubeletEmulator::manage`] are touched; it runs as an admin user.

use crate::containers;
use crate::options::SimStats;
use crate::pod::{self, Phase, Termination};
use crate::process::{self, Proc, ProcessOptions};
use crate::util::{rfc3339, unit_draw};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, BufRead, BufReader};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// The node every pod is bound to.
pub const NODE: &str = "emu-node-0";
const HOST_IP: &str = "172.18.0.2";
/// How often the worker looks for transitions that fell due.
const STEP: Duration = Duration::from_millis(10);
/// The draw stream of the start-up jitter (as the simulator's store).
const JITTER_STREAM: u64 = 0x4A17_7E55_0000_0001;

/// How pods live in one managed namespace (latencies from the moment the emulator saw the
/// event that causes them).
#[derive(Clone, Debug)]
pub struct EmulatorOptions {
    /// Creation seen → bound.
    pub schedule_latency: Duration,
    /// Bound → Running.
    pub startup_latency: Duration,
    /// Spread of the start-up latency: uniform over latency × [1 − J, 1 + J], J in 0..=1.
    pub startup_jitter: f64,
    /// Deletion seen → containers stopped and the pod removed (at most the grace period).
    pub stop_latency: Duration,
    /// Share of pods whose executor exits 1 right after starting (drawn per pod from `seed`).
    pub failure_rate: f64,
    /// Seed of the failure and jitter draws.
    pub seed: u64,
    /// Images the registry does not have (`ErrImagePull`, then `ImagePullBackOff`).
    pub missing_images: Vec<String>,
    /// The process kubelet ([`crate::process`]): run each Spark executor pod (label
    /// `spark-role=executor`) as a local JVM and leave every other pod alone. The pod is
    /// Running while the process runs and Succeeded/Failed with its exit code when it ends;
    /// a deleted pod's process gets SIGTERM, SIGKILL once the grace period is over, and the
    /// pod is then removed (grace 0, uid precondition). The latencies but `schedule_latency`
    /// and `startup_latency`, the failure rate and the missing images do not apply.
    pub process: Option<ProcessOptions>,
}

impl Default for EmulatorOptions {
    /// 50 ms to schedule, 300 ms to start, 100 ms to stop, no failures.
    fn default() -> Self {
        EmulatorOptions {
            schedule_latency: Duration::from_millis(50),
            startup_latency: Duration::from_millis(300),
            startup_jitter: 0.0,
            stop_latency: Duration::from_millis(100),
            failure_rate: 0.0,
            seed: 0,
            missing_images: Vec::new(),
            process: None,
        }
    }
}

/// Where one pod is in the emulated kubelet's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Not bound yet.
    Unbound,
    /// Held unschedulable: `PodScheduled=False` reported.
    Held,
    /// Bound; containers being created (reported or still to report).
    Bound,
    /// `ContainerCreating` reported; start due.
    Creating,
    /// An image pull failed at the instant; the back-off is due a start-up latency later.
    PullFailed,
    /// Started (or ended, or pinned by a test): only a deletion changes it now.
    Settled,
}

struct Tracked {
    obj: Value,
    uid: String,
    seq: u64,
    seen: Instant,
    bound_at: Option<Instant>,
    pull_failed_at: Option<Instant>,
    deleting_at: Option<Instant>,
    stage: Stage,
    status_sent: bool,
    live: bool,
    app: Option<String>,
}

#[derive(Default)]
struct NsStats {
    live_by_app: HashMap<String, u64>,
    stats: SimStats,
    ids_used: HashSet<(String, String)>,
}

#[derive(Default)]
struct State {
    opts: HashMap<String, EmulatorOptions>,
    pods: HashMap<String, Tracked>,
    stats: HashMap<String, NsStats>,
    held: HashSet<String>,
    /// The executor processes of the process kubelet, by pod key.
    procs: HashMap<String, Proc>,
    seq: u64,
    watch_error: Option<String>,
}

struct Shared {
    base: String,
    auth: String,
    agent: ureq::Agent,
    watch_agent: ureq::Agent,
    state: Mutex<State>,
    stop: AtomicBool,
}

/// A running emulator: a watch thread and a worker thread, stopped on drop.
pub struct KubeletEmulator {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// One call the worker makes.
enum Action {
    Bind(String, String, String),
    Hold(String),
    Status(String, Value, Stage),
    /// Finish a deleted pod; with the exit code of its process (process kubelet).
    Finish(String, Value, Option<i64>),
    /// Start the executor process of a pod (process kubelet).
    Spawn(String),
    /// Report that a pod's process ended with this exit code (process kubelet).
    Exited(String, i64),
}

/// A blocking HTTPS client that trusts the CA in `ca_pem` (PEM), returns error statuses as
/// responses, uses no proxy, and gives each call at most `timeout` (`None`: no limit, for a
/// watch).
pub fn agent(ca_pem: &str, timeout: Option<Duration>) -> ureq::Agent {
    let certs: Vec<_> = ureq::tls::parse_pem(ca_pem.as_bytes())
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(timeout)
        .build()
        .new_agent()
}

fn key_of(obj: &Value) -> String {
    let m = &obj["metadata"];
    format!(
        "{}/{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or("")
    )
}

fn rv_of(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn now_str() -> String {
    rfc3339(SystemTime::now())
}

fn is_live(obj: &Value) -> bool {
    obj["metadata"]["deletionTimestamp"].is_null()
        && matches!(obj["status"]["phase"].as_str(), Some("Pending" | "Running"))
}

impl KubeletEmulator {
    /// Connects to the server at `base` (`https://127.0.0.1:PORT`) trusting `ca_pem`, as the
    /// user of `token` (an admin: it binds pods, writes their status and creates a Node),
    /// creates the Node and starts following pods. Errors: the Node could not be created or
    /// the first list failed.
    pub fn start(base: &str, ca_pem: &str, token: &str) -> io::Result<KubeletEmulator> {
        let shared = Arc::new(Shared {
            base: base.trim_end_matches('/').to_string(),
            auth: format!("Bearer {token}"),
            agent: agent(ca_pem, Some(Duration::from_secs(20))),
            watch_agent: agent(ca_pem, None),
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
        });
        shared.ensure_node()?;
        let rv = shared.relist()?;
        let w = Arc::clone(&shared);
        let watcher = std::thread::Builder::new()
            .name("emu-watch".into())
            .spawn(move || w.watch_loop(rv))?;
        let k = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name("emu-kubelet".into())
            .spawn(move || k.work_loop())?;
        Ok(KubeletEmulator {
            shared,
            threads: vec![watcher, worker],
        })
    }

    /// Starts managing the pods of namespace `ns` with `opts` (replacing earlier options),
    /// the pods already there included: they are listed now, since the watch passed them
    /// over while `ns` was not managed (a pod created before the emulator started would
    /// otherwise stay Pending until it changed). Errors: that list failed.
    pub fn manage(&self, ns: &str, opts: EmulatorOptions) -> io::Result<()> {
        {
            let mut st = self.shared.state.lock().unwrap();
            st.opts.insert(ns.to_string(), opts);
            st.stats.entry(ns.to_string()).or_default();
        }
        self.shared
            .list_into(&format!("/api/v1/namespaces/{ns}/pods"))
            .map(drop)
    }

    /// Leaves pod `ns/name` unscheduled (`PodScheduled=False`, `Unschedulable`) once it
    /// appears, until [`KubeletEmulator::release`].
    pub fn hold(&self, ns: &str, name: &str) {
        let mut st = self.shared.state.lock().unwrap();
        st.held.insert(format!("{ns}/{name}"));
    }

    /// Lets a held pod be scheduled.
    pub fn release(&self, ns: &str, name: &str) {
        let mut st = self.shared.state.lock().unwrap();
        let key = format!("{ns}/{name}");
        st.held.remove(&key);
        if let Some(t) = st.pods.get_mut(&key) {
            if t.stage == Stage::Held {
                t.stage = Stage::Unbound;
            }
        }
    }

    /// The counters of namespace `ns` (live pods, their maximum per app, executor ids
    /// created twice, creates per app); request counters are not kept (zero).
    pub fn stats(&self, ns: &str) -> SimStats {
        let st = self.shared.state.lock().unwrap();
        let mut s = st
            .stats
            .get(ns)
            .map(|n| n.stats.clone())
            .unwrap_or_default();
        s.live_pods = st
            .pods
            .iter()
            .filter(|(k, t)| k.starts_with(&format!("{ns}/")) && t.live)
            .count() as u64;
        s
    }

    /// The watch's last error, if it could not follow the pods.
    pub fn watch_error(&self) -> Option<String> {
        self.shared.state.lock().unwrap().watch_error.clone()
    }

    /// Ends every container of pod `ns/name` in `phase` (`Failed` with `exit_code`/`reason`,
    /// `Succeeded` with 0, `Running`, or `Unknown` as a lost node reports it) and pins it:
    /// the emulator changes it no more but for a deletion. As
    /// `SimServer::set_pod_phase`. Errors: the pod does not exist or the update failed.
    pub fn set_pod_phase(
        &self,
        ns: &str,
        name: &str,
        phase: &str,
        exit_code: i64,
        reason: &str,
    ) -> io::Result<()> {
        let (phase, reason) = (phase.to_string(), reason.to_string());
        self.shared.pin_and_update(ns, name, move |v, uid, t| {
            match Phase::parse(&phase) {
                Some(Phase::Running) => pod::mark_running(v, uid, "10.244.0.9", t),
                Some(Phase::Unknown) => pod::mark_unknown(v, t),
                Some(p @ (Phase::Failed | Phase::Succeeded)) => {
                    pod::mark_terminated(v, uid, &Termination::exited(p, exit_code, &reason), t)
                }
                _ => return Err(format!("cannot set phase {phase:?}")),
            }
            Ok(())
        })
    }

    /// Ends one container of a running pod (see `SimServer::terminate_container`) and pins
    /// the pod. Errors: no such pod or container, or the update failed.
    pub fn terminate_container(
        &self,
        ns: &str,
        name: &str,
        container: &str,
        exit_code: i64,
        reason: Option<&str>,
    ) -> io::Result<()> {
        let (container, reason) = (container.to_string(), reason.map(str::to_string));
        self.shared.pin_and_update(ns, name, move |v, _, t| {
            containers::terminate(v, &container, exit_code, reason.as_deref(), t).map(|_| ())
        })
    }

    /// Stops both threads and the process kubelet's processes ([`Self::stop_processes`]).
    pub fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.stop_processes();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    /// Stops the process kubelet's processes (SIGTERM, SIGKILL after 5 s), so that no
    /// executor outlives the emulator; their pods are left as they are. (The watch thread may
    /// take up to its 30 s request to notice a stop: a program that is ending calls this and
    /// exits rather than waiting in [`Self::stop`].)
    pub fn stop_processes(&self) {
        let procs = std::mem::take(&mut self.shared.state.lock().unwrap().procs);
        let mut procs: Vec<Proc> = procs.into_values().collect();
        for p in &mut procs {
            p.signal(libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(5);
        for p in &mut procs {
            p.stop(until.saturating_duration_since(Instant::now()));
        }
    }
}

impl Drop for KubeletEmulator {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// A call with a JSON body (or none); returns the status and the body as JSON.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> io::Result<(u16, Value)> {
        let url = self.url(path);
        let a = &self.agent;
        let req = match method {
            "GET" => a.get(&url).header("Authorization", &self.auth).call(),
            "POST" | "PUT" | "DELETE" => {
                let text = body.map(Value::to_string).unwrap_or_default();
                let r = match method {
                    "POST" => a.post(&url),
                    "PUT" => a.put(&url),
                    _ => a.delete(&url).force_send_body(),
                };
                r.header("Authorization", &self.auth)
                    .content_type("application/json")
                    .send(text)
            }
            _ => return Err(io::Error::other(format!("unsupported method {method}"))),
        };
        let mut resp = req.map_err(io::Error::other)?;
        let code = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .map_err(io::Error::other)?;
        Ok((code, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    fn ensure_node(&self) -> io::Result<()> {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE, "type": "emulated"}}});
        let (code, body) = self.call("POST", "/api/v1/nodes", Some(&node))?;
        if code != 201 && code != 409 {
            return Err(io::Error::other(format!(
                "creating node {NODE}: {code} {body}"
            )));
        }
        // Read and written again on 409: another emulator on the same server (a previous
        // scenario's, still stopping) may have written the node in between.
        for _ in 0..10 {
            match self.put_node_status()? {
                (409, _) => std::thread::sleep(std::time::Duration::from_millis(50)),
                (200, _) => return Ok(()),
                (code, body) => {
                    return Err(io::Error::other(format!(
                        "node {NODE} status: {code} {body}"
                    )))
                }
            }
        }
        Err(io::Error::other(format!(
            "node {NODE} status: still 409 Conflict after 10 reads and writes"
        )))
    }

    /// One read of the node and one write of its Ready status (the answer's code and body).
    fn put_node_status(&self) -> io::Result<(u16, Value)> {
        let (code, mut obj) = self.call("GET", &format!("/api/v1/nodes/{NODE}"), None)?;
        if code != 200 {
            return Err(io::Error::other(format!(
                "reading node {NODE}: {code} {obj}"
            )));
        }
        let t = now_str();
        obj["status"] = json!({
            "capacity": {"cpu": "1k", "memory": "1Ti", "pods": "1M"},
            "allocatable": {"cpu": "1k", "memory": "1Ti", "pods": "1M"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status", "lastHeartbeatTime": t,
                "lastTransitionTime": t}],
            "addresses": [{"type": "InternalIP", "address": HOST_IP}],
            "nodeInfo": {"kubeletVersion": "emulated", "architecture": "amd64",
                "operatingSystem": "linux", "containerRuntimeVersion": "emulated",
                "kernelVersion": "", "osImage": "", "kubeProxyVersion": "",
                "machineID": "", "systemUUID": "", "bootID": ""},
            "phase": "Running"});
        self.call("PUT", &format!("/api/v1/nodes/{NODE}/status"), Some(&obj))
    }

    /// Lists every pod (paginated) into the tracked set; returns the list's resourceVersion.
    fn relist(&self) -> io::Result<String> {
        self.list_into("/api/v1/pods")
    }

    /// Lists the pods of collection `pods` (`/api/v1/pods`, or one namespace's) into the
    /// tracked set, page by page; returns the list's resourceVersion.
    fn list_into(&self, pods: &str) -> io::Result<String> {
        let mut cont = String::new();
        loop {
            let mut path = format!("{pods}?limit=500");
            if !cont.is_empty() {
                path.push_str("&continue=");
                path.push_str(&cont);
            }
            let (code, list) = self.call("GET", &path, None)?;
            if code != 200 {
                return Err(io::Error::other(format!("listing pods: {code} {list}")));
            }
            for item in list["items"].as_array().into_iter().flatten() {
                let mut item = item.clone();
                item["kind"] = json!("Pod");
                item["apiVersion"] = json!("v1");
                self.observe("ADDED", item);
            }
            cont = list["metadata"]["continue"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if cont.is_empty() {
                let rv = list["metadata"]["resourceVersion"].as_str().unwrap_or("0");
                return Ok(rv.to_string());
            }
        }
    }

    fn watch_loop(&self, mut rv: String) {
        while !self.stop.load(Ordering::SeqCst) {
            match self.watch_once(&rv) {
                Ok(Some(next)) => rv = next,
                Ok(None) => match self.relist() {
                    Ok(next) => rv = next,
                    Err(e) => self.watch_failed(e),
                },
                Err(e) => self.watch_failed(e),
            }
        }
    }

    fn watch_failed(&self, e: io::Error) {
        if !self.stop.load(Ordering::SeqCst) {
            self.state.lock().unwrap().watch_error = Some(e.to_string());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One watch request from `rv` until the server ends it (the next rv), or 410 (`None`:
    /// relist).
    fn watch_once(&self, rv: &str) -> io::Result<Option<String>> {
        let url = self.url(&format!(
            "/api/v1/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=30&resourceVersion={rv}"
        ));
        let resp = (self.watch_agent.get(&url))
            .header("Authorization", &self.auth)
            .call()
            .map_err(io::Error::other)?;
        if resp.status().as_u16() == 410 {
            return Ok(None);
        }
        if resp.status().as_u16() != 200 {
            return Err(io::Error::other(format!("watch: {}", resp.status())));
        }
        let mut last = rv.to_string();
        let reader = BufReader::new(resp.into_body().into_reader());
        for line in reader.lines() {
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            let line = line?;
            let Ok(ev) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let ty = ev["type"].as_str().unwrap_or("").to_string();
            let obj = ev["object"].clone();
            if ty == "ERROR" {
                return Ok(if obj["code"] == 410 { None } else { Some(last) });
            }
            if let Some(r) = obj["metadata"]["resourceVersion"].as_str() {
                last = r.to_string();
            }
            if ty != "BOOKMARK" {
                self.observe(&ty, obj);
            }
        }
        Ok(Some(last))
    }

    /// Folds one watch event into the tracked pods and the counters.
    fn observe(&self, ty: &str, obj: Value) {
        let key = key_of(&obj);
        let ns = key.split('/').next().unwrap_or("").to_string();
        let mut guard = self.state.lock().unwrap();
        let st = &mut *guard;
        if !st.opts.contains_key(&ns) {
            return;
        }
        let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let app = obj["metadata"]["labels"]["spark-app-selector"]
            .as_str()
            .map(str::to_string);
        let stats = st.stats.entry(ns.clone()).or_default();
        if ty == "DELETED" {
            if let Some(t) = st.pods.remove(&key).filter(|t| t.uid == uid) {
                count_live(stats, t.app.as_deref(), t.live, false);
            }
            // The pod is gone (ended before its delete, never bound, or removed by someone
            // else): its process, if still alive, goes at once.
            if st.procs.get(&key).is_some_and(|p| p.uid == uid) {
                if let Some(mut p) = st.procs.remove(&key) {
                    p.stop(Duration::ZERO);
                }
            }
            return;
        }
        let fresh = st.pods.get(&key).is_none_or(|t| t.uid != uid);
        if fresh {
            if let Some(old) = st.pods.remove(&key) {
                count_live(stats, old.app.as_deref(), old.live, false);
            }
            count_create(stats, &obj, app.as_deref());
            st.seq += 1;
            let stage = if obj["spec"]["nodeName"].as_str().unwrap_or("").is_empty() {
                Stage::Unbound
            } else {
                Stage::Bound
            };
            let now = Instant::now();
            st.pods.insert(
                key.clone(),
                Tracked {
                    obj: Value::Null,
                    uid,
                    seq: st.seq,
                    seen: now,
                    bound_at: (stage == Stage::Bound).then_some(now),
                    pull_failed_at: None,
                    deleting_at: None,
                    stage,
                    status_sent: false,
                    live: false,
                    app,
                },
            );
        }
        let t = st.pods.get_mut(&key).expect("tracked");
        if rv_of(&obj) < rv_of(&t.obj) {
            return;
        }
        let live = is_live(&obj);
        count_live(stats, t.app.as_deref(), t.live, live);
        t.live = live;
        if !obj["metadata"]["deletionTimestamp"].is_null() && t.deleting_at.is_none() {
            t.deleting_at = Some(Instant::now());
        }
        let bound = !obj["spec"]["nodeName"].as_str().unwrap_or("").is_empty();
        if bound && matches!(t.stage, Stage::Unbound | Stage::Held) {
            t.stage = Stage::Bound;
            t.bound_at = Some(Instant::now());
        }
        t.obj = obj;
    }

    fn work_loop(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let actions = self.due_actions(Instant::now());
            for a in actions {
                if self.stop.load(Ordering::SeqCst) {
                    return;
                }
                self.perform(a);
            }
            std::thread::sleep(STEP);
        }
    }

    /// What fell due at `now`, decided under the lock (the calls are made outside it).
    fn due_actions(&self, now: Instant) -> Vec<Action> {
        let mut guard = self.state.lock().unwrap();
        let st = &mut *guard;
        let mut out = Vec::new();
        for (key, t) in &st.pods {
            if t.obj.is_null() {
                continue;
            }
            let ns = key.split('/').next().unwrap_or("");
            let Some(o) = st.opts.get(ns) else { continue };
            if o.process.is_some() {
                if !process::is_executor(&t.obj) {
                    continue;
                }
                if let Some(p) = st.procs.get_mut(key).filter(|p| p.uid == t.uid) {
                    out.extend(process_step(key, t, p, now));
                    continue;
                }
            }
            if let Some(since) = t.deleting_at {
                if now >= since + o.stop_latency.min(grace_of(&t.obj)) {
                    out.push(Action::Finish(key.clone(), t.obj.clone(), None));
                }
                continue;
            }
            if let Some(a) = next_transition(key, t, o, st.held.contains(key), now) {
                out.push(a);
            }
        }
        out
    }

    fn perform(&self, a: Action) {
        let result = match a {
            Action::Bind(key, uid, name) => self.bind(&key, &uid, &name),
            Action::Hold(key) => self.update(&key, Stage::Held, |v, _, t| {
                let msg = "0/1 nodes are available: 1 Insufficient cpu.";
                pod::mark_unschedulable(v, t, msg);
                Ok(())
            }),
            Action::Status(key, obj, stage) => self.put_status(&key, &obj, stage),
            Action::Finish(key, obj, code) => self.finish(&key, obj, code),
            Action::Spawn(key) => self.spawn(&key),
            Action::Exited(key, code) => self.exited(&key, code),
        };
        if let Err(e) = result {
            log::debug!("emulator: {e}");
        }
    }

    fn bind(&self, key: &str, uid: &str, name: &str) -> io::Result<()> {
        let ns = key.split('/').next().unwrap_or("");
        let body = json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
        let (code, resp) = self.call(
            "POST",
            &format!("/api/v1/namespaces/{ns}/pods/{name}/binding"),
            Some(&body),
        )?;
        if code == 201 {
            let mut st = self.state.lock().unwrap();
            if let Some(t) = st.pods.get_mut(key).filter(|t| t.uid == uid) {
                t.stage = Stage::Bound;
                t.bound_at = Some(Instant::now());
            }
            return Ok(());
        }
        Err(io::Error::other(format!("binding {key}: {code} {resp}")))
    }

    /// Applies `f` to the tracked object and writes it through the status subresource,
    /// moving the pod to `stage` when the write lands.
    fn update(
        &self,
        key: &str,
        stage: Stage,
        f: impl FnOnce(&mut Value, &str, &str) -> Result<(), String>,
    ) -> io::Result<()> {
        let (mut obj, uid) = {
            let st = self.state.lock().unwrap();
            let t = st
                .pods
                .get(key)
                .ok_or_else(|| io::Error::other(format!("pod {key} not found")))?;
            (t.obj.clone(), t.uid.clone())
        };
        f(&mut obj, &uid, &now_str()).map_err(io::Error::other)?;
        self.put_status(key, &obj, stage)
    }

    fn put_status(&self, key: &str, obj: &Value, stage: Stage) -> io::Result<()> {
        let (ns, name) = key.split_once('/').unwrap_or(("", ""));
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}/status");
        let (code, resp) = self.call("PUT", &path, Some(obj))?;
        if code != 200 {
            // 409: the object changed meanwhile; the watch brings the newer one and the
            // transition is tried again on it.
            return Err(io::Error::other(format!("status of {key}: {code} {resp}")));
        }
        let mut st = self.state.lock().unwrap();
        if let Some(t) = st
            .pods
            .get_mut(key)
            .filter(|t| rv_of(&resp) >= rv_of(&t.obj))
        {
            t.stage = stage;
            t.status_sent = true;
            if stage == Stage::PullFailed {
                t.pull_failed_at = Some(Instant::now());
            }
            t.obj = resp;
        }
        Ok(())
    }

    /// The kubelet's end of a graceful delete: containers stopped (143, or the exit code of
    /// the pod's process), then the object removed with grace 0 under a uid precondition.
    fn finish(&self, key: &str, mut obj: Value, code: Option<i64>) -> io::Result<()> {
        let (ns, name) = key.split_once('/').unwrap_or(("", ""));
        let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let phase = obj["status"]["phase"].as_str().unwrap_or("");
        if phase == "Pending" || phase == "Running" {
            let term = code.map_or(Termination::killed(143), exit_termination);
            pod::mark_terminated(&mut obj, &uid, &term, &now_str());
            let path = format!("/api/v1/namespaces/{ns}/pods/{name}/status");
            let _ = self.call("PUT", &path, Some(&obj))?;
        }
        let body = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid}});
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
        let (code, resp) = self.call("DELETE", &path, Some(&body))?;
        match code {
            // 404: already gone; 409: a new pod of the same name, which is not ours to delete.
            200 | 404 | 409 => {
                let mut st = self.state.lock().unwrap();
                if let Some(t) = st.pods.get_mut(key).filter(|t| t.uid == uid) {
                    t.deleting_at = None;
                    t.stage = Stage::Settled;
                }
                if st.procs.get(key).is_some_and(|p| p.uid == uid) {
                    st.procs.remove(key);
                }
                Ok(())
            }
            _ => Err(io::Error::other(format!("deleting {key}: {code} {resp}"))),
        }
    }

    /// Starts the executor process of pod `key` (process kubelet); its Running status follows
    /// at the next step ([`process_step`]). A process that cannot start ends the pod Failed
    /// (exit 128, `StartError`, the error as the message), as a container runtime's refusal.
    fn spawn(&self, key: &str) -> io::Result<()> {
        let (obj, uid, opts) = {
            let st = self.state.lock().unwrap();
            let t = st.pods.get(key).ok_or_else(|| io::Error::other("gone"))?;
            let ns = key.split('/').next().unwrap_or("");
            let opts = st.opts.get(ns).and_then(|o| o.process.clone());
            (t.obj.clone(), t.uid.clone(), opts)
        };
        let opts = opts.ok_or_else(|| io::Error::other("not a process namespace"))?;
        let name = key.split_once('/').map_or("", |(_, n)| n);
        match process::spawn(&opts, &obj, name, &uid) {
            Ok(p) => {
                self.state.lock().unwrap().procs.insert(key.to_string(), p);
                Ok(())
            }
            Err(msg) => {
                log::warn!("process kubelet: {key}: {msg}");
                self.update(key, Stage::Settled, |v, uid, t| {
                    let mut term = Termination::exited(Phase::Failed, 128, "StartError");
                    term.message = Some(msg);
                    pod::mark_terminated(v, uid, &term, t);
                    Ok(())
                })
            }
        }
    }

    /// Reports that the process of pod `key` ended with `code`: Succeeded for 0, else Failed.
    fn exited(&self, key: &str, code: i64) -> io::Result<()> {
        self.update(key, Stage::Settled, |v, uid, t| {
            pod::mark_terminated(v, uid, &exit_termination(code), t);
            Ok(())
        })?;
        if let Some(p) = self.state.lock().unwrap().procs.get_mut(key) {
            p.reported = true;
        }
        Ok(())
    }

    /// Pins the pod (no more kubelet transitions but a deletion) and writes `f`'s status,
    /// reading the pod again after a 409, up to 20 times.
    fn pin_and_update(
        &self,
        ns: &str,
        name: &str,
        f: impl Fn(&mut Value, &str, &str) -> Result<(), String>,
    ) -> io::Result<()> {
        let key = format!("{ns}/{name}");
        for _ in 0..20 {
            let (code, mut obj) =
                self.call("GET", &format!("/api/v1/namespaces/{ns}/pods/{name}"), None)?;
            if code != 200 {
                return Err(io::Error::other(format!(
                    "pods {name:?} not found ({code})"
                )));
            }
            {
                let mut st = self.state.lock().unwrap();
                if let Some(t) = st.pods.get_mut(&key) {
                    t.stage = Stage::Settled;
                }
            }
            let uid = obj["metadata"]["uid"].as_str().unwrap_or("").to_string();
            f(&mut obj, &uid, &now_str()).map_err(io::Error::other)?;
            let path = format!("/api/v1/namespaces/{ns}/pods/{name}/status");
            let (code, resp) = self.call("PUT", &path, Some(&obj))?;
            match code {
                200 => return Ok(()),
                409 => continue,
                _ => return Err(io::Error::other(format!("status of {key}: {code} {resp}"))),
            }
        }
        Err(io::Error::other(format!(
            "status of {key}: conflicts 20 times"
        )))
    }
}

/// The next kubelet or scheduler step of a pod that is not being deleted, if one is due.
fn next_transition(
    key: &str,
    t: &Tracked,
    o: &EmulatorOptions,
    held: bool,
    now: Instant,
) -> Option<Action> {
    let name = key.split_once('/').map(|(_, n)| n).unwrap_or("");
    match t.stage {
        Stage::Unbound if now >= t.seen + o.schedule_latency => Some(if held {
            Action::Hold(key.to_string())
        } else {
            Action::Bind(key.to_string(), t.uid.clone(), name.to_string())
        }),
        Stage::Bound => {
            let mut v = t.obj.clone();
            let node = v["spec"]["nodeName"].as_str().unwrap_or(NODE).to_string();
            let at = now_str();
            let host_ip = if o.process.is_some() {
                process::POD_IP
            } else {
                HOST_IP
            };
            pod::mark_scheduled(&mut v, &node, host_ip, &at);
            containers::mark_initializing(&mut v, &at);
            Some(Action::Status(key.to_string(), v, Stage::Creating))
        }
        Stage::Creating => {
            let due = t.bound_at.unwrap_or(t.seen) + startup_latency(o, t.seq);
            if now < due {
                None
            } else if o.process.is_some() {
                Some(Action::Spawn(key.to_string()))
            } else {
                start_action(key, t, o)
            }
        }
        Stage::PullFailed => {
            let due = t.pull_failed_at.unwrap_or(t.seen) + o.startup_latency;
            if now < due {
                return None;
            }
            let mut v = t.obj.clone();
            containers::back_off(&mut v);
            Some(Action::Status(key.to_string(), v, Stage::Settled))
        }
        _ => None,
    }
}

/// The grace period of a pod being deleted (`metadata.deletionGracePeriodSeconds`; 0 if absent).
fn grace_of(obj: &Value) -> Duration {
    obj["metadata"]["deletionGracePeriodSeconds"]
        .as_u64()
        .map(Duration::from_secs)
        .unwrap_or(Duration::ZERO)
}

/// How a container that exited with `code` ends its pod: Succeeded (`Completed`) for 0, else
/// Failed (`Error`).
fn exit_termination(code: i64) -> Termination {
    if code == 0 {
        Termination::exited(Phase::Succeeded, 0, "Completed")
    } else {
        Termination::exited(Phase::Failed, code, "Error")
    }
}

/// The process kubelet's next step for a pod whose process exists: signals sent at once
/// (SIGTERM when its deletion is seen, SIGKILL when the grace period has run out), and the
/// status call that is due: Running once started, the end once the process has ended, the
/// final delete once a deleted pod's process has ended.
fn process_step(key: &str, t: &Tracked, p: &mut Proc, now: Instant) -> Option<Action> {
    let code = p.poll();
    if let Some(since) = t.deleting_at {
        if let Some(c) = code {
            p.reported = true;
            return Some(Action::Finish(key.to_string(), t.obj.clone(), Some(c)));
        }
        if p.term_at.is_none() {
            p.signal(libc::SIGTERM);
        } else if !p.killed && now >= since + grace_of(&t.obj) {
            p.signal(libc::SIGKILL);
        }
        return None;
    }
    match code {
        Some(c) if !p.reported => Some(Action::Exited(key.to_string(), c)),
        None if t.stage != Stage::Settled => {
            let mut v = t.obj.clone();
            pod::mark_running(&mut v, &t.uid, process::POD_IP, &now_str());
            Some(Action::Status(key.to_string(), v, Stage::Settled))
        }
        _ => None,
    }
}

/// The kubelet starts the pod, with the simulator's rules: the failure draw, a volume that
/// never mounts, init containers and missing images through `containers::start`.
fn start_action(key: &str, t: &Tracked, o: &EmulatorOptions) -> Option<Action> {
    let mut v = t.obj.clone();
    let (uid, at) = (t.uid.as_str(), now_str());
    let ip = format!("10.244.{}.{}", (t.seq >> 8) & 255, t.seq & 255);
    // A Secret volume never mounts (as in the simulator, which serves no Secrets); the
    // emulator does not look ConfigMaps up, so a ConfigMap volume always mounts here.
    if containers::unmountable_volume(&v, |_| true).is_some() {
        return Some(Action::Status(key.to_string(), v, Stage::Settled));
    }
    let fail = o.failure_rate > 0.0 && unit_draw(o.seed, t.seq) < o.failure_rate;
    let never = v["spec"]["restartPolicy"] == "Never";
    let images_missing = ["containers", "initContainers"].iter().any(|k| {
        v["spec"][k]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["image"].as_str())
            .any(|i| o.missing_images.iter().any(|m| m == i))
    });
    if !fail && (images_missing || containers::has_init(&v)) {
        let outcome = containers::start(&mut v, uid, &at, &o.missing_images);
        let stage = if outcome == containers::Started::PullFailed {
            Stage::PullFailed
        } else {
            pod::set_pod_ip(&mut v, &ip);
            Stage::Settled
        };
        return Some(Action::Status(key.to_string(), v, stage));
    }
    if !fail {
        pod::mark_running(&mut v, uid, &ip, &at);
    } else if never {
        pod::mark_running(&mut v, uid, &ip, &at);
        let term = Termination::exited(Phase::Failed, 1, "Error");
        pod::mark_terminated(&mut v, uid, &term, &at);
    } else {
        pod::mark_crash_loop(&mut v, uid, &ip, &at);
    }
    Some(Action::Status(key.to_string(), v, Stage::Settled))
}

/// The start-up latency of the pod with creation number `seq`, with the jitter (the
/// simulator's draw).
fn startup_latency(o: &EmulatorOptions, seq: u64) -> Duration {
    let j = o.startup_jitter.clamp(0.0, 1.0);
    if j == 0.0 {
        return o.startup_latency;
    }
    let u = 2.0 * unit_draw(o.seed ^ JITTER_STREAM, seq) - 1.0;
    o.startup_latency.mul_f64(1.0 + j * u)
}

fn count_live(s: &mut NsStats, app: Option<&str>, was: bool, now: bool) {
    if was == now {
        return;
    }
    if now {
        s.stats.live_pods += 1;
        s.stats.max_live_pods = s.stats.max_live_pods.max(s.stats.live_pods);
    } else {
        s.stats.live_pods = s.stats.live_pods.saturating_sub(1);
    }
    let Some(app) = app else { return };
    let n = s.live_by_app.entry(app.to_string()).or_insert(0);
    if now {
        *n += 1;
        let m = s
            .stats
            .max_live_pods_by_app
            .entry(app.to_string())
            .or_insert(0);
        *m = (*m).max(*n);
    } else {
        *n = n.saturating_sub(1);
    }
}

fn count_create(s: &mut NsStats, obj: &Value, app: Option<&str>) {
    let Some(app) = app else { return };
    s.stats.creates += 1;
    *s.stats.creates_by_app.entry(app.to_string()).or_insert(0) += 1;
    let Some(id) = obj["metadata"]["labels"]["spark-exec-id"].as_str() else {
        return;
    };
    if !s.ids_used.insert((app.to_string(), id.to_string())) {
        s.stats.duplicate_executor_ids += 1;
    }
    if let Ok(n) = id.parse::<u64>() {
        let ids: &mut BTreeMap<String, Vec<u64>> = &mut s.stats.executor_ids_created;
        ids.entry(app.to_string()).or_default().push(n);
    }
}
