//! The real control plane of the tests: an unmodified kube-apiserver and etcd (built by
//! `scripts/controlplane.sh build` from their Go modules, cached outside the work tree),
//! started **once per test binary run** by `scripts/controlplane.sh start` with this process
//! as its watch pid (so it stops when the tests end), plus the kubelet emulator
//! (`podalloc_sim::emulator`) that drives its pods with the simulator's kubelet model.
//!
//! Each test gets a namespace of its own, with exactly the Role of `deploy/rbac.yaml` bound to
//! the `podalloc` user (not in `system:masters`: a verb missing from our RBAC is a 403 in a
//! test). What a cluster without kube-controller-manager, scheduler and kubelet does not do is
//! in `tests/real/README.md`: read it before changing the simulator to match this server.
//!
//! When the binaries are not built, [`control_plane`] returns `None` after one line saying so
//! and how to build them, unless `CI` or `PODALLOC_REAL_SERVER=required` is set: then it
//! panics, so CI never skips the real-server tests.

pub mod proxy;

use podalloc_sim::emulator::{EmulatorOptions, KubeletEmulator};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A started control plane and its emulator.
pub struct ControlPlane {
    /// Where its files are: `pki/ca.crt`, the kubeconfigs, the logs.
    pub dir: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The test CA (PEM) and its file.
    pub ca_pem: String,
    pub ca_file: PathBuf,
    /// Tokens: the admin (`system:masters`), `podalloc`, `podalloc-throttled`.
    pub admin_token: String,
    pub podalloc_token: String,
    pub throttled_token: String,
    /// The leader-election candidates' users (`podalloc-a`, `-b`, `-c`) and their tokens:
    /// the audit log names each one's requests.
    pub candidates: Vec<(String, String)>,
    /// The audit log (`scripts/controlplane.sh`: the candidates' pod, configmap, lease and
    /// executorset requests and the admin's lease writes, at ResponseComplete).
    pub audit_log: PathBuf,
    /// The kubelet emulator for the test namespaces.
    pub emulator: KubeletEmulator,
    next_ns: AtomicU64,
}

static CONTROL_PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static SKIP_SAID: OnceLock<()> = OnceLock::new();

/// Whether the real-server tests must run here (CI, or asked for).
fn required() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
        || std::env::var("PODALLOC_REAL_SERVER").is_ok_and(|v| v == "required")
}

fn script() -> PathBuf {
    crate::util::root().join("scripts/controlplane.sh")
}

/// The cached binaries' folder (`scripts/controlplane.sh env`), if both are built.
fn built() -> Option<PathBuf> {
    let out = Command::new("bash")
        .arg(script())
        .arg("env")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let bin = text
        .lines()
        .find_map(|l| l.strip_prefix("PODALLOC_CONTROLPLANE_BIN="))?;
    let bin = PathBuf::from(bin);
    (bin.join("kube-apiserver").is_file() && bin.join("etcd").is_file()).then_some(bin)
}

/// The control plane, started on first use; `None` (after one line) when it is not built and
/// not required.
pub fn control_plane() -> Option<&'static ControlPlane> {
    if built().is_none() {
        if required() {
            panic!(
                "the real-server tests must run here (CI or PODALLOC_REAL_SERVER=required), \
                 but kube-apiserver and etcd are not built: run scripts/controlplane.sh build"
            );
        }
        SKIP_SAID.get_or_init(|| {
            eprintln!(
                "real-server tests not run: kube-apiserver and etcd are not built \
                 (needs Go 1.26): run scripts/controlplane.sh test"
            )
        });
        return None;
    }
    match CONTROL_PLANE.get_or_init(start) {
        Ok(cp) => Some(cp),
        Err(e) => panic!("the real control plane did not start: {e}"),
    }
}

fn read(dir: &Path, name: &str) -> Result<String, String> {
    std::fs::read_to_string(dir.join(name))
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{name}: {e}"))
}

fn start() -> Result<ControlPlane, String> {
    let dir = std::env::temp_dir().join(format!("podalloc-cp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("bash")
        .arg(script())
        .arg("start")
        .arg(&dir)
        .env("PODALLOC_CP_WATCH_PID", std::process::id().to_string())
        // Continue tokens expire within seconds (the 410 test); the cache's snapshots of
        // lists would otherwise serve them for 75 s (KEP-4988).
        .env("PODALLOC_CP_COMPACTION", "5s")
        .env(
            "PODALLOC_CP_EXTRA",
            "--feature-gates=ListFromCacheSnapshot=false",
        )
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("scripts/controlplane.sh: {e}"))?;
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(said);
    }
    eprint!("{said}");
    let ca_file = dir.join("pki/ca.crt");
    let ca_pem = std::fs::read_to_string(&ca_file).map_err(|e| e.to_string())?;
    let url = read(&dir, "url")?;
    let admin_token = read(&dir, "admin.token")?;
    install_crd(&dir)?;
    let emulator = KubeletEmulator::start(&url, &ca_pem, &admin_token)
        .map_err(|e| format!("kubelet emulator: {e}"))?;
    Ok(ControlPlane {
        podalloc_token: read(&dir, "podalloc.token")?,
        throttled_token: read(&dir, "throttled.token")?,
        candidates: ["a", "b", "c"]
            .iter()
            .map(|w| {
                let user = format!("podalloc-{w}");
                read(&dir, &format!("{user}.token")).map(|t| (user, t))
            })
            .collect::<Result<_, _>>()?,
        audit_log: dir.join("audit.log"),
        dir,
        url,
        ca_pem,
        ca_file,
        admin_token,
        emulator,
        next_ns: AtomicU64::new(0),
    })
}

