//! Reliability under hostile input, as whole processes: the real binary against the simulated
//! API server over HTTPS (or, for bodies no API server sends, a tiny plain-HTTP server on
//! loopback), with state and metrics paths that are links, FIFOs or devices.

use crate::util::{stderr, SimWorld, World};
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

const APP: &str = "rel-app";

fn world() -> World {
    SimWorld::spark(APP)
        .batch_delay("100ms")
        .pod_ms(50, 100)
        .stop(Duration::from_millis(50))
        .start()
}

/// The `spark-exec-id` labels of the app's pods, sorted.
fn exec_ids(w: &World) -> Vec<String> {
    let mut v: Vec<String> = (w.pods("default").iter())
        .map(|p| {
            let id = &p["metadata"]["labels"]["spark-exec-id"];
            id.as_str().unwrap_or("").to_string()
        })
        .collect();
    v.sort();
    v
}

/// Runs podalloc against the simulator, failing the test if it takes more than 30 s (a FIFO
/// must never hang).
fn run(w: &World, args: &[&str]) -> Output {
    bounded(w.cmd(args))
}

fn bounded(mut c: Command) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("podalloc hung: {:?}", child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(st.success(), "mkfifo {}", path.display());
}

/// A plain-HTTP server on loopback that answers every pod list with `list_body` and counts
/// the pod creates (answered 403, so a run that tries to create stops at once).
fn bad_list_server(list_body: &'static str) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let creates = Arc::new(AtomicUsize::new(0));
    let counter = creates.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            let (status, body) =
                if request_line.starts_with("GET ") && request_line.contains("/pods") {
                    ("200 OK", list_body.to_string())
                } else if request_line.starts_with("POST ") {
                    counter.fetch_add(1, Ordering::SeqCst);
                    (
                        "403 Forbidden",
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": "Forbidden", "code": 403, "message": "pods is forbidden"})
                        .to_string(),
                    )
                } else {
                    (
                        "404 Not Found",
                        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": "NotFound", "code": 404, "message": "not found"})
                        .to_string(),
                    )
                };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, creates)
}

