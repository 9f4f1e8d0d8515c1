//! One end-to-end suite, two servers: each test here runs twice, as `NAME::on_sim` against
//! the built-in simulator and as `NAME::on_real` against a real kube-apiserver + etcd with the
//! kubelet emulator (`tests/real/`), with the same test code. The harness ([`Env`]) picks the
//! server; a test sees only what both have: the API, the podalloc binary, and the counters of
//! what the cluster lived through ([`podalloc_sim::SimStats`]: live pods and their maximum per
//! app, executor ids created twice, kept by the simulator itself or by the emulator's watch).
//!
//! On the real server podalloc runs as the user `podalloc`, which holds exactly the Role of
//! `deploy/rbac.yaml` in the test's namespace: a verb our RBAC lacks fails here with 403.

use crate::real::{self, ControlPlane};
use crate::util::{podalloc, stderr, stdout};
use podalloc_sim::emulator::EmulatorOptions;
use podalloc_sim::{SimOptions, SimServer, SimStats};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// How pods live, on either server.
#[derive(Clone, Debug)]
pub struct Pods {
    pub schedule_ms: u64,
    pub startup_ms: u64,
    pub stop_ms: u64,
    pub failure_rate: f64,
    pub missing_images: Vec<String>,
}

impl Default for Pods {
    fn default() -> Self {
        Pods {
            schedule_ms: 50,
            startup_ms: 300,
            stop_ms: 100,
            failure_rate: 0.0,
            missing_images: Vec::new(),
        }
    }
}

enum Server {
    Sim(Box<SimServer>),
    Real(&'static ControlPlane),
}

/// One test's cluster (a simulator of its own, or a namespace of its own on the real
/// control plane), a temporary directory, and podalloc's command line for it.
pub struct Env {
    server: Server,
    /// The test's namespace (`default` on the simulator).
    pub ns: String,
    /// The app id.
    pub app: String,
    pub dir: tempfile::TempDir,
    ca: PathBuf,
    token: String,
    admin_token: String,
    url: String,
    ca_pem: String,
    pods_opts: Pods,
    /// On the real server, each candidate's own route to it ([`Env::candidate_cmd`]), which
    /// [`Env::cut_off`] can cut.
    partitions: std::sync::Mutex<std::collections::BTreeMap<String, real::proxy::Partition>>,
}

const SIM_TOKEN: &str = "both-sim-token-0123456789";

/// The flags after `run` of the tests that time how soon a loop at rest follows people's
/// intent: target 2, a tick a second while it works and every 30 s at rest, so that only
/// what it watches can make it follow within 2 s.
pub const AT_REST: [&str; 6] = [
    "--target",
    "2",
    "--interval",
    "1s",
    "--idle-interval",
    "30s",
];

/// The leader-election candidates: the same users on both servers (the simulator's
/// [`SimOptions::users`], the control plane's static tokens), so that the server's own record
/// of requests (the simulator's request log, kube-apiserver's audit log) names the process
/// behind each one.
pub const CANDIDATES: [&str; 3] = ["a", "b", "c"];

/// The simulator's token of candidate `who`.
fn sim_candidate_token(who: &str) -> String {
    format!("both-candidate-{who}-0123456789")
}

/// One request of the test's namespace as the server recorded it: the simulator's request
/// log, or kube-apiserver's audit log (events at ResponseComplete; on the real server only
/// the candidates' pod, configmap and lease requests and the admin's lease writes are
/// recorded, see `scripts/controlplane.sh`).
#[derive(Clone, Debug)]
pub struct Act {
    /// The authenticated user (`podalloc-a` for candidate `a`).
    pub user: String,
    /// The Kubernetes verb: `get`, `list`, `create`, `update`, `patch`, `delete`.
    pub verb: String,
    /// `pods`, `configmaps`, `leases` (subresources and other resources are left out).
    pub resource: String,
    /// When the server received it and when it completed its answer, in µs (the audit
    /// log's requestReceivedTimestamp and stageTimestamp; on the simulator both are the
    /// log's `ms`, taken when it answered).
    pub at_us: u64,
    pub done_us: u64,
    /// The response's status code (0: none was sent).
    pub code: u16,
}

impl Act {
    /// A write (anything but `get` and `list`).
    pub fn is_write(&self) -> bool {
        !matches!(self.verb.as_str(), "get" | "list")
    }
}

/// An RFC 3339 time in UTC as the apiserver writes a `MicroTime`
/// (`2026-12-02T00:37:48.534367Z`), in µs since the epoch.
pub fn micros(t: &str) -> Option<u64> {
    let (date, time) = t.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut h = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (h.next()?.ok()?, h.next()?.ok()?, h.next()?.ok()?);
    let us: i64 = format!("{frac:0<6}")[..6].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    u64::try_from(((days * 24 + hh) * 60 + mm) * 60 + ss)
        .ok()
        .map(|s| s * 1_000_000 + us as u64)
}

impl Env {
    /// A simulator of its own, pods living as `pods`, in namespace `default`.
    pub fn sim(app: &str, pods: &Pods) -> Env {
        Env::sim_in(app, pods, "default")
    }

    /// [`Env::sim`] in namespace `ns`, the only one besides `default` and `kube-system` that
    /// exists on that simulator (a create elsewhere is 404, as on a real cluster).
    pub fn sim_in(app: &str, pods: &Pods, ns: &str) -> Env {
        Env::sim_forbidding(app, pods, ns, Vec::new())
    }

    /// [`Env::sim_in`] whose RBAC refuses the fault verbs `forbid` (`es-status-update`, …).
    fn sim_forbidding(app: &str, pods: &Pods, ns: &str, forbid: Vec<String>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        let opts = SimOptions {
            ca_out: Some(ca.clone()),
            token: Some(SIM_TOKEN.into()),
            schedule_latency: Duration::from_millis(pods.schedule_ms),
            startup_latency: Duration::from_millis(pods.startup_ms),
            stop_latency: Duration::from_millis(pods.stop_ms),
            failure_rate: pods.failure_rate,
            missing_images: pods.missing_images.clone(),
            namespaces: Some(vec!["default".into(), "kube-system".into(), ns.into()]),
            users: (CANDIDATES.iter())
                .map(|w| (sim_candidate_token(w), format!("podalloc-{w}")))
                .collect(),
            forbid,
            ..SimOptions::default()
        };
        let sim = SimServer::start(opts).unwrap();
        let url = sim.url();
        let ca_pem = sim.ca_pem().unwrap().to_string();
        Env {
            server: Server::Sim(Box::new(sim)),
            ns: ns.into(),
            app: app.into(),
            dir,
            ca,
            token: SIM_TOKEN.into(),
            admin_token: SIM_TOKEN.into(),
            url,
            ca_pem,
            pods_opts: pods.clone(),
            partitions: Default::default(),
        }
    }

