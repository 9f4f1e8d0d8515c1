//! The process kubelet: the kubelet emulator's mode ([`crate::emulator::EmulatorOptions::process`])
//! that runs each Spark executor pod of a namespace as a local JVM instead of emulating its
//! containers, so a real Spark driver gets real executors from pods on a real kube-apiserver.
//!
//! The command is what the Spark image's entrypoint (apache/spark-docker
//! `entrypoint.sh`, `executor`) runs, mapped to this host:
//!
//! ```text
//! java ${SPARK_JAVA_OPT_0..N (numeric order)} -Xms$SPARK_EXECUTOR_MEMORY -Xmx$SPARK_EXECUTOR_MEMORY
//!   -cp CLASSPATH:CWD org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend
//!   --driver-url $SPARK_DRIVER_URL --executor-id $SPARK_EXECUTOR_ID --cores $SPARK_EXECUTOR_CORES
//!   --app-id $SPARK_APPLICATION_ID --hostname 127.0.0.1
//!   --resourceProfileId $SPARK_RESOURCE_PROFILE_ID --podName $SPARK_EXECUTOR_POD_NAME
//! ```
//!
//! with the env of the pod's executor container (`spark-kubernetes-executor`, else the first):
//! plain values, and `fieldRef`s resolved as the kubelet resolves them (`metadata.name`,
//! `metadata.namespace`, `metadata.uid`, `spec.nodeName`, `status.podIP` and `status.hostIP`
//! = 127.0.0.1); `SPARK_LOCAL_DIRS` overridden to the pod's own `local/` folder (the pod names
//! a path under `/var/data`) and `SPARK_CONF_DIR` dropped (`/opt/spark/conf` does not exist
//! here; executors get their conf from the driver). Each process runs in its own process group
//! with its own working directory (`DIR/<pod>-<uid prefix>`, which is on the classpath as in
//! the image: `spark.jars` are fetched there), stdout and stderr in `LOGS/<pod>.log`.
//! `scripts/spark-app.sh` runs a real Spark driver against it; the header of that script says
//! what the driver, the executors and this kubelet need of each other.

use serde_json::Value;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Instant;

/// The address every executor process reports and binds (`status.podIP`, `--hostname`).
pub const POD_IP: &str = "127.0.0.1";
/// Spark's executor entrypoint class (Spark 3.3 and later, Kubernetes).
pub const EXECUTOR_CLASS: &str = "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend";
/// The container Spark names in its executor pods.
pub const EXECUTOR_CONTAINER: &str = "spark-kubernetes-executor";

/// How executor pods become processes.
#[derive(Clone, Debug)]
pub struct ProcessOptions {
    /// The `java` to run (a path, or a name looked up in `PATH`).
    pub java: String,
    /// The classpath (`:`-separated jars; Spark and its dependencies, e.g. the
    /// `maven-dependency-plugin:build-classpath` output), before the pod's working directory.
    pub classpath: String,
    /// Absolute folder under which each pod gets its working directory.
    pub work_dir: PathBuf,
    /// Absolute folder of the processes' logs (`<pod name>.log`, stdout and stderr).
    pub log_dir: PathBuf,
}

impl ProcessOptions {
    /// Options with the classpath read from `classpath_file` (surrounding whitespace
    /// trimmed) and both folders created and made absolute. Errors: a file or folder error.
    pub fn new(
        java: &str,
        classpath_file: &Path,
        work_dir: &Path,
        log_dir: &Path,
    ) -> io::Result<ProcessOptions> {
        let classpath = fs::read_to_string(classpath_file)
            .map_err(|e| io::Error::other(format!("{}: {e}", classpath_file.display())))?;
        fs::create_dir_all(work_dir)?;
        fs::create_dir_all(log_dir)?;
        Ok(ProcessOptions {
            java: java.to_string(),
            classpath: classpath.trim().to_string(),
            work_dir: fs::canonicalize(work_dir)?,
            log_dir: fs::canonicalize(log_dir)?,
        })
    }
}

