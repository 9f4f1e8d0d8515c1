//! The integration tests' shared harness: the podalloc binary as a [`Command`], a simulated
//! API server with a temporary directory around it ([`SimWorld`] → [`World`]), a test client
//! for its API, and the helpers that read a finished process's [`Output`].
//!
//! ```ignore
//! let w = SimWorld::new().app("my-app").faults(&["create:429-status@2"]).start();
//! w.ok(&["run", "--target", "3", "--until-converged"]);
//! assert_eq!(w.sim.stats().live_pods, 3);
//! ```

use podalloc_sim::{FaultRule, SimOptions, SimServer};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The checkout's root (where `Cargo.toml`, `fixtures/` and `deploy/` are).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The podalloc binary under test, with an environment that cannot leak in from the
/// developer's shell: no `KUBECONFIG`, no `RUST_LOG`, no crash point.
pub fn podalloc() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_podalloc"));
    c.env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .env_remove("PODALLOC_CRASH_AT")
        .env_remove("PODALLOC_PAUSE_AT");
    c
}

/// A process's standard error, lossily decoded.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// A process's standard output, lossily decoded.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).to_string()
}

/// The standard output of `o`, which must have succeeded: else a panic naming `what`, with
/// its standard error and output.
pub fn succeeded(o: &Output, what: &str) -> String {
    let out = stdout(o);
    assert!(o.status.success(), "{what}: {}{out}", stderr(o));
    out
}

/// Fails unless `text` contains every one of `parts`.
pub fn assert_contains_all(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "no {part:?} in: {text}");
    }
}

/// A process's exit code; -1 when a signal ended it.
pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Runs `c` to its end, asserts it exited with `want`, and returns its standard error.
pub fn exits(c: &mut Command, want: i32) -> String {
    let out = c.output().unwrap();
    let err = stderr(&out);
    assert_eq!(code(&out), want, "{err}");
    err
}

/// Splits a command line on white space: `args("run --target 2")` is `["run", "--target",
/// "2"]` (for arguments without spaces of their own).
pub fn args(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

/// `--leader-elect` with a 3 s Lease, a 2 s renew deadline and a 500 ms retry period: the
/// short timings every leader-election test runs with.
pub const FAST_LEADER_ELECT: [&str; 7] = [
    "--leader-elect",
    "--leader-elect-lease-duration",
    "3s",
    "--leader-elect-renew-deadline",
    "2s",
    "--leader-elect-retry-period",
    "500ms",
];

/// `args` followed by [`FAST_LEADER_ELECT`].
pub fn with_fast_leader_elect<'a>(args: &[&'a str]) -> Vec<&'a str> {
    args.iter().chain(&FAST_LEADER_ELECT).copied().collect()
}

/// The Spark image the end-to-end tests name.
pub const SPARK_IMAGE: &str = "registry.example/spark:3.5.0";

/// Parses fault rules (`VERB:FAULT[@WHEN]`), panicking on a bad one.
pub fn rules(r: &[&str]) -> Vec<FaultRule> {
    r.iter().map(|s| FaultRule::parse(s).unwrap()).collect()
}

/// A blocking HTTPS client that trusts the CA in `ca_pem` and returns error statuses as
/// responses (no proxy): the kubelet emulator's.
pub fn agent(ca_pem: &[u8]) -> ureq::Agent {
    podalloc_sim::emulator::agent(&String::from_utf8_lossy(ca_pem), None)
}

/// How to start a simulator, and which podalloc flags [`World::cmd`] passes. Starts from
/// `SimOptions::default()` with a bearer token and the CA written to `ca.crt` in a fresh
/// temporary directory.
pub struct SimWorld {
    opts: SimOptions,
    ca: String,
    token: String,
    app: String,
    image: String,
    namespace: Option<String>,
    batch_delay: Option<String>,
    state_file: bool,
}

/// Builder setters of [`SimWorld`], one a line: `name(type) => field;` sets the field to the
/// argument (converted with `into`) and returns the builder.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($ty:ty) => $($field:ident).+;)*) => {$(
        $(#[$doc])*
        pub fn $name(mut self, v: $ty) -> SimWorld {
            self.$($field).+ = v.into();
            self
        }
    )*};
}