    /// This environment with the server spelled by name, `localhost` for `127.0.0.1`, so
    /// podalloc looks it up (`kube/resolver.rs`) before it connects.
    pub fn by_name(mut self) -> Env {
        assert!(self.url.contains("127.0.0.1"), "{}", self.url);
        self.url = self.url.replacen("127.0.0.1", "localhost", 1);
        self
    }

    /// This environment with the server spelled `name`, looked up by the system's resolver
    /// (as its `/etc/resolv.conf` says), for `127.0.0.1`: its commands then need
    /// `--tls-server-name localhost`, the name both servers' certificates carry.
    pub fn named(mut self, name: &str) -> Env {
        assert!(self.url.contains("127.0.0.1"), "{}", self.url);
        self.url = self.url.replacen("127.0.0.1", name, 1);
        self
    }

    /// A namespace of its own on the real control plane; `None` (after one line) when it is
    /// not built here and not required.
    pub fn real(test: &str, app: &str, pods: &Pods) -> Option<Env> {
        let cp = real::control_plane()?;
        let opts = EmulatorOptions {
            schedule_latency: Duration::from_millis(pods.schedule_ms),
            startup_latency: Duration::from_millis(pods.startup_ms),
            stop_latency: Duration::from_millis(pods.stop_ms),
            failure_rate: pods.failure_rate,
            missing_images: pods.missing_images.clone(),
            ..EmulatorOptions::default()
        };
        let ns = cp.namespace(test, opts);
        Some(Env {
            server: Server::Real(cp),
            ns,
            app: app.into(),
            dir: tempfile::tempdir().unwrap(),
            ca: cp.ca_file.clone(),
            token: cp.podalloc_token.clone(),
            admin_token: cp.admin_token.clone(),
            url: cp.url.clone(),
            ca_pem: cp.ca_pem.clone(),
            pods_opts: pods.clone(),
            partitions: Default::default(),
        })
    }

    /// Another cluster of the same kind for test `test` (a simulator of its own, or another
    /// namespace on the control plane), with the same app and pods, for a test that plays
    /// several cases each on a fresh cluster.
    pub fn sibling(&self, test: &str) -> Env {
        match self.server {
            Server::Sim(_) => Env::sim_in(&self.app, &self.pods_opts, &self.ns),
            Server::Real(_) => Env::real(test, &self.app, &self.pods_opts).unwrap(),
        }
    }

    /// Another cluster for test `test`, as [`Env::sibling`], on which the `podalloc` user may
    /// not `verb` `resource` (an RBAC gap): the simulator refuses its fault verb `sim_verb`
    /// (`es-status-update`), the control plane's Role in the new namespace loses `verb` on
    /// `resource` (`("executorsets/status", "update")`).
    pub fn sibling_forbidding(
        &self,
        test: &str,
        sim_verb: &str,
        (resource, verb): (&str, &str),
    ) -> Env {
        if let Server::Sim(_) = self.server {
            return Env::sim_forbidding(
                &self.app,
                &self.pods_opts,
                &self.ns,
                vec![sim_verb.into()],
            );
        }
        let e = self.sibling(test);
        let path = format!(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/{}/roles/podalloc",
            e.ns
        );
        let (code, mut role) = e.admin("GET", &path, None);
        assert_eq!(code, 200, "{role}");
        for rule in role["rules"].as_array_mut().unwrap() {
            if rule["resources"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r == resource)
            {
                rule["verbs"].as_array_mut().unwrap().retain(|v| v != verb);
            }
        }
        let (code, body) = e.admin("PUT", &path, Some(&role));
        assert_eq!(code, 200, "{body}");
        e
    }

    /// Simulator only: replaces its fault rules with `rules` (`VERB:FAULT[@WHEN]`).
    pub fn sim_faults(&self, rules: &[&str]) {
        match &self.server {
            Server::Sim(s) => s.set_faults(crate::util::rules(rules)),
            Server::Real(_) => panic!("fault rules are the simulator's"),
        }
    }

    /// The control plane (real server only).
    pub fn control_plane(&self) -> Option<&'static ControlPlane> {
        match self.server {
            Server::Real(cp) => Some(cp),
            Server::Sim(_) => None,
        }
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The bearer token of leader-election candidate `who` (one of [`CANDIDATES`]), whose
    /// requests the server records as the user `podalloc-WHO`.
    pub fn candidate_token(&self, who: &str) -> String {
        assert!(CANDIDATES.contains(&who), "no candidate {who}");
        match &self.server {
            Server::Sim(_) => sim_candidate_token(who),
            Server::Real(cp) => (cp.candidates.iter())
                .find(|(u, _)| *u == format!("podalloc-{who}"))
                .map(|(_, t)| t.clone())
                .unwrap(),
        }
    }

    /// podalloc connected as `token` (`--server`, `--token`, `--certificate-authority`,
    /// `-n`) and nothing else.
    pub fn connect(&self, token: &str) -> Command {
        let mut c = podalloc();
        c.args(["--server", &self.url, "--token", token])
            .arg("--certificate-authority")
            .arg(&self.ca)
            .args(["-n", &self.ns]);
        c
    }

    /// The server's record of the requests about the test's namespace ([`Act`]), in the
    /// order it received them. On the simulator that record keeps the last 1000 requests.
    pub fn acts(&self) -> Vec<Act> {
        self.acts_of(false)
    }

    /// The clock of [`Env::acts`]' `at_us` now, µs since the epoch (the audit log's
    /// timestamps, the simulator's request log's `unix_us`): a window of the server's record
    /// is `[server_now_us(), server_now_us())`.
    pub fn server_now_us(&self) -> u64 {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        d.as_micros() as u64
    }

    /// [`Env::acts`] with the requests to subresources too, named `RESOURCE/SUBRESOURCE`
    /// (`executorsets/status`).
    pub fn acts_with_subresources(&self) -> Vec<Act> {
        self.acts_of(true)
    }