/// Whether the pod is a Spark executor (label `spark-role=executor`): the only pods the
/// process kubelet touches.
pub fn is_executor(pod: &Value) -> bool {
    pod["metadata"]["labels"]["spark-role"] == "executor"
}

/// The executor container of `pod`: the one named [`EXECUTOR_CONTAINER`], else the first.
fn executor_container(pod: &Value) -> Option<&Value> {
    let cs = pod["spec"]["containers"].as_array()?;
    cs.iter()
        .find(|c| c["name"] == EXECUTOR_CONTAINER)
        .or_else(|| cs.first())
}

/// The value the kubelet gives a `fieldRef` env var (the downward API), `None` for a path it
/// does not resolve here.
fn field_ref(pod: &Value, path: &str) -> Option<String> {
    let m = &pod["metadata"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    Some(match path {
        "metadata.name" => s(&m["name"]),
        "metadata.namespace" => s(&m["namespace"]),
        "metadata.uid" => s(&m["uid"]),
        "spec.nodeName" => s(&pod["spec"]["nodeName"]),
        "spec.serviceAccountName" => s(&pod["spec"]["serviceAccountName"]),
        "status.podIP" | "status.hostIP" => POD_IP.to_string(),
        _ => return None,
    })
}

/// The pod's container env, `fieldRef`s resolved, in the pod's order. Entries from Secrets,
/// ConfigMaps or resources are left out (none in Spark's executor pods).
pub fn pod_env(pod: &Value) -> Vec<(String, String)> {
    let Some(c) = executor_container(pod) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let Some(name) = e["name"].as_str() else {
            continue;
        };
        let value = match (
            &e["value"],
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Value::String(v), _) => Some(v.clone()),
            (_, Some(path)) => field_ref(pod, path),
            (Value::Null, None) if e["valueFrom"].is_null() => Some(String::new()),
            _ => None,
        };
        if let Some(v) = value {
            out.push((name.to_string(), v));
        }
    }
    out
}

/// Environment variables, in order: (name, value).
pub type Env = Vec<(String, String)>;

/// The executor's env (the pod's, `SPARK_LOCAL_DIRS` set to `local_dir`, `SPARK_CONF_DIR`
/// dropped) and its argument list after the program, as the image's entrypoint builds them.
/// Errors: a variable the command needs is missing (`SPARK_DRIVER_URL`, …).
pub fn command_line(
    pod: &Value,
    classpath: &str,
    cwd: &Path,
    local_dir: &Path,
) -> Result<(Env, Vec<String>), String> {
    let mut env: Vec<(String, String)> = pod_env(pod)
        .into_iter()
        .filter(|(k, _)| k != "SPARK_CONF_DIR" && k != "SPARK_LOCAL_DIRS")
        .collect();
    env.push(("SPARK_LOCAL_DIRS".into(), local_dir.display().to_string()));
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let need = |k: &str| get(k).ok_or_else(|| format!("the pod has no env {k}"));
    let mut opts: Vec<(u64, String)> = env
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("SPARK_JAVA_OPT_")?.parse().ok()?, v.clone())))
        .collect();
    opts.sort();
    let mut args: Vec<String> = opts.into_iter().map(|(_, v)| v).collect();
    if let Some(mem) = get("SPARK_EXECUTOR_MEMORY") {
        args.push(format!("-Xms{mem}"));
        args.push(format!("-Xmx{mem}"));
    }
    let cp = match classpath {
        "" => cwd.display().to_string(),
        cp => format!("{cp}:{}", cwd.display()),
    };
    args.extend(["-cp".to_string(), cp, EXECUTOR_CLASS.to_string()]);
    let flags = [
        ("--driver-url", need("SPARK_DRIVER_URL")?),
        ("--executor-id", need("SPARK_EXECUTOR_ID")?),
        (
            "--cores",
            get("SPARK_EXECUTOR_CORES").unwrap_or_else(|| "1".into()),
        ),
        ("--app-id", need("SPARK_APPLICATION_ID")?),
        ("--hostname", POD_IP.to_string()),
        (
            "--resourceProfileId",
            get("SPARK_RESOURCE_PROFILE_ID").unwrap_or_else(|| "0".into()),
        ),
        (
            "--podName",
            get("SPARK_EXECUTOR_POD_NAME")
                .unwrap_or_else(|| field_ref(pod, "metadata.name").unwrap_or_default()),
        ),
    ];
    for (flag, v) in flags {
        args.push(flag.to_string());
        args.push(v);
    }
    Ok((env, args))
}