impl SimWorld {
    /// The defaults: app `sim-app`, image `img`, a `--state-file` in the directory, no
    /// `-n`, no `--batch-delay`.
    pub fn new() -> SimWorld {
        SimWorld {
            opts: SimOptions::default(),
            ca: "ca.crt".into(),
            token: "sim-test-token-0123456789".into(),
            app: "sim-app".into(),
            image: "img".into(),
            namespace: None,
            batch_delay: None,
            state_file: true,
        }
    }

    /// `app` with [`SPARK_IMAGE`] in `-n default`, `--batch-delay 200ms`, pods scheduled
    /// after 50 ms, Running 300 ms later, stopping in 100 ms.
    pub fn quick(app: &str) -> SimWorld {
        SimWorld::spark(app)
            .namespace("default")
            .batch_delay("200ms")
            .pod_ms(50, 300)
            .stop(Duration::from_millis(100))
    }

    /// `app` whose pods stay Pending for `startup` once scheduled (the tests of what
    /// waits on pending pods).
    pub fn pending_for(app: &str, startup: Duration) -> SimWorld {
        SimWorld::new().app(app).startup(startup)
    }

    /// `app` with [`SPARK_IMAGE`].
    pub fn spark(app: &str) -> SimWorld {
        SimWorld::new().app(app).image(SPARK_IMAGE)
    }

    /// `app` with the token `token`, `--batch-delay 100ms` and pods scheduled after 20 ms.
    pub fn fast(app: &str, token: &str) -> SimWorld {
        SimWorld::new()
            .app(app)
            .batch_delay("100ms")
            .token(token)
            .schedule(Duration::from_millis(20))
    }

    /// Time from creation to scheduled and from scheduled to Running, in milliseconds.
    pub fn pod_ms(self, schedule: u64, startup: u64) -> SimWorld {
        self.schedule(Duration::from_millis(schedule))
            .startup(Duration::from_millis(startup))
    }

    /// Fault rules to inject from the start (see [`rules`]).
    pub fn faults(mut self, faults: &[&str]) -> SimWorld {
        self.opts.faults = rules(faults);
        self
    }

    /// Delay added to every API response, in milliseconds.
    pub fn latency(mut self, ms: u64) -> SimWorld {
        self.opts.latency = Duration::from_millis(ms);
        self
    }

    setters! {
        /// Time from creation to scheduled.
        schedule(Duration) => opts.schedule_latency;
        /// Time from scheduled to Running.
        startup(Duration) => opts.startup_latency;
        /// Time a deleted pod takes to stop.
        stop(Duration) => opts.stop_latency;
        /// Where the CA certificate goes, relative to the directory.
        ca_file(&str) => ca;
        /// The bearer token the server wants and [`World::cmd`] passes.
        token(&str) => token;
        /// `--app-id`.
        app(&str) => app;
        /// `--image`.
        image(&str) => image;
    }

    /// Any other simulator setting.
    pub fn options(mut self, tweak: impl FnOnce(&mut SimOptions)) -> SimWorld {
        tweak(&mut self.opts);
        self
    }

    /// `-n`.
    pub fn namespace(mut self, ns: &str) -> SimWorld {
        self.namespace = Some(ns.into());
        self
    }

    /// `--batch-delay`.
    pub fn batch_delay(mut self, d: &str) -> SimWorld {
        self.batch_delay = Some(d.into());
        self
    }

    /// No `--state-file` (for the ConfigMap store).
    pub fn no_state_file(mut self) -> SimWorld {
        self.state_file = false;
        self
    }

    /// Makes the directory and starts the server.
    pub fn start(mut self) -> World {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join(&self.ca);
        std::fs::create_dir_all(ca.parent().unwrap()).unwrap();
        self.opts.ca_out = Some(ca.clone());
        self.opts.token = Some(self.token.clone());
        World {
            sim: SimServer::start(self.opts).unwrap(),
            dir,
            ca,
            token: self.token,
            app: self.app,
            image: self.image,
            namespace: self.namespace,
            batch_delay: self.batch_delay,
            state_file: self.state_file,
        }
    }
}