    fn acts_of(&self, subresources: bool) -> Vec<Act> {
        let mut out: Vec<Act> = match &self.server {
            Server::Sim(s) => (s.request_log().lines())
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter_map(|l| {
                    let path = l["path"].as_str()?;
                    let rest = path.split_once(&format!("/namespaces/{}/", self.ns))?.1;
                    let mut parts = rest.split('/');
                    let mut resource = parts.next()?.to_string();
                    let named = parts.next().is_some();
                    if let Some(sub) = parts.next() {
                        if !subresources {
                            return None;
                        }
                        resource = format!("{resource}/{sub}");
                    }
                    let verb = match (l["method"].as_str()?, named) {
                        ("GET", true) => "get",
                        ("GET", false) => "list",
                        ("POST", _) => "create",
                        ("PUT", _) => "update",
                        ("PATCH", _) => "patch",
                        ("DELETE", true) => "delete",
                        ("DELETE", false) => "deletecollection",
                        _ => return None,
                    };
                    let at_us = l["unix_us"].as_u64()?;
                    Some(Act {
                        user: l["user"].as_str().unwrap_or("?").to_string(),
                        verb: verb.into(),
                        resource,
                        at_us,
                        done_us: at_us,
                        code: l["status"].as_u64().unwrap_or(0) as u16,
                    })
                })
                .collect(),
            Server::Real(cp) => (cp.audit(&self.ns).iter())
                .filter(|ev| ev["stage"] == "ResponseComplete")
                .filter(|ev| subresources || ev["objectRef"]["subresource"].is_null())
                .map(|ev| Act {
                    user: ev["user"]["username"].as_str().unwrap_or("?").to_string(),
                    verb: ev["verb"].as_str().unwrap_or("?").to_string(),
                    resource: match ev["objectRef"]["subresource"].as_str() {
                        Some(sub) => format!(
                            "{}/{sub}",
                            ev["objectRef"]["resource"].as_str().unwrap_or("?")
                        ),
                        None => ev["objectRef"]["resource"]
                            .as_str()
                            .unwrap_or("?")
                            .to_string(),
                    },
                    at_us: (ev["requestReceivedTimestamp"].as_str())
                        .and_then(micros)
                        .expect("requestReceivedTimestamp"),
                    done_us: (ev["stageTimestamp"].as_str())
                        .and_then(micros)
                        .expect("stageTimestamp"),
                    code: ev["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                })
                .collect(),
        };
        out.sort_by_key(|a| a.at_us);
        out
    }

    /// podalloc connected as the `podalloc` user (`--server`, `--token`,
    /// `--certificate-authority`, `-n`), with `--app-id`, `--image img` (unless `args` has
    /// `--image` or `--template`), `--batch-delay 200ms` and a `--state-file` in the directory, then `args`.
    pub fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_with_token(&self.token, args)
    }

    /// [`Env::cmd`] with another bearer token.
    pub fn cmd_with_token(&self, token: &str, args: &[&str]) -> Command {
        self.cmd_at(&self.url, token, args)
    }

    /// [`Env::cmd`] as leader-election candidate `who` (its token; on the real server through
    /// a route of its own that [`Env::cut_off`] can cut).
    pub fn candidate_cmd(&self, who: &str, args: &[&str]) -> Command {
        let token = self.candidate_token(who);
        match &self.server {
            Server::Sim(_) => self.cmd_at(&self.url, &token, args),
            Server::Real(_) => {
                let mut routes = self.partitions.lock().unwrap();
                let route = (routes.entry(who.to_string()))
                    .or_insert_with(|| real::proxy::Partition::start(&self.url));
                self.cmd_at(&route.url, &token, args)
            }
        }
    }

    /// Cuts candidate `who` off from the API for `d`, as a network partition between it and
    /// the server would: on the simulator its calls hang, then 504, not carried out
    /// (`SimServer::cut_off`); on the real server its route drops every byte either way
    /// ([`real::proxy::Partition`]). Only for a candidate started with [`Env::candidate_cmd`].
    pub fn cut_off(&self, who: &str, d: Duration) {
        match &self.server {
            Server::Sim(s) => s.cut_off(&format!("podalloc-{who}"), d),
            Server::Real(_) => (self.partitions.lock().unwrap())
                .get(who)
                .expect("the candidate's route")
                .cut(d),
        }
    }

    /// Loses the answer to the next ConfigMap write of candidate `who` (the write is carried
    /// out, the connection closed before its answer, so the client sends it again): on the
    /// simulator the fault `cm-update:lost-response@1` (the next ConfigMap update of anyone),
    /// on the real server its route ([`real::proxy::Partition::lose_next_answer`]: its next
    /// request of at least 1,000 bytes, a write; its GETs are a few hundred).
    pub fn lose_next_write_answer(&self, who: &str) {
        match &self.server {
            Server::Sim(_) => self.sim_faults(&["cm-update:lost-response@1"]),
            Server::Real(_) => (self.partitions.lock().unwrap())
                .entry(who.to_string())
                .or_insert_with(|| real::proxy::Partition::start(&self.url))
                .lose_next_answer(1000),
        }
    }

    /// Loses the answer to the next ExecutorSet write (`PUT`, not `/status`) of candidate
    /// `who` and delays its retry by `d`, so that another client's write lands between the
    /// two: on the simulator the faults `es-update:lost-response@1` and
    /// `es-update:delay:MS@2` (the next two ExecutorSet updates of anyone: the lost write
    /// and its retry, held `d` by the server), on the real server its route
    /// ([`real::proxy::Partition::lose_next_answer_then_hold`]: its next request of at least
    /// 1,000 bytes, then `d` without a byte either way).
    pub fn lose_next_es_write_answer_then_hold(&self, who: &str, d: Duration) {
        match &self.server {
            Server::Sim(_) => self.sim_faults(&[
                "es-update:lost-response@1",
                &format!("es-update:delay:{}@2", d.as_millis()),
            ]),
            Server::Real(_) => (self.partitions.lock().unwrap())
                .entry(who.to_string())
                .or_insert_with(|| real::proxy::Partition::start(&self.url))
                .lose_next_answer_then_hold(1000, d),
        }
    }

    /// Makes candidate `who`'s pod lists answer `d` late from now on, on their own
    /// connection (its Lease calls are not slowed): on the simulator the fault
    /// `list:delay:MS` (every list of anyone), on the real server its route's large answers
    /// ([`real::proxy::Partition::slow_answers`]: an answer of at least 3,000 bytes; a
    /// Lease's is under a kilobyte, a list of its executors several).
    pub fn slow_lists(&self, who: &str, d: Duration) {
        match &self.server {
            Server::Sim(_) => self.sim_faults(&[&format!("list:delay:{}", d.as_millis())]),
            Server::Real(_) => (self.partitions.lock().unwrap())
                .get(who)
                .expect("the candidate's route")
                .slow_answers(3000, d),
        }
    }

    /// Real server only: from candidate `who`'s next large write (a request of at least
    /// 1,500 bytes, held first; its GETs and Lease updates are under 700: a pod made from a
    /// template with a large annotation is more) delays everything between it and the server
    /// for `d`, then delivers it ([`real::proxy::Partition::hold_from_next_write`]).
    pub fn hold_from_next_write(&self, who: &str, d: Duration) {
        (self.partitions.lock().unwrap())
            .get(who)
            .expect("the candidate's route on the real server")
            .hold_from_next_write(1500, d)
    }

    /// [`Env::cmd`] in namespace `ns` instead of the test's, as the admin (on the real server
    /// the podalloc user's Role is the test namespace's alone).
    pub fn cmd_in(&self, ns: &str, args: &[&str]) -> Command {
        self.cmd_at_in(&self.url, &self.admin_token, ns, args)
    }

    /// [`Env::cmd`] without `--image`: a steering command as people type it, with no pod
    /// template of its own.
    pub fn cmd_no_image(&self, args: &[&str]) -> Command {
        let mut c = podalloc();
        c.args(["--app-id", &self.app, "--batch-delay", "200ms"]);
        self.connected(c, (&self.url, &self.token, &self.ns), args)
    }

    fn cmd_at(&self, url: &str, token: &str, args: &[&str]) -> Command {
        self.cmd_at_in(url, token, &self.ns, args)
    }

    fn cmd_at_in(&self, url: &str, token: &str, ns: &str, args: &[&str]) -> Command {
        let mut c = podalloc();
        c.args(["--app-id", &self.app, "--batch-delay", "200ms"]);
        if !args.contains(&"--image") && !args.contains(&"--template") {
            c.args(["--image", "img"]);
        }
        self.connected(c, (url, token, ns), args)
    }

    /// `c` with a `--state-file` in the directory, the connection flags, then `args`.
    fn connected(
        &self,
        mut c: Command,
        (url, token, ns): (&str, &str, &str),
        args: &[&str],
    ) -> Command {
        c.arg("--state-file")
            .arg(self.dir.path().join("state.json"))
            .args(["--server", url, "--token", token])
            .arg("--certificate-authority")
            .arg(&self.ca)
            .args(["-n", ns])
            .args(args);
        c
    }

    /// Runs [`Env::cmd`] to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs [`Env::cmd`]; it must exit `want`. Returns its standard error.
    pub fn exits(&self, args: &[&str], want: i32) -> String {
        let out = self.run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(want), "podalloc {args:?}: {err}");
        err
    }

    /// Runs [`Env::cmd`]; it must succeed. Returns its standard error.
    pub fn ok(&self, args: &[&str]) -> String {
        self.exits(args, 0)
    }

    /// Runs [`Env::cmd`]; it must succeed. Returns its standard output.
    pub fn ok_out(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "podalloc {args:?}: {}",
            stderr(&out)
        );
        stdout(&out)
    }