/// The variables of the kubelet's own environment an executor keeps (the rest is the pod's).
const HOST_ENV: [&str; 5] = ["PATH", "HOME", "LANG", "JAVA_HOME", "TMPDIR"];

/// One executor process of a pod.
#[derive(Debug)]
pub(crate) struct Proc {
    /// The pod's name (for the log).
    name: String,
    /// The pod's uid: a pod recreated under the same name is another process.
    pub uid: String,
    child: Child,
    /// When SIGTERM was sent (the pod's deletion seen).
    pub term_at: Option<Instant>,
    /// SIGKILL sent (the grace period ran out, or the pod vanished).
    pub killed: bool,
    /// The exit code once the process has ended (128 + N for signal N).
    pub exit: Option<i64>,
    /// The end reported through the pod's status (or the pod is being deleted).
    pub reported: bool,
}

/// The exit code a container runtime reports: the code, or 128 + the signal's number.
pub fn exit_code(status: ExitStatus) -> i64 {
    match (status.code(), status.signal()) {
        (Some(c), _) => i64::from(c),
        (None, Some(s)) => 128 + i64::from(s),
        (None, None) => 255,
    }
}

/// Starts the executor of `pod` (named `name`, uid `uid`). Errors: the command could not be
/// built (a missing env var), a folder or log could not be made, or the spawn failed.
pub(crate) fn spawn(
    opts: &ProcessOptions,
    pod: &Value,
    name: &str,
    uid: &str,
) -> Result<Proc, String> {
    let short: String = uid.chars().take(8).collect();
    let cwd = opts.work_dir.join(format!("{name}-{short}"));
    let local = cwd.join("local");
    fs::create_dir_all(&local).map_err(|e| format!("{}: {e}", local.display()))?;
    let (env, args) = command_line(pod, &opts.classpath, &cwd, &local)?;
    let log_path = opts.log_dir.join(format!("{name}.log"));
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&opts.java);
    cmd.args(&args)
        .current_dir(&cwd)
        .env_clear()
        .envs(
            HOST_ENV
                .iter()
                .filter_map(|k| Some((*k, std::env::var(k).ok()?))),
        )
        .envs(env)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .process_group(0);
    let child = cmd.spawn().map_err(|e| format!("{}: {e}", opts.java))?;
    log::info!("process kubelet: {name} started as pid {}", child.id());
    Ok(Proc {
        name: name.to_string(),
        uid: uid.to_string(),
        child,
        term_at: None,
        killed: false,
        exit: None,
        reported: false,
    })
}

impl Proc {
    /// Sends `sig` to the process's group (the JVM and anything it started).
    pub fn signal(&mut self, sig: i32) {
        if self.exit.is_none() {
            if let Ok(pid) = i32::try_from(self.child.id()) {
                log::info!("process kubelet: {} signal {sig}", self.name);
                // SAFETY: kill(2) with a process group we created; no memory is involved.
                unsafe { libc::kill(-pid, sig) };
            }
        }
        if sig == libc::SIGTERM && self.term_at.is_none() {
            self.term_at = Some(Instant::now());
        } else if sig == libc::SIGKILL {
            self.killed = true;
        }
    }