/// Installs `deploy/crd.yaml` (the ExecutorSet CRD) as the admin and waits until it is
/// Established and its resource is served (discovery lists it, so `kubectl get es` works),
/// at most 60 s.
fn install_crd(dir: &Path) -> Result<(), String> {
    let kubectl = |args: &[&str]| {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(dir.join("admin.kubeconfig"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("kubectl: {e}"))
    };
    let crd = crate::util::root().join("deploy/crd.yaml");
    let said = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
    };
    let out = kubectl(&["apply", "-f", crd.to_str().unwrap()])?;
    if !out.status.success() {
        return Err(format!("kubectl apply -f deploy/crd.yaml: {}", said(&out)));
    }
    let out = kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/executorsets.podalloc.io",
    ])?;
    if !out.status.success() {
        return Err(format!(
            "the ExecutorSet CRD is not Established: {}",
            said(&out)
        ));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = kubectl(&["get", "executorsets.podalloc.io", "-A"])?;
        if out.status.success() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("executorsets are not served: {}", said(&out)));
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

impl ControlPlane {
    /// kubectl as the admin.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig").arg(self.dir.join("admin.kubeconfig"));
        c
    }

    /// kubectl with `input` on its standard input; panics naming `what` when it fails.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str, what: &str) -> String {
        use std::io::Write;
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        crate::util::succeeded(&out, what)
    }

    /// A fresh namespace for one test (`NAME-N`), with `deploy/rbac.yaml` applied in it, that
    /// Role also bound to the users `podalloc`, `podalloc-throttled` and the candidates
    /// (`podalloc-a`, `-b`, `-c`), and the emulator managing its pods with `opts`.
    pub fn namespace(&self, name: &str, opts: EmulatorOptions) -> String {
        let n = self.next_ns.fetch_add(1, Ordering::SeqCst);
        let mut ns: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        ns.truncate(50);
        let ns = format!("{}-{n}", ns.trim_matches('-'));
        self.emulator
            .manage(&ns, opts)
            .unwrap_or_else(|e| panic!("the kubelet emulator could not list {ns}'s pods: {e}"));
        let rbac = std::fs::read_to_string(crate::util::root().join("deploy/rbac.yaml")).unwrap();
        let rbac = rbac.replace("namespace: batch", &format!("namespace: {ns}"));
        let candidates: String = (self.candidates.iter())
            .map(|(user, _)| {
                format!("- kind: User\n  name: {user}\n  apiGroup: rbac.authorization.k8s.io\n")
            })
            .collect();
        let binding = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n{rbac}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  \
             name: podalloc-test-users\n  namespace: {ns}\nsubjects:\n- kind: User\n  \
             name: podalloc\n  apiGroup: rbac.authorization.k8s.io\n- kind: User\n  \
             name: podalloc-throttled\n  apiGroup: rbac.authorization.k8s.io\n{candidates}roleRef:\n  \
             apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: podalloc\n"
        );
        self.kubectl_stdin(&["apply", "-f", "-"], &binding, "namespace set-up");
        ns
    }

    /// The audit log's events (`audit.k8s.io/v1` Event objects) about objects in namespace
    /// `ns`, in the order the server wrote them. The log is written before each response is
    /// sent (`--audit-log-mode=blocking`), so every request answered so far is in it.
    pub fn audit(&self, ns: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.audit_log).unwrap_or_default();
        text.lines()
            // A line still being written (another test's request) is not JSON yet.
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|ev| ev["objectRef"]["namespace"] == ns)
            .collect()
    }
}

/// One API call with `token` (GET, DELETE, or POST/PUT/PATCH of a JSON body; PATCH is a
/// merge patch): the status and the body as JSON (`Null` when it is not JSON).
pub fn call(
    base: &str,
    ca_pem: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let agent = crate::util::agent(ca_pem.as_bytes());
    let url = format!("{base}{path}");
    let auth = format!("Bearer {token}");
    let text = body.map(Value::to_string).unwrap_or_default();
    let resp = match method {
        "GET" => agent.get(&url).header("Authorization", &auth).call(),
        "DELETE" if body.is_none() => agent.delete(&url).header("Authorization", &auth).call(),
        "DELETE" => agent
            .delete(&url)
            .header("Authorization", &auth)
            .force_send_body()
            .content_type("application/json")
            .send(text),
        "POST" => agent
            .post(&url)
            .header("Authorization", &auth)
            .content_type("application/json")
            .send(text),
        "PUT" => agent
            .put(&url)
            .header("Authorization", &auth)
            .content_type("application/json")
            .send(text),
        "PATCH" => agent
            .patch(&url)
            .header("Authorization", &auth)
            .content_type("application/merge-patch+json")
            .send(text),
        _ => panic!("unsupported method {method}"),
    };
    let mut resp = resp.unwrap();
    let code = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    (code, serde_json::from_str(&text).unwrap_or(Value::Null))
}
