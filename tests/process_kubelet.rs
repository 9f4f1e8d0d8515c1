//! The process kubelet (`podalloc_sim::process`) on the real kube-apiserver: executor pods
//! run as local processes (here a shell script standing in for `java`), Running while the
//! process runs, Failed with its exit code when it dies, SIGTERM on delete and SIGKILL once
//! the grace period is over; other pods are left alone.

use crate::real;
use podalloc_sim::emulator::EmulatorOptions;
use podalloc_sim::process::ProcessOptions;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// Stands in for `java`: prints its arguments and env, then per executor id exits 7 (1),
/// exits 0 on SIGTERM (2), or ignores SIGTERM (3).
const FAKE_JAVA: &str = r#"#!/bin/sh
echo "args: $*"
env | sort
case "$SPARK_EXECUTOR_ID" in
  1) exit 7 ;;
  2) trap 'echo got TERM; exit 0' TERM; while :; do sleep 0.1; done ;;
  *) trap '' TERM; while :; do sleep 0.1; done ;;
esac
"#;

fn executor(name: &str, id: u32) -> Value {
    let env = json!([
        {"name": "SPARK_DRIVER_URL", "value": "spark://CoarseGrainedScheduler@127.0.0.1:7078"},
        {"name": "SPARK_EXECUTOR_ID", "value": id.to_string()},
        {"name": "SPARK_APPLICATION_ID", "value": "spark-proc"},
        {"name": "SPARK_CONF_DIR", "value": "/opt/spark/conf"},
        {"name": "SPARK_EXECUTOR_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    ]);
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"spark-role": "executor", "spark-exec-id": id.to_string(),
                        "spark-app-selector": "spark-proc"}},
           "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
                    "containers": [{"name": "spark-kubernetes-executor", "image": "spark", "env": env}]}})
}

/// A process kubelet whose `java` is [`FAKE_JAVA`] and classpath `/spark/jars/a.jar`, all
/// in `dir`: its options, and the folder of the executors' logs.
fn fake_java_kubelet(dir: &Path) -> (ProcessOptions, std::path::PathBuf) {
    let java = dir.join("java");
    std::fs::write(&java, FAKE_JAVA).unwrap();
    std::fs::set_permissions(&java, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(dir.join("cp.txt"), "/spark/jars/a.jar\n").unwrap();
    let logs = dir.join("logs");
    let process = ProcessOptions::new(
        java.to_str().unwrap(),
        &dir.join("cp.txt"),
        &dir.join("pods"),
        &logs,
    )
    .unwrap();
    (process, logs)
}

/// Executor 2's log in `logs` shows the command and env the Spark image builds, and a
/// local directory of its own under `dir`.
fn assert_exec_2_launched_as_the_image_does(dir: &Path, logs: &Path) {
    let log = std::fs::read_to_string(logs.join("exec-2.log")).unwrap();
    assert!(
        log.contains("--executor-id 2 --cores 1 --app-id spark-proc --hostname 127.0.0.1"),
        "{log}"
    );
    assert!(log.contains("-cp /spark/jars/a.jar:"), "{log}");
    assert!(log.contains("SPARK_EXECUTOR_POD_NAME=exec-2"), "{log}");
    assert!(!log.contains("SPARK_CONF_DIR"), "{log}");
    let local = log
        .lines()
        .find_map(|l| l.strip_prefix("SPARK_LOCAL_DIRS="))
        .unwrap();
    assert!(
        Path::new(local).is_dir() && local.starts_with(dir.to_str().unwrap()),
        "{local}"
    );
}

/// Executor pods run as processes on the real server: exit codes, SIGTERM, SIGKILL, others left.
#[test]
fn process_kubelet_runs_executor_pods_as_processes_on_real() {
    let Some(cp) = real::control_plane() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (process, logs) = fake_java_kubelet(dir.path());
    let opts = EmulatorOptions {
        schedule_latency: Duration::from_millis(10),
        startup_latency: Duration::from_millis(10),
        process: Some(process),
        ..EmulatorOptions::default()
    };
    let ns = cp.namespace("process-kubelet", opts);
    let call = |method: &str, path: &str, body: Option<&Value>| {
        real::call(&cp.url, &cp.ca_pem, &cp.admin_token, method, path, body)
    };
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    for (i, name) in ["exec-1", "exec-2", "exec-3"].iter().enumerate() {
        let (code, body) = call("POST", &pods, Some(&executor(name, i as u32 + 1)));
        assert_eq!(code, 201, "{body}");
    }
    let other = json!({"metadata": {"name": "not-an-executor"},
                       "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    assert_eq!(call("POST", &pods, Some(&other)).0, 201);
    let get = |name: &str| call("GET", &format!("{pods}/{name}"), None);
    let wait = |name: &str, what: &str, ok: &dyn Fn(u16, &Value) -> bool| -> Value {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let (code, p) = get(name);
            if ok(code, &p) {
                return p;
            }
            assert!(
                Instant::now() < end,
                "{name}: not {what} after 30 s: {code} {p}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let phase = |p: &Value| p["status"]["phase"].as_str().unwrap_or("").to_string();

    // Exit 7: Failed, the exit code on the container.
    let p = wait("exec-1", "Failed", &|_, p| phase(p) == "Failed");
    let term = &p["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(term["exitCode"], 7, "{p}");
    // Running, bound, at the loopback address; the command and env as the image builds them.
    for name in ["exec-2", "exec-3"] {
        let p = wait(name, "Running", &|_, p| phase(p) == "Running");
        assert_eq!(p["status"]["podIP"], "127.0.0.1");
        assert!(!p["spec"]["nodeName"].as_str().unwrap_or("").is_empty());
    }
    assert_exec_2_launched_as_the_image_does(dir.path(), &logs);

    // Deleted with grace 30: SIGTERM, the process exits 0, the pod is gone at once.
    let started = Instant::now();
    assert_eq!(call("DELETE", &format!("{pods}/exec-2"), None).0, 200);
    wait("exec-2", "gone", &|code, _| code == 404);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(std::fs::read_to_string(logs.join("exec-2.log"))
        .unwrap()
        .contains("got TERM"));

    // Deleted with grace 2, SIGTERM ignored: SIGKILL after the grace period, then gone.
    let started = Instant::now();
    let grace = json!({"gracePeriodSeconds": 2});
    assert_eq!(
        call("DELETE", &format!("{pods}/exec-3"), Some(&grace)).0,
        200
    );
    wait("exec-3", "gone", &|code, _| code == 404);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // The other pod was never bound nor given a status.
    let (_, p) = get("not-an-executor");
    assert_eq!(p["spec"]["nodeName"], Value::Null, "{p}");
    assert_eq!(phase(&p), "Pending");
    assert_eq!(p["status"]["conditions"], Value::Null, "{p}");
}