    /// Writes the pod template `yaml` into the directory; returns its path for `--template`.
    pub fn template(&self, yaml: &str) -> String {
        let path = self.dir.path().join("tpl.yaml");
        std::fs::write(&path, yaml).unwrap();
        path.to_str().unwrap().to_string()
    }

    /// The state file, parsed.
    pub fn state(&self) -> Value {
        let bytes = std::fs::read(self.dir.path().join("state.json")).unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    /// `run --target N --force-target --until-converged --timeout 60s`, which must succeed
    /// (`--force-target`: the target becomes N even when the state has one); then exactly N
    /// live executors, never more than N at once, no executor id created twice.
    pub fn converge(&self, target: u32, extra: &[&str]) -> String {
        let t = target.to_string();
        let mut a = extra.to_vec();
        a.extend(crate::util::run_to_args(&t, "60s"));
        let err = self.ok(&a);
        self.wait_for("the live executors to settle", |e| {
            e.live().len() == target as usize
        });
        let s = self.stats();
        assert_eq!(s.duplicate_executor_ids, 0, "{s:?}");
        assert!(self.max_live() <= u64::from(target), "{s:?}");
        err
    }

    /// What the cluster lived through (see the module doc).
    pub fn stats(&self) -> SimStats {
        match &self.server {
            Server::Sim(s) => s.stats(),
            Server::Real(cp) => cp.emulator.stats(&self.ns),
        }
    }

    /// The most of the app's pods ever live at once.
    pub fn max_live(&self) -> u64 {
        let s = self.stats();
        s.max_live_pods_by_app.get(&self.app).copied().unwrap_or(0)
    }

    /// A call to the API as the admin (the simulator's token on the simulator).
    pub fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        real::call(
            &self.url,
            &self.ca_pem,
            &self.admin_token,
            method,
            path,
            body,
        )
    }

    /// The admin's bearer token (the simulator's token on the simulator).
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// The `podalloc` user's bearer token (the simulator's token on the simulator).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// kubectl as the `podalloc` user (`admin`: as the admin) in the test's namespace, with a
    /// kubeconfig file and a discovery cache in the test's directory:
    /// `kubectl --kubeconfig K --cache-dir D`.
    pub fn kubectl(&self, admin: bool) -> Command {
        let (user, token) = match admin {
            true => ("admin", &self.admin_token),
            false => ("podalloc", &self.token),
        };
        let kc = self.dir.path().join(format!("{user}.kubeconfig"));
        if !kc.exists() {
            let config = json!({"apiVersion": "v1", "kind": "Config", "current-context": "t",
                "clusters": [{"name": "t", "cluster": {"server": self.url,
                    "certificate-authority": self.ca}}],
                "users": [{"name": "podalloc", "user": {"token": token}}],
                "contexts": [{"name": "t",
                    "context": {"cluster": "t", "user": "podalloc", "namespace": self.ns}}]});
            std::fs::write(&kc, config.to_string()).unwrap();
        }
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(kc)
            .arg("--cache-dir")
            .arg(self.dir.path().join("kcache"));
        c
    }

    /// The PEM of the CA the server's certificate chains to.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A `GET` of `path` with `Accept: accept`, as the admin or (`admin` false) the
    /// `podalloc` user: its status, `Content-Type` and body as received (gzip decoded).
    pub fn get_raw(&self, admin: bool, path: &str, accept: &str) -> (u16, String, Vec<u8>) {
        let token = if admin {
            &self.admin_token
        } else {
            &self.token
        };
        let mut resp = crate::util::agent(self.ca_pem.as_bytes())
            .get(&format!("{}{path}", self.url))
            .header("Authorization", &format!("Bearer {token}"))
            .header("Accept", accept)
            .call()
            .unwrap();
        let ctype = (resp.headers().get("content-type"))
            .map(|v| v.to_str().unwrap_or("").to_string())
            .unwrap_or_default();
        let body = (resp.body_mut().with_config().limit(64 << 20))
            .read_to_vec()
            .unwrap();
        (resp.status().as_u16(), ctype, body)
    }

    /// A call to the API as the `podalloc` user.
    pub fn as_podalloc(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        real::call(&self.url, &self.ca_pem, &self.token, method, path, body)
    }

    /// The app's executor pods as the API lists them.
    pub fn pods(&self) -> Vec<Value> {
        let path = format!(
            "/api/v1/namespaces/{}/pods?labelSelector=spark-app-selector%3D{}",
            self.ns, self.app
        );
        let (code, list) = self.admin("GET", &path, None);
        assert_eq!(code, 200, "{list}");
        list["items"].as_array().unwrap().clone()
    }

    /// The pod named `name`, if it exists.
    pub fn pod(&self, name: &str) -> Option<Value> {
        let (code, p) = self.admin(
            "GET",
            &format!("/api/v1/namespaces/{}/pods/{name}", self.ns),
            None,
        );
        (code == 200).then_some(p)
    }