/// With executors running, a list answer that is not a pod list read as "no pods" and
/// `reconcile --target 5` created 5 more. Now: exit 1, nothing created, the namespace named
/// and the body quoted.
#[test]
fn a_list_body_that_is_not_a_pod_list_is_an_error_not_an_empty_cluster() {
    for body in [r#"{}"#, r#"{"items": null}"#, r#"{"items": []}"#] {
        let (url, creates) = bad_list_server(body);
        let w = world();
        let mut c = w.bare();
        c.args(["--server", &url, "--token", "t", "-n", "default"]);
        c.args(["reconcile", "--target", "5"]);
        let out = bounded(c);
        let err = stderr(&out);
        assert_eq!(creates.load(Ordering::SeqCst), 0, "{body}: created: {err}");
        assert_eq!(out.status.code(), Some(1), "{body}: {err}");
        assert!(
            err.contains("namespace default")
                && err.contains("expected \"PodList\"")
                && err.contains(&format!("the body begins: {body}")),
            "{body}: {err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// One pod labelled `spark-exec-id=18446744073709551615` pushed the id counter to its end:
/// every later tick said "executor ids are exhausted" and exited 0. Now the pod is ignored
/// with a warning naming it, and ids start at 1.
#[test]
fn a_pod_with_an_id_beyond_i64_max_does_not_exhaust_the_ids() {
    let w = world();
    let stray = json!({"metadata": {"name": "stray", "labels": {
            "spark-app-selector": APP, "spark-role": "executor",
            "spark-exec-id": "18446744073709551615"}},
        "spec": {"containers": [{"name": "e", "image": "spark"}]}, "status": {"phase": "Running"}});
    let (code, _) = w.api("POST", "/sim/pods/default", Some(&stray));
    assert!(code == 200 || code == 201, "{code}");
    let out = run(&w, &["reconcile", "--target", "2"]);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("exhausted"), "{err}");
    assert!(
        err.contains("\"stray\"") && err.contains("outside the executor id range"),
        "{err}"
    );
    assert_eq!(exec_ids(&w), vec!["1", "18446744073709551615", "2"]);
    let st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(w.state_file()).unwrap()).unwrap();
    assert_eq!(st["last_executor_id"], 2);
}

/// An earlier version wrote the state THROUGH a symlink (its target was replaced). Now a
/// link at the state path is refused (exit 2, one line naming it) and its target untouched.
#[test]
fn a_symlinked_state_file_is_refused_and_its_target_untouched() {
    let w = world();
    let victim = w.dir.path().join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, w.state_file()).unwrap();
    let out = run(&w, &["reconcile", "--target", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("{} is a symbolic link", w.state_file().display())),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(exec_ids(&w).is_empty());
    // `status` (read-only, no lock) refuses it too.
    let out = run(&w, &["status"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// A FIFO at the state or lock path is refused at once (exit 2), never opened for a read
/// that would block.
#[test]
fn a_fifo_state_or_lock_file_is_refused_without_hanging() {
    let w = world();
    mkfifo(&w.state_file());
    let out = run(&w, &["reconcile", "--target", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("is a FIFO"), "{err}");
    let out = run(&w, &["status"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    std::fs::remove_file(w.state_file()).unwrap();
    let mut lock = w.state_file().into_os_string();
    lock.push(".lock");
    mkfifo(Path::new(&lock));
    let out = run(&w, &["reconcile", "--target", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("state.json.lock is a FIFO"), "{err}");
    assert!(exec_ids(&w).is_empty());
}

/// `--metrics-file` follows the same rule: a link, FIFO or device there is refused before
/// the tick (exit 2, naming the path).
#[test]
fn a_metrics_file_that_is_a_link_fifo_or_device_is_refused() {
    let w = world();
    let victim = w.dir.path().join("victim.prom");
    std::fs::write(&victim, "precious\n").unwrap();
    let link = w.dir.path().join("link.prom");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let fifo = w.dir.path().join("fifo.prom");
    mkfifo(&fifo);
    for (path, what) in [
        (link.as_path(), "a symbolic link"),
        (fifo.as_path(), "a FIFO"),
        (Path::new("/dev/null"), "a device"),
    ] {
        let mut c = w.cmd(&["reconcile", "--target", "1"]);
        c.arg("--metrics-file").arg(path);
        let out = bounded(c);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("metrics file {} is {what}", path.display())),
            "{err}"
        );
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(exec_ids(&w).is_empty());
    // A regular path still works.
    let mut c = w.cmd(&["reconcile", "--target", "1"]);
    c.arg("--metrics-file").arg(w.dir.path().join("ok.prom"));
    let out = bounded(c);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(w.dir.path().join("ok.prom").is_file());
}

/// A key twice in the state file: refused naming the file and the key, the file kept.
#[test]
fn a_state_file_with_a_duplicate_key_is_refused_and_kept() {
    let w = world();
    let body =
        "{\"version\": 1, \"target\": 3, \"last_executor_id\": 0, \"last_executor_id\": 7}\n";
    std::fs::write(w.state_file(), body).unwrap();
    let out = run(&w, &["reconcile"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("state.json") && err.contains("duplicate key \"last_executor_id\""),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(w.state_file()).unwrap(), body);
    assert!(exec_ids(&w).is_empty());
}

/// A save killed by SIGKILL leaves `.podalloc-state-XXXXXX.tmp`; the next run removes ours
/// older than a minute and leaves everything else.
#[test]
fn stale_temp_files_of_killed_saves_are_removed_on_start() {
    let w = world();
    let old = SystemTime::now() - Duration::from_secs(300);
    let mk = |name: &str, mtime: Option<SystemTime>| {
        let p = w.dir.path().join(name);
        let f = std::fs::File::create(&p).unwrap();
        if let Some(t) = mtime {
            f.set_modified(t).unwrap();
        }
        p
    };
    let stale = mk(".podalloc-state-Ab12Cd.tmp", Some(old));
    let fresh = mk(".podalloc-state-Ef34Gh.tmp", None);
    let foreign = mk("other-state-Ab12Cd.tmp", Some(old));
    let out = run(&w, &["reconcile", "--target", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stale.exists());
    assert!(fresh.exists() && foreign.exists());
}