/// A running simulator, its temporary directory, and the podalloc command line for it.
pub struct World {
    /// The server.
    pub sim: SimServer,
    /// The temporary directory: the CA, the state file, anything a test writes.
    pub dir: tempfile::TempDir,
    /// The CA certificate's path.
    pub ca: PathBuf,
    /// The bearer token.
    pub token: String,
    /// The app id.
    pub app: String,
    image: String,
    namespace: Option<String>,
    batch_delay: Option<String>,
    state_file: bool,
}

impl World {
    /// A path in the directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The state file `--state-file` names.
    pub fn state_file(&self) -> PathBuf {
        self.path("state.json")
    }

    /// The state file, parsed.
    pub fn state(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.state_file()).unwrap()).unwrap()
    }

    /// [`podalloc`] with the app's flags (`--app-id`, `--image`, `--batch-delay`,
    /// `--state-file`) but no connection flags.
    pub fn bare(&self) -> Command {
        let mut c = podalloc();
        c.args(["--app-id", &self.app, "--image", &self.image]);
        if let Some(d) = &self.batch_delay {
            c.args(["--batch-delay", d]);
        }
        if self.state_file {
            c.arg("--state-file").arg(self.state_file());
        }
        c
    }

    /// podalloc connected to the simulator (`--server`, `--token` unless `args` has
    /// `--token-file`, `--certificate-authority`, `-n`) with the app's flags, then `args`.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let token = if args.contains(&"--token-file") {
            None
        } else {
            Some(self.token.as_str())
        };
        self.connect(&self.sim.url(), token, args)
    }

    /// [`World::cmd`] with another bearer token.
    pub fn cmd_as(&self, token: &str, args: &[&str]) -> Command {
        self.connect(&self.sim.url(), Some(token), args)
    }

    fn connect(&self, server: &str, token: Option<&str>, args: &[&str]) -> Command {
        let mut c = self.bare();
        c.args(["--server", server]);
        if let Some(t) = token {
            c.args(["--token", t]);
        }
        c.arg("--certificate-authority").arg(&self.ca);
        if let Some(ns) = &self.namespace {
            c.args(["-n", ns]);
        }
        c.args(args);
        c
    }

    /// Runs [`World::cmd`] to its end.
    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs [`World::cmd`], asserts it exited with `want`, and returns its standard error.
    pub fn run_exits(&self, args: &[&str], want: i32) -> String {
        exits(&mut self.cmd(args), want)
    }

    /// Runs [`World::cmd`] and asserts it succeeded.
    pub fn ok(&self, args: &[&str]) -> Output {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podalloc {args:?} failed: {}",
            stderr(&out)
        );
        out
    }

    /// `run --target N --force-target --until-converged --timeout TIMEOUT`, which must
    /// succeed (`--force-target`: the target becomes N even when the state has one).
    pub fn run_to(&self, target: u32, timeout: &str) -> Output {
        let t = target.to_string();
        self.ok(&run_to_args(&t, timeout))
    }

    /// [`World::run_to`] with a minute's timeout; then there must be exactly N live pods,
    /// no duplicate executor id, and never more than N of the app's pods live.
    pub fn converge(&self, target: u32) {
        self.run_to(target, "60s");
        let s = self.sim.stats();
        assert_eq!(s.live_pods, target as u64);
        assert_eq!(s.duplicate_executor_ids, 0);
        assert!(s.max_live_pods_by_app.get(&self.app).copied().unwrap_or(0) <= target as u64);
    }

    /// A call to the simulator as a test client (with the token): GET, DELETE, POST or PUT
    /// of a JSON body, or PATCH with a JSON merge patch. Returns the status and the body as
    /// JSON (`Null` when it is not JSON).
    pub fn api(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let agent = agent(self.sim.ca_pem().unwrap().as_bytes());
        let url = format!("{}{}", self.sim.url(), path);
        let auth = format!("Bearer {}", self.token);
        let mut resp = match (method, body) {
            ("GET", _) => agent.get(&url).header("Authorization", &auth).call(),
            ("DELETE", _) => agent.delete(&url).header("Authorization", &auth).call(),
            ("POST", Some(b)) => agent
                .post(&url)
                .header("Authorization", &auth)
                .content_type("application/json")
                .send(b.to_string()),
            ("PUT", Some(b)) => agent
                .put(&url)
                .header("Authorization", &auth)
                .content_type("application/json")
                .send(b.to_string()),
            ("PATCH", Some(b)) => agent
                .patch(&url)
                .header("Authorization", &auth)
                .content_type("application/merge-patch+json")
                .send(b.to_string()),
            _ => panic!("unsupported"),
        }
        .unwrap();
        let code = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (code, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The app's executor pods in `ns`, as the API lists them.
    pub fn pods(&self, ns: &str) -> Vec<Value> {
        let (code, list) = self.api(
            "GET",
            &format!(
                "/api/v1/namespaces/{ns}/pods?labelSelector=spark-app-selector%3D{}",
                self.app
            ),
            None,
        );
        assert_eq!(code, 200, "{list}");
        list["items"].as_array().unwrap().clone()
    }

    /// The app's executor pods in `default` as (id, phase, deleting), by id.
    pub fn executors(&self) -> Vec<(u64, String, bool)> {
        let mut v: Vec<(u64, String, bool)> = self
            .pods("default")
            .iter()
            .map(|p| {
                (
                    p["metadata"]["labels"]["spark-exec-id"]
                        .as_str()
                        .unwrap()
                        .parse()
                        .unwrap(),
                    p["status"]["phase"].as_str().unwrap_or("").to_string(),
                    !p["metadata"]["deletionTimestamp"].is_null(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Executor `id`'s pod (`<app>-exec-<id>` in `default`), if there is one.
    pub fn executor_pod(&self, id: u64) -> Option<Value> {
        let name = format!("{}-exec-{id}", self.app);
        (self.pods("default").into_iter()).find(|p| p["metadata"]["name"] == name.as_str())
    }

    /// Writes a pod template (a Pod of spec `spec`) to `template.json` in the directory and
    /// returns its path, for `--template`.
    pub fn template(&self, spec: Value) -> String {
        let path = self.path("template.json");
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "spec": spec});
        write(&path, &pod.to_string());
        path.display().to_string()
    }

    /// The ids of the executors that are Pending or Running and not being deleted.
    pub fn live(&self) -> Vec<u64> {
        self.executors()
            .into_iter()
            .filter(|(_, ph, del)| !del && (ph == "Running" || ph == "Pending"))
            .map(|(id, _, _)| id)
            .collect()
    }

    /// The most of the app's pods ever live at once.
    pub fn max_live(&self) -> u64 {
        self.sim
            .stats()
            .max_live_pods_by_app
            .get(&self.app)
            .copied()
            .unwrap_or(0)
    }

    /// Polls `f` every 50 ms for up to 10 s; panics naming `what` (and the executors) when
    /// it never holds.
    pub fn wait_for(&self, what: &str, mut f: impl FnMut(&World) -> bool) {
        for _ in 0..200 {
            if f(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out waiting for {what}: {:?}", self.executors());
    }
}

/// Writes `text` to `path`, making its directory first.
pub fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Stops each process as a kubelet stops a pod (SIGTERM), waits for it, and checks that it
/// exited 0 (`what` names them in the failure); their outputs, in order.
pub fn stop_all(what: &str, procs: Vec<std::process::Child>) -> Vec<Output> {
    for p in &procs {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(p.id() as i32, libc::SIGTERM) }, 0);
    }
    let outs: Vec<Output> = procs
        .into_iter()
        .map(|p| p.wait_with_output().unwrap())
        .collect();
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(out.status.code(), Some(0), "{what} [{i}]: {}", stderr(out));
    }
    outs
}

/// `run --leader-elect` on the state ConfigMap `ha-state` with target `target`, ticking every
/// 200 ms at rest too (the hand-over tests time replacements), on a 3 s Lease
/// ([`FAST_LEADER_ELECT`]); `front` comes first (global flags). The failure limit is off
/// (`--max-failures 0`): these tests fail executors on purpose, dozens of them, so that the
/// leader has writes to make.
pub fn ha_run_args<'a>(front: &[&'a str], target: &'a str) -> Vec<&'a str> {
    let run = [
        "--max-failures",
        "0",
        "--state-store",
        "configmap:ha-state",
        "run",
        "--target",
        target,
    ];
    let mut args = front.to_vec();
    args.extend(run);
    args.extend(["--idle-interval", "200ms"]);
    with_fast_leader_elect(&args)
}

/// Live executor pods (not terminating; Pending or Running) per app (`spark-app-selector`)
/// in `list`, a PodList.
pub fn live_by_app(list: &Value) -> std::collections::BTreeMap<String, usize> {
    let mut out = std::collections::BTreeMap::new();
    for p in list["items"].as_array().unwrap() {
        let phase = p["status"]["phase"].as_str().unwrap_or("");
        if p["metadata"]["deletionTimestamp"].is_null() && matches!(phase, "Pending" | "Running") {
            let app = p["metadata"]["labels"]["spark-app-selector"]
                .as_str()
                .unwrap();
            *out.entry(app.to_string()).or_insert(0) += 1;
        }
    }
    out
}

/// Starts `cmd` as the replica in pod `pod` (`POD_NAME`, the holder identity), its standard
/// output dropped and its standard error `stderr` (piped to be read, or null).
pub fn spawn_replica(cmd: &mut Command, pod: &str, stderr: Stdio) -> std::process::Child {
    cmd.env("POD_NAME", pod)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// `run --target TARGET --force-target --until-converged --timeout TIMEOUT`: converge on
/// `target` even when the state has another one, within `timeout`.
pub fn run_to_args<'a>(target: &'a str, timeout: &'a str) -> [&'a str; 7] {
    [
        "run",
        "--target",
        target,
        "--force-target",
        "--until-converged",
        "--timeout",
        timeout,
    ]
}

/// `--target TARGET --interval EVERY --idle-interval EVERY`: a `run` loop at `target` that
/// ticks every `every`, at rest too.
pub fn ticking<'a>(target: &'a str, every: &'a str) -> [&'a str; 6] {
    [
        "--target",
        target,
        "--interval",
        every,
        "--idle-interval",
        every,
    ]
}

/// `GET url` with bearer `token` and `Accept: accept`, as kubectl sends it, and the
/// response's `Content-Type` (empty when it has none). Panics when no response came.
pub fn get_accepting(
    agent: &ureq::Agent,
    url: &str,
    token: &str,
    accept: &str,
) -> (ureq::http::Response<ureq::Body>, String) {
    let resp = agent
        .get(url)
        .header("Authorization", &format!("Bearer {token}"))
        .header("Accept", accept)
        .call()
        .unwrap();
    let ctype = (resp.headers().get("content-type"))
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (resp, ctype)
}

/// For a test that cannot run on this machine (`why`: what is missing and what it needs):
/// fails under `CI=true` (CI must run it); otherwise says so in one line, so the test can
/// end without checking anything.
pub fn not_run_here(test: &str, why: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test} cannot run here, and CI=true needs it: {why}"
    );
    eprintln!("{test}: not run: {why}");
}

/// Whether kubectl is missing, for the tests that run it: fails under `CI=true` (CI must run
/// them); otherwise says so in one line and returns true, so the test can skip.
pub fn kubectl_missing() -> bool {
    let found = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "kubectl is not installed, and CI=true needs it"
    );
    eprintln!("kubectl is not installed: skipped");
    true
}

/// Sleeps until `margin_ms` past `until_ms` (ms since the Unix epoch, as a state's
/// `create_backoff.until_ms`): a back-off has then passed.
pub fn sleep_past(until_ms: u64, margin_ms: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    std::thread::sleep(Duration::from_millis(
        until_ms.saturating_sub(now) + margin_ms,
    ));
}

/// The value of `podalloc_is_leader` in the metrics file `path`.
pub fn is_leader(path: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    (text.lines())
        .find(|l| l.starts_with("podalloc_is_leader{"))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}