    /// The ids of the executors that are Pending or Running and not being deleted, sorted.
    pub fn live(&self) -> Vec<u64> {
        let mut v: Vec<u64> = (self.pods().iter())
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter(|p| matches!(p["status"]["phase"].as_str(), Some("Pending" | "Running")))
            .filter_map(|p| {
                p["metadata"]["labels"]["spark-exec-id"]
                    .as_str()?
                    .parse()
                    .ok()
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// The pod name of executor `id`.
    pub fn exec(&self, id: u64) -> String {
        format!("{}-exec-{id}", self.app)
    }

    /// Ends every container of pod `name` in `phase` with `exit_code` and `reason`, and the
    /// kubelet leaves it so (the simulator's side door, or the emulator through the status
    /// subresource).
    pub fn set_phase(&self, name: &str, phase: &str, exit_code: i64, reason: &str) {
        match &self.server {
            Server::Sim(_) => {
                let body = json!({"phase": phase, "exitCode": exit_code, "reason": reason});
                let (code, b) = self.admin(
                    "POST",
                    &format!("/sim/pods/{}/{name}/phase", self.ns),
                    Some(&body),
                );
                assert_eq!(code, 200, "{b}");
            }
            Server::Real(cp) => cp
                .emulator
                .set_pod_phase(&self.ns, name, phase, exit_code, reason)
                .unwrap(),
        }
    }

    /// Creates a Running driver pod named `name` (seeded on the simulator; created and run
    /// by the emulator on the real server) and returns its uid.
    pub fn driver(&self, name: &str) -> String {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"spark-role": "driver"}},
            "spec": {"containers": [{"name": "driver", "image": "spark"}]}});
        self.create_pod(&pod);
        let p = self.pod(name).unwrap();
        p["metadata"]["uid"].as_str().unwrap().to_string()
    }

    /// Creates `pod` (a Pod object) and waits until it runs (a seeded Running pod on the
    /// simulator; created through the API and run by the emulator on the real server).
    pub fn create_pod(&self, pod: &Value) {
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        match &self.server {
            Server::Sim(_) => {
                let mut seeded = pod.clone();
                seeded["status"] = json!({"phase": "Running"});
                let (code, b) =
                    self.admin("POST", &format!("/sim/pods/{}", self.ns), Some(&seeded));
                assert!(code == 200 || code == 201, "{code} {b}");
            }
            Server::Real(_) => {
                let (code, b) = self.admin(
                    "POST",
                    &format!("/api/v1/namespaces/{}/pods", self.ns),
                    Some(pod),
                );
                assert_eq!(code, 201, "{b}");
                self.wait_for("the pod to run", |e| {
                    e.pod(&name)
                        .is_some_and(|p| p["status"]["phase"] == "Running")
                });
            }
        }
    }

    /// Whether [`Env::acts`] holds every request since the server started: always on the
    /// real server (the audit log is never cut); on the simulator only while its request log
    /// has not dropped its oldest lines (it keeps 1000).
    pub fn record_is_whole(&self) -> bool {
        match &self.server {
            Server::Sim(s) => (s.request_log().lines().next())
                .and_then(|l| serde_json::from_str::<Value>(l).ok())
                .is_none_or(|l| l["seq"] == 1),
            Server::Real(_) => true,
        }
    }

    /// [`Env::set_phase`], which may fail (the pod is gone): whether it was done.
    pub fn try_set_phase(&self, name: &str, phase: &str, exit_code: i64, reason: &str) -> bool {
        match &self.server {
            Server::Sim(_) => {
                let body = json!({"phase": phase, "exitCode": exit_code, "reason": reason});
                let path = format!("/sim/pods/{}/{name}/phase", self.ns);
                self.admin("POST", &path, Some(&body)).0 == 200
            }
            Server::Real(cp) => (cp.emulator)
                .set_pod_phase(&self.ns, name, phase, exit_code, reason)
                .is_ok(),
        }
    }

    /// Polls `f` every 50 ms for up to 30 s; panics naming `what` and the live executors.
    pub fn wait_for(&self, what: &str, mut f: impl FnMut(&Env) -> bool) {
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if f(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}: live {:?}", self.live());
    }
}

/// Defines test `NAME` twice, `NAME::on_sim` and `NAME::on_real`, with the same body: `|env|
/// body` gets an [`Env`] with app `APP` and pods living as `PODS`. `both!(kubectl: NAME, …)`
/// is a test that runs kubectl: it ends at once where kubectl is missing
/// ([`crate::util::kubectl_missing`]: CI fails it instead).
macro_rules! both {
    (kubectl: $name:ident, $app:expr, $pods:expr, |$env:ident| $body:block) => {
        $crate::both::both!($name, $app, $pods, |$env| {
            if crate::util::kubectl_missing() {
                return;
            }
            $body
        });
    };
    ($name:ident, $app:expr, $pods:expr, |$env:ident| $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn body($env: &Env) $body
            #[test]
            fn on_sim() {
                body(&Env::sim($app, &$pods));
            }
            #[test]
            fn on_real() {
                if let Some(e) = Env::real(stringify!($name), $app, &$pods) {
                    body(&e);
                }
            }
        }
    };
}
pub(crate) use both;

/// Runs podalloc `args` ([`Env::ok`]) with a `--metrics-file` of its own and returns the
/// process's requests on pods by verb, from its `podalloc_api_requests_total` (every code).
pub fn ok_pod_requests(e: &Env, args: &[&str]) -> BTreeMap<String, u64> {
    let file = tempfile::NamedTempFile::new().unwrap();
    let path = file.path().to_str().unwrap().to_string();
    e.ok(&[args, &["--metrics-file", &path]].concat());
    let text = std::fs::read_to_string(&path).unwrap();
    let mut by_verb = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("podalloc_api_requests_total{verb=\"") else {
            continue;
        };
        let (verb, rest) = rest.split_once('"').unwrap();
        if !rest.starts_with(",resource=\"pods\"") {
            continue;
        }
        let n: u64 = rest.rsplit(' ').next().unwrap().parse().unwrap();
        *by_verb.entry(verb.to_string()).or_insert(0) += n;
    }
    by_verb
}

/// `(verb, count)` pairs of [`ok_pod_requests`] for the deletes only.
pub fn deletes_of(counts: &BTreeMap<String, u64>) -> Vec<(&str, u64)> {
    (counts.iter())
        .filter(|(v, _)| v.starts_with("delete"))
        .map(|(v, n)| (v.as_str(), *n))
        .collect()
}

both!(converge_from_zero, "conv", Pods::default(), |e| {
    let log = e.converge(7, &[]);
    assert!(
        log.contains("target=7 running=7 pending=0 unacknowledged=0"),
        "{log}"
    );
    assert_eq!(e.live(), (1..=7).collect::<Vec<_>>());
    let st = e.state();
    assert_eq!(st["target"], 7);
    assert_eq!(st["last_executor_id"], 7);
    // Converged: another tick creates and deletes nothing.
    e.ok(&["reconcile"]);
    assert_eq!(e.stats().creates_by_app.get("conv").copied(), Some(7));
});