    /// Reaps the process if it has ended; returns its exit code once it has.
    pub fn poll(&mut self) -> Option<i64> {
        if self.exit.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.ended(status);
            }
        }
        self.exit
    }

    fn ended(&mut self, status: ExitStatus) {
        let code = exit_code(status);
        log::info!("process kubelet: {} exited {code}", self.name);
        self.exit = Some(code);
    }

    /// SIGTERM, then SIGKILL if it has not ended within `grace`; waits for it.
    pub fn stop(&mut self, grace: std::time::Duration) {
        self.signal(libc::SIGTERM);
        let until = Instant::now() + grace;
        while self.poll().is_none() && Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if self.exit.is_none() {
            self.signal(libc::SIGKILL);
            if let Ok(status) = self.child.wait() {
                self.ended(status);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod() -> Value {
        json!({"metadata": {"name": "app-1a-exec-3", "namespace": "spark", "uid": "0123456789ab",
                "labels": {"spark-role": "executor"}},
               "spec": {"containers": [{"name": "sidecar"}, {"name": EXECUTOR_CONTAINER, "env": [
                 {"name": "SPARK_DRIVER_URL", "value": "spark://CoarseGrainedScheduler@127.0.0.1:4"},
                 {"name": "SPARK_EXECUTOR_ID", "value": "3"},
                 {"name": "SPARK_APPLICATION_ID", "value": "spark-x"},
                 {"name": "SPARK_EXECUTOR_MEMORY", "value": "512m"},
                 {"name": "SPARK_CONF_DIR", "value": "/opt/spark/conf"},
                 {"name": "SPARK_LOCAL_DIRS", "value": "/var/data/spark-1"},
                 {"name": "SPARK_JAVA_OPT_10", "value": "-Dten"},
                 {"name": "SPARK_JAVA_OPT_2", "value": "-Dtwo"},
                 {"name": "SPARK_EXECUTOR_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                 {"name": "SPARK_EXECUTOR_POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                 {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]}})
    }

    #[test]
    fn the_entrypoint_command_with_the_pods_env_mapped_to_this_host() {
        let (env, args) = command_line(
            &pod(),
            "/a.jar:/b.jar",
            Path::new("/w/p"),
            Path::new("/w/p/local"),
        )
        .unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("SPARK_EXECUTOR_POD_IP"), Some(POD_IP));
        assert_eq!(get("SPARK_EXECUTOR_POD_NAME"), Some("app-1a-exec-3"));
        assert_eq!(get("SPARK_LOCAL_DIRS"), Some("/w/p/local"));
        assert_eq!(get("SPARK_CONF_DIR"), None);
        assert_eq!(get("FROM_SECRET"), None);
        let want = "-Dtwo -Dten -Xms512m -Xmx512m -cp /a.jar:/b.jar:/w/p \
            org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
            --driver-url spark://CoarseGrainedScheduler@127.0.0.1:4 --executor-id 3 --cores 1 \
            --app-id spark-x --hostname 127.0.0.1 --resourceProfileId 0 --podName app-1a-exec-3";
        assert_eq!(args.join(" "), want);
    }

    #[test]
    fn a_pod_without_the_drivers_url_is_refused_and_only_executors_count() {
        let mut p = pod();
        p["spec"]["containers"][1]["env"]
            .as_array_mut()
            .unwrap()
            .remove(0);
        let err = command_line(&p, "", Path::new("/w"), Path::new("/w/l")).unwrap_err();
        assert_eq!(err, "the pod has no env SPARK_DRIVER_URL");
        assert!(is_executor(&pod()));
        p["metadata"]["labels"]["spark-role"] = json!("driver");
        assert!(!is_executor(&p));
    }

    #[test]
    fn a_signal_is_reported_as_128_plus_its_number() {
        let status = |raw: i32| ExitStatus::from_raw(raw);
        assert_eq!(exit_code(status(7 << 8)), 7);
        assert_eq!(exit_code(status(libc::SIGKILL)), 137);
        assert_eq!(exit_code(status(libc::SIGTERM)), 143);
    }
}