both!(
    scale_up_then_down_deletes_pending_excess_only,
    "scale",
    Pods {
        startup_ms: 60_000,
        ..Pods::default()
    },
    |e| {
        e.ok(&["reconcile", "--target", "4"]);
        e.wait_for("4 pending pods", |e| e.live().len() == 4);
        let mut deletes = deletes_of(&ok_pod_requests(e, &["scale", "1"]))
            .into_iter()
            .map(|(v, n)| (v.to_string(), n))
            .collect::<Vec<_>>();
        for _ in 0..10 {
            if e.live().len() == 1 {
                break;
            }
            let counts = ok_pod_requests(e, &["reconcile"]);
            deletes.extend(
                deletes_of(&counts)
                    .into_iter()
                    .map(|(v, n)| (v.to_string(), n)),
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        e.wait_for("the pending excess deleted", |e| e.live().len() == 1);
        assert_eq!(e.state()["target"], 1);
        // The three pending pods in one request (by app, role, ids and status.phase=Pending).
        assert_eq!(deletes, [("deletecollection".to_string(), 1)]);
        assert_eq!(e.stats().duplicate_executor_ids, 0);
    }
);

both!(
    running_executors_are_not_deleted_to_shrink,
    "shrink",
    Pods::default(),
    |e| {
        e.converge(3, &[]);
        e.ok(&["scale", "1"]);
        assert_eq!(e.live(), vec![1, 2, 3]);
    }
);

both!(
    remove_deletes_named_executors_and_lowers_the_target,
    "rm",
    Pods::default(),
    |e| {
        e.converge(4, &[]);
        let counts = ok_pod_requests(e, &["remove", "2", "3"]);
        // Both in one request, as Spark deletes many executors.
        assert_eq!(deletes_of(&counts), [("deletecollection", 1)], "{counts:?}");
        assert_eq!(e.state()["target"], 2);
        e.wait_for("removed pods gone", |e| e.live() == vec![1, 4]);
        // Ids are never reused: scaling up again continues above 4.
        e.ok(&[
            "run",
            "--target",
            "3",
            "--force-target",
            "--until-converged",
            "--timeout",
            "60s",
        ]);
        e.wait_for("a fifth executor", |e| e.live() == vec![1, 4, 5]);
    }
);

both!(
    a_failed_executor_is_deleted_and_replaced,
    "fail",
    Pods::default(),
    |e| {
        e.converge(3, &[]);
        e.set_phase(&e.exec(2), "Failed", 137, "OOMKilled");
        e.ok(&["run", "--until-converged", "--timeout", "60s"]);
        e.wait_for("the replacement", |e| e.live() == vec![1, 3, 4]);
        e.wait_for("the failed pod deleted", |e| e.pod(&e.exec(2)).is_none());
        let st = e.state();
        assert!(st["failures"].to_string().contains("OOMKilled"), "{st}");
    }
);

/// Deletes executor `id`'s pod at once (grace 0: gone from every later list, never seen
/// terminating), as the admin.
fn delete_now(e: &Env, id: u64) {
    let path = format!("/api/v1/namespaces/{}/pods/{}", e.ns, e.exec(id));
    let (code, b) = e.admin("DELETE", &path, Some(&json!({"gracePeriodSeconds": 0})));
    assert_eq!(code, 200, "{b}");
    e.wait_for("the pod gone", |e| e.pod(&e.exec(id)).is_none());
}

both!(
    an_answered_create_gone_before_any_list_is_replaced_at_once_by_a_successor,
    "vanish",
    Pods::default(),
    |e| {
        // Issue 31 item 4: the process is killed right after its creates were answered and
        // recorded; one pod is deleted before any list saw it. The successor's list does not
        // show it: known lost, replaced at once under a new id, instead of waited out for the
        // creation timeout (60 s here) as an unacknowledged create.
        use std::os::unix::process::ExitStatusExt;
        let out = (e.cmd(&["reconcile", "--target", "3"]))
            .env("PODALLOC_CRASH_AT", "after-final-save:1")
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(9), "{}", stderr(&out));
        assert_eq!(e.state()["answered"], json!([1, 2, 3]), "{}", e.state());
        delete_now(e, 2);
        let t = Instant::now();
        let err = e.ok(&["run", "--until-converged", "--timeout", "60s"]);
        let took = t.elapsed();
        eprintln!("vanish: a successor replaced the lost create in {took:?}");
        assert!(took < Duration::from_secs(15), "{took:?}: {err}");
        assert!(err.contains("executor 2 (pod"), "{err}");
        e.wait_for("the replacement", |e| e.live() == vec![1, 3, 4]);
        let ids = e.stats().executor_ids_created.get("vanish").cloned();
        assert_eq!(ids, Some(vec![1, 2, 3, 4]), "id 2 never reused");
        assert_eq!(e.stats().duplicate_executor_ids, 0);
    }
);

both!(
    an_answered_create_gone_before_any_list_is_replaced_at_once_by_its_maker,
    "vanish1",
    Pods::default(),
    |e| {
        // The same for the process that made it: its loop stalls 4 s after the first
        // tick's final save (the creates answered and recorded); the pod is deleted then,
        // and the next list does not show it.
        let run = (e.cmd(&[
            "run",
            "--target",
            "3",
            "--until-converged",
            "--timeout",
            "60s",
        ]))
        .env("PODALLOC_PAUSE_AT", "after-final-save:1:4000")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        e.wait_for("executor 2 created", |e| e.pod(&e.exec(2)).is_some());
        let t = Instant::now();
        delete_now(e, 2);
        let out = run.wait_with_output().unwrap();
        let took = t.elapsed();
        let err = stderr(&out);
        eprintln!("vanish: its maker replaced the lost create in {took:?} (4 s of it paused)");
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(took < Duration::from_secs(15), "{took:?}: {err}");
        assert!(err.contains("executor 2 (pod"), "{err}");
        e.wait_for("the replacement", |e| e.live() == vec![1, 3, 4]);
        let ids = e.stats().executor_ids_created.get("vanish1").cloned();
        assert_eq!(ids, Some(vec![1, 2, 3, 4]), "id 2 never reused");
    }
);

both!(
    the_crash_loop_guard_halts_creation,
    "crash",
    Pods {
        failure_rate: 1.0,
        ..Pods::default()
    },
    |e| {
        let err = e.exits(
            &[
                "--max-failures",
                "3",
                "run",
                "--target",
                "2",
                "--timeout",
                "60s",
            ],
            6,
        );
        assert!(err.contains("crash loop"), "{err}");
        let created = e.stats().creates_by_app.get("crash").copied().unwrap_or(0);
        assert!((3..=5).contains(&created), "{created} creates");
    }
);

const BAD_IMAGE: &str = "registry.example/spark:typo";

/// Creates one executor with `flags` (which give `--startup-grace 1s`), waits until it is
/// bound and its container waits in `reason`, ticks within the grace and after it, waits
/// until the pod is deleted as stuck, and returns the state.
fn stuck_after_grace(e: &Env, flags: &[&str], reason: &str) -> Value {
    let run = |extra: &[&str]| e.ok(&[flags, extra].concat());
    run(&["reconcile", "--target", "1"]);
    e.wait_for(&format!("the pod to wait in {reason}"), |e| {
        e.pod(&e.exec(1)).is_some_and(|p| {
            p["spec"]["nodeName"].is_string()
                && p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == reason
        })
    });
    run(&["reconcile"]);
    std::thread::sleep(Duration::from_millis(1200));
    run(&["reconcile"]);
    e.wait_for("the stuck pod deleted", |e| {
        e.pod(&e.exec(1))
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
    });
    e.state()
}

both!(
    a_pod_stuck_in_image_pull_is_deleted_after_the_grace,
    "stuck",
    Pods {
        missing_images: vec![BAD_IMAGE.into()],
        ..Pods::default()
    },
    |e| {
        let flags = [
            "--image",
            BAD_IMAGE,
            "--startup-grace",
            "1s",
            "--max-failures",
            "10",
        ];
        let st = stuck_after_grace(e, &flags, "ImagePullBackOff");
        assert!(
            st["failures"][0]["reason"]
                .as_str()
                .unwrap_or("")
                .contains("ImagePullBackOff"),
            "{st}"
        );
        assert_eq!(st["last_executor_id"], 2, "and replaced: {st}");
    }
);

both!(
    executors_are_owned_by_the_driver_and_go_with_it,
    "drv-app",
    Pods::default(),
    |e| {
        let uid = e.driver("drv");
        e.converge(2, &["--driver-pod", "drv"]);
        let p = e.pod(&e.exec(1)).unwrap();
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
        assert_eq!(p["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(p["spec"]["restartPolicy"], "Never");
        e.set_phase("drv", "Succeeded", 0, "Completed");
        let err = e.exits(&["--driver-pod", "drv", "run", "--timeout", "60s"], 7);
        assert!(err.contains("\"drv\" has finished (Succeeded)"), "{err}");
        e.wait_for("the executors deleted", |e| e.live().is_empty());
    }
);

both!(
    a_misspelt_template_field_is_refused_by_strict_validation,
    "strict",
    Pods::default(),
    |e| {
        let t = &e.template(
            "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: executor\n    image: img\n    resources:\n      requets:\n        cpu: 1\n",
        );
        let err = e.exits(&["--template", t, "reconcile", "--target", "1"], 4);
        assert!(
            err.contains(
                r#"strict decoding error: unknown field "spec.containers[0].resources.requets""#
            ),
            "{err}"
        );
        assert!(e.live().is_empty());
    }
);

both!(
    events_are_posted_and_accepted,
    "evts",
    Pods::default(),
    |e| {
        e.driver("drv");
        e.converge(2, &["--driver-pod", "drv"]);
        let (code, list) = e.admin("GET", &format!("/api/v1/namespaces/{}/events", e.ns), None);
        assert_eq!(code, 200, "{list}");
        let items = list["items"].as_array().unwrap();
        let created: Vec<&Value> = items
            .iter()
            .filter(|ev| ev["reason"] == "SuccessfulCreate")
            .collect();
        assert!(!created.is_empty(), "{list}");
        for ev in &created {
            assert_eq!(ev["involvedObject"]["name"], "drv", "{ev}");
            assert_eq!(ev["involvedObject"]["kind"], "Pod", "{ev}");
            assert_eq!(ev["type"], "Normal", "{ev}");
        }
        let msgs: String = created
            .iter()
            .filter_map(|ev| ev["message"].as_str())
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            msgs.contains(&format!("Created executor pod: {}", e.exec(1))),
            "{msgs}"
        );
        // On the real server the same objects are served as events.k8s.io/v1 too, which
        // converts them (the simulator serves only core/v1).
        if e.control_plane().is_some() {
            let path = format!("/apis/events.k8s.io/v1/namespaces/{}/events", e.ns);
            let (code, list) = e.admin("GET", &path, None);
            assert_eq!(code, 200, "{list}");
            let ev = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .find(|ev| ev["reason"] == "SuccessfulCreate")
                .cloned()
                .unwrap_or_default();
            assert_eq!(ev["regarding"]["name"], "drv", "{ev}");
            let note = ev["note"].as_str().unwrap_or("");
            assert!(note.starts_with("Created executor pod: "), "{ev}");
            assert_eq!(ev["deprecatedSource"]["component"], "podalloc", "{ev}");
        }
    }
);

both!(
    the_configmap_store_survives_concurrent_ticks,
    "cmstore",
    Pods::default(),
    |e| {
        let flags = ["--state-store", "configmap:podalloc-cmstore"];
        let spawn = || {
            e.cmd(&[&flags[..], &["reconcile", "--target", "4"]].concat())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        for o in [&a, &b] {
            // Either tick acts; the one that loses the race on resourceVersion says so
            // (exit 3) or retries on the newer ConfigMap (exit 0).
            assert!(matches!(o.status.code(), Some(0 | 3)), "{}", stderr(o));
        }
        e.ok(&[
            &flags[..],
            &["run", "--until-converged", "--timeout", "60s"],
        ]
        .concat());
        e.wait_for("4 executors", |e| e.live().len() == 4);
        assert_eq!(e.stats().duplicate_executor_ids, 0);
        assert!(e.max_live() <= 4);
        let (code, cm) = e.admin(
            "GET",
            &format!("/api/v1/namespaces/{}/configmaps/podalloc-cmstore", e.ns),
            None,
        );
        assert_eq!(code, 200, "{cm}");
        let _ = stdout(&a);
    }
);

/// `run --leader-elect` as `who` (`POD_NAME=pod-WHO`), on the ConfigMap store, with a 3 s
/// Lease.
fn candidate(e: &Env, who: &str, target: u32) -> std::process::Child {
    let t = target.to_string();
    let mut cmd = e.cmd(&crate::util::ha_run_args(&[], &t));
    crate::util::spawn_replica(
        &mut cmd,
        &format!("pod-{who}"),
        std::process::Stdio::piped(),
    )
}

/// The holder of the app's Lease (`podalloc-APP`).
fn holder(e: &Env) -> Option<String> {
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/podalloc-{}",
        e.ns, e.app
    );
    let (code, lease) = e.admin("GET", &path, None);
    (code == 200).then(|| lease["spec"]["holderIdentity"].as_str().map(str::to_string))?
}

both!(
    two_leader_elect_replicas_hand_over_on_a_lease,
    "ha",
    Pods::default(),
    |e| {
        let mut a = candidate(e, "a", 3);
        e.wait_for("a leads", |e| holder(e).as_deref() == Some("pod-a"));
        e.wait_for("a converges", |e| e.live().len() == 3);
        let b = candidate(e, "b", 3);
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(holder(e).as_deref(), Some("pod-a"));
        // SIGKILL: no release; b takes over once the Lease has not changed for its duration.
        a.kill().unwrap();
        let killed = Instant::now();
        e.wait_for("b leads", |e| holder(e).as_deref() == Some("pod-b"));
        let took = killed.elapsed();
        eprintln!("both: SIGKILL handover took {:.2}s", took.as_secs_f64());
        assert!(
            took < Duration::from_millis(3000 + 500 * 2 + 1500),
            "{took:?}"
        );
        let _ = a.wait();
        e.set_phase(&e.exec(2), "Failed", 1, "Error");
        e.wait_for("b replaces executor 2", |e| {
            let live = e.live();
            live.len() == 3 && !live.contains(&2)
        });
        unsafe { libc::kill(b.id() as i32, libc::SIGTERM) };
        let out = b.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(stderr(&out).contains("released lease"), "{}", stderr(&out));
        assert_eq!(e.stats().duplicate_executor_ids, 0);
        assert!(e.max_live() <= 3, "{:?}", e.stats());
    }
);

both!(
    apps_discovers_annotated_drivers,
    "apps-any",
    Pods::default(),
    |e| {
        for (i, n) in [(0, "2"), (1, "3")] {
            let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("drv-{i}"),
                "labels": {"spark-role": "driver", "spark-app-selector": format!("app-{i}")},
                "annotations": {"podalloc.io/executors": n}},
            "spec": {"containers": [{"name": "driver", "image": "spark"}]}});
            e.create_pod(&pod);
        }
        let mut c = podalloc();
        c.args(["--server", e.url(), "--token", &e.token])
            .arg("--certificate-authority")
            .arg(&e.ca)
            .args([
                "-n",
                &e.ns,
                "--batch-delay",
                "200ms",
                "--image",
                "spark:3.5",
            ])
            .args([
                "apps",
                "--discover",
                "spark-role=driver",
                "--until-converged",
                "--timeout",
                "60s",
            ])
            .arg("--state-dir")
            .arg(e.dir.path().join("states"));
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let path = format!(
            "/api/v1/namespaces/{}/pods?labelSelector=spark-role%3Dexecutor",
            e.ns
        );
        let (_, list) = e.admin("GET", &path, None);
        let mut by_app = std::collections::BTreeMap::new();
        for p in list["items"].as_array().unwrap() {
            if p["metadata"]["deletionTimestamp"].is_null() {
                let app = p["metadata"]["labels"]["spark-app-selector"]
                    .as_str()
                    .unwrap()
                    .to_string();
                *by_app.entry(app).or_insert(0) += 1;
            }
        }
        assert_eq!(by_app.get("app-0"), Some(&2), "{by_app:?}");
        assert_eq!(by_app.get("app-1"), Some(&3), "{by_app:?}");
    }
);

both!(
    a_pod_whose_volume_never_mounts_is_stuck_in_container_creating,
    "nomount",
    Pods::default(),
    |e| {
        let t = &e.template(
            "apiVersion: v1\nkind: Pod\nspec:\n  volumes:\n  - name: creds\n    secret:\n      secretName: spark-creds\n  containers:\n  - name: executor\n    image: img\n    volumeMounts:\n    - name: creds\n      mountPath: /creds\n",
        );
        let flags = [
            "--template",
            t,
            "--startup-grace",
            "1s",
            "--max-failures",
            "10",
        ];
        let st = stuck_after_grace(e, &flags, "ContainerCreating");
        let reason = st["failures"][0]["reason"].as_str().unwrap_or("");
        assert!(reason.contains("ContainerCreating"), "{st}");
    }
);

both!(
    scheduling_gated_pods_do_not_block_the_next_batch,
    "gated",
    Pods::default(),
    |e| {
        // Kueue's admission (kueue#4106): pods carry a scheduling gate until the group is
        // admitted. No scheduler binds them (the real server refuses a binding of a gated
        // pod); podalloc counts them but does not wait on them before the next batch.
        let t = &e.template(
            "apiVersion: v1\nkind: Pod\nspec:\n  schedulingGates:\n  - name: kueue.x-k8s.io/admission\n  containers:\n  - name: executor\n    image: img\n",
        );
        let flags = ["--template", t, "--batch-size", "2"];
        let run = |extra: &[&str]| e.ok(&[&flags[..], extra].concat());
        run(&["reconcile", "--target", "4"]);
        run(&["reconcile"]);
        assert_eq!(
            e.pods().len(),
            4,
            "the gated first batch did not block the second"
        );
        std::thread::sleep(Duration::from_millis(300));
        let log = run(&["reconcile"]);
        assert!(log.contains("waiting for 4 scheduling-gated pods"), "{log}");
        assert_eq!(e.pods().len(), 4, "gated pods count: no overshoot");
        assert!(
            e.pods().iter().all(|p| p["spec"]["nodeName"].is_null()),
            "a gated pod is never bound"
        );
        // The group is admitted: the gates are removed (the only change the API allows).
        for i in 1..=4 {
            let path = format!("/api/v1/namespaces/{}/pods/{}", e.ns, e.exec(i));
            let (code, out) = e.admin(
                "PATCH",
                &path,
                Some(&json!({"spec": {"schedulingGates": null}})),
            );
            assert_eq!(code, 200, "{out}");
        }
        e.converge(4, &flags);
        assert_eq!(e.live(), vec![1, 2, 3, 4]);
    }
);

both!(
    count_terminating_never_counts_a_stopped_pod_kept_by_a_finalizer,
    "fin",
    Pods::default(),
    |e| {
        // kubernetes/kubernetes#117015: a terminating pod whose containers have stopped
        // (phase Failed) holds nothing, whatever keeps the object (here a finalizer no one
        // removes): --count-terminating counts it as quota does, so not at all, and it is
        // replaced. Both servers keep the object until its finalizer is removed.
        let t = &e.template(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  finalizers:\n  - podalloc.test/hold\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: executor\n    image: img\n",
        );
        let flags = ["--template", t, "--count-terminating"];
        e.converge(2, &flags);
        let path = format!("/api/v1/namespaces/{}/pods/{}", e.ns, e.exec(1));
        let (code, out) = e.admin("DELETE", &path, None);
        assert_eq!(code, 200, "{out}");
        e.wait_for("the deleted pod's containers to stop", |e| {
            e.pod(&e.exec(1)).is_none_or(|p| {
                p["status"]["phase"] == "Failed" || p["status"]["phase"] == "Succeeded"
            })
        });
        e.converge(2, &flags);
        assert_eq!(e.live(), vec![2, 3]);
        let kept = e.pod(&e.exec(1)).expect("kept for its finalizer");
        assert!(!kept["metadata"]["deletionTimestamp"].is_null(), "{kept}");
        assert_eq!(kept["metadata"]["deletionGracePeriodSeconds"], 0, "{kept}");
        let patch = json!({"metadata": {"finalizers": null}});
        let (code, out) = e.admin("PATCH", &path, Some(&patch));
        assert_eq!(code, 200, "{out}");
        e.wait_for("the pod gone once its finalizer is removed", |e| {
            e.pod(&e.exec(1)).is_none()
        });
    }
);
