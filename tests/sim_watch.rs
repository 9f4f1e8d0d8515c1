//! `watch=true` on the simulator's pod lists (`crates/podalloc-sim/src/watch.rs`): the
//! event stream over HTTP (order, resourceVersions, selectors, 410 for an expired start,
//! `timeoutSeconds`, bookmarks, Tables, shutdown with watches open), then the real kubectl
//! against `podalloc sim`: `get pods -w` and `delete pod`, which waits on a watch.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::util::{agent, podalloc, SimWorld, World};

/// What kubectl's `get` puts in `Accept` (a Table, else JSON).
const TABLE_ACCEPT: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// An open watch: its events as they arrive, read on a thread of their own; `None` once
/// the server ended the stream.
struct Watch {
    events: mpsc::Receiver<Option<Value>>,
}

impl Watch {
    /// Starts `GET path` (a watch) with `accept`; panics unless the answer is a 200
    /// `application/json` stream.
    fn open(w: &World, path: &str, accept: &str) -> Watch {
        let resp = agent(w.sim.ca_pem().unwrap().as_bytes())
            .get(&format!("{}{path}", w.sim.url()))
            .header("Authorization", &format!("Bearer {}", w.token))
            .header("Accept", accept)
            .call()
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200, "{path}");
        let headers = resp.headers();
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["transfer-encoding"], "chunked");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let reader = BufReader::new(resp.into_body().into_reader());
            for line in reader.lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).expect("a JSON event per line");
                if tx.send(Some(v)).is_err() {
                    return;
                }
            }
            let _ = tx.send(None);
        });
        Watch { events: rx }
    }

    /// The next event within 10 s; panics on the end of the stream or a timeout.
    fn next(&self) -> Value {
        match self.events.recv_timeout(Duration::from_secs(10)) {
            Ok(Some(v)) => v,
            Ok(None) => panic!("the watch ended"),
            Err(e) => panic!("no event within 10 s: {e}"),
        }
    }

    /// The next event about pod `name` that is not a bookmark.
    fn next_about(&self, name: &str) -> Value {
        loop {
            let e = self.next();
            if e["object"]["metadata"]["name"] == name {
                return e;
            }
        }
    }

    /// Waits for the end of the stream (within `within`), returning the events before it.
    fn until_end(&self, within: Duration) -> Vec<Value> {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(Some(v)) => got.push(v),
                Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => return got,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the watch did not end within {within:?}: {got:?}")
                }
            }
        }
    }

    /// Asserts nothing arrives for `quiet`.
    fn assert_quiet(&self, quiet: Duration) {
        if let Ok(v) = self.events.recv_timeout(quiet) {
            panic!("unexpected event: {v:?}");
        }
    }
}

/// A JSON watch of the pods in `default`, `query` after `watch=true`.
fn pod_watch(w: &World, query: &str) -> Watch {
    let path = format!("/api/v1/namespaces/default/pods?watch=true{query}");
    Watch::open(w, &path, "application/json")
}

/// A pod in `default` named `name` with label `app`.
fn pod(name: &str, app: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "labels": {"app": app}},
           "spec": {"containers": [{"name": "c", "image": "img"}]}})
}

fn create(w: &World, name: &str, app: &str) -> Value {
    let (code, body) = w.api(
        "POST",
        "/api/v1/namespaces/default/pods",
        Some(&pod(name, app)),
    );
    assert_eq!(code, 201, "{body}");
    body
}

fn rv_of(e: &Value) -> u64 {
    e["object"]["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no resourceVersion in {e}"))
}

fn list_rv(w: &World, query: &str) -> String {
    let (code, list) = w.api(
        "GET",
        &format!("/api/v1/namespaces/default/pods{query}"),
        None,
    );
    assert_eq!(code, 200, "{list}");
    list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A simulator whose pods are never scheduled (no kubelet changes between the test's own).
fn still_world() -> World {
    SimWorld::new().schedule(Duration::from_secs(3600)).start()
}

#[test]
fn a_watch_from_a_list_streams_added_modified_deleted_in_order() {
    let w = still_world();
    create(&w, "before", "a");
    let rv = list_rv(&w, "");
    let watch = pod_watch(&w, &format!("&resourceVersion={rv}"));
    create(&w, "p1", "a");
    let (code, _) = w.api(
        "PATCH",
        "/api/v1/namespaces/default/pods/p1",
        Some(&json!({"metadata": {"labels": {"step": "2"}}})),
    );
    assert_eq!(code, 200);
    let (code, _) = w.api(
        "DELETE",
        "/api/v1/namespaces/default/pods/p1?gracePeriodSeconds=0",
        None,
    );
    assert_eq!(code, 200);
    let added = watch.next();
    let modified = watch.next();
    let deleted = watch.next();
    let types: Vec<&str> = [&added, &modified, &deleted]
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["ADDED", "MODIFIED", "DELETED"]);
    for e in [&added, &modified, &deleted] {
        assert_eq!(e["object"]["metadata"]["name"], "p1", "{e}");
        assert_eq!(e["object"]["kind"], "Pod");
    }
    assert_eq!(modified["object"]["metadata"]["labels"]["step"], "2");
    let rvs = [rv_of(&added), rv_of(&modified), rv_of(&deleted)];
    assert!(rv.parse::<u64>().unwrap() < rvs[0], "{rvs:?} after {rv}");
    assert!(rvs[0] < rvs[1] && rvs[1] < rvs[2], "{rvs:?}");
    // The pod created before the list's resourceVersion is not replayed.
    watch.assert_quiet(Duration::from_millis(300));
}

#[test]
fn a_watch_without_a_resource_version_starts_with_the_current_pods() {
    let w = still_world();
    create(&w, "old-1", "a");
    create(&w, "old-2", "a");
    // `watch=1` is true too.
    let watch = Watch::open(
        &w,
        "/api/v1/namespaces/default/pods?watch=1",
        "application/json",
    );
    let names: Vec<Value> = (0..2)
        .map(|_| {
            let e = watch.next();
            assert_eq!(e["type"], "ADDED", "{e}");
            e["object"]["metadata"]["name"].clone()
        })
        .collect();
    assert_eq!(names, ["old-1", "old-2"]);
    create(&w, "new", "a");
    assert_eq!(watch.next_about("new")["type"], "ADDED");
}

#[test]
fn label_and_field_selectors_filter_events() {
    let w = still_world();
    let rv = list_rv(&w, "");
    let by_label = pod_watch(&w, &format!("&resourceVersion={rv}&labelSelector=app%3Da"));
    let by_name = pod_watch(
        &w,
        &format!("&resourceVersion={rv}&fieldSelector=metadata.name%3Dtwo"),
    );
    create(&w, "one", "a");
    create(&w, "two", "b");
    let e = by_label.next();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("one"))
    );
    let e = by_name.next();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("two"))
    );
    // Relabelled into the selector: an ADDED; out of it again: a DELETED at the change's
    // resourceVersion, with the old labels.
    let relabel = |app: &str| {
        let (code, body) = w.api(
            "PATCH",
            "/api/v1/namespaces/default/pods/two",
            Some(&json!({"metadata": {"labels": {"app": app}}})),
        );
        assert_eq!(code, 200, "{body}");
        body["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string()
    };
    relabel("a");
    let e = by_label.next();
    assert_eq!(
        (e["type"].as_str(), e["object"]["metadata"]["name"].as_str()),
        (Some("ADDED"), Some("two"))
    );
    let out_rv = relabel("c");
    let e = by_label.next();
    assert_eq!(e["type"], "DELETED", "{e}");
    assert_eq!(e["object"]["metadata"]["labels"]["app"], "a");
    assert_eq!(e["object"]["metadata"]["resourceVersion"], out_rv.as_str());
    // The name watch saw both relabels as MODIFIED, and nothing about "one".
    assert_eq!(by_name.next()["type"], "MODIFIED");
    assert_eq!(by_name.next()["type"], "MODIFIED");
    by_name.assert_quiet(Duration::from_millis(300));
}

/// Pod changes the simulator's watch history holds (`watch::HISTORY`).
const HISTORY: u64 = 8192;

#[test]
fn a_watch_from_before_the_history_gets_410_and_ends() {
    let w = still_world();
    create(&w, "p", "a");
    // The history starts with the simulator: from resourceVersion 1, every change so far.
    let early = pod_watch(&w, "&resourceVersion=1");
    assert_eq!(early.next_about("p")["type"], "ADDED");
    // 8 more changes than the ring holds, seeded in one request: the first 9 are dropped.
    let items: Vec<Value> = (0..HISTORY + 8)
        .map(|i| pod(&format!("s-{i}"), "seed"))
        .collect();
    let (code, list) = w.api(
        "POST",
        "/sim/pods/default",
        Some(&json!({"kind": "PodList", "items": items})),
    );
    assert_eq!(code, 201);
    let last: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let oldest = last - HISTORY;
    let watch = pod_watch(&w, "&resourceVersion=1");
    let events = watch.until_end(Duration::from_secs(10));
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["type"], "ERROR");
    let status = &e["object"];
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 410);
    assert_eq!(status["reason"], "Expired");
    assert_eq!(
        status["message"],
        format!("too old resource version: 1 ({oldest})")
    );
    // From the oldest resourceVersion it still has, the watch replays what follows it.
    let from_oldest = pod_watch(&w, &format!("&resourceVersion={oldest}"));
    let first = from_oldest.next();
    assert_eq!(first["type"], "ADDED");
    assert_eq!(rv_of(&first), oldest + 1);
}

#[test]
fn timeout_seconds_ends_the_stream() {
    let w = still_world();
    let t = Instant::now();
    let watch = pod_watch(&w, "&timeoutSeconds=1");
    let events = watch.until_end(Duration::from_secs(10));
    assert!(events.is_empty(), "{events:?}");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[test]
fn watch_list_ends_its_initial_events_with_a_bookmark() {
    let w = still_world();
    create(&w, "p", "a");
    let rv = list_rv(&w, "");
    let q = "&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan";
    let watch = pod_watch(&w, q);
    assert_eq!(watch.next()["type"], "ADDED");
    let b = watch.next();
    assert_eq!(b["type"], "BOOKMARK", "{b}");
    assert_eq!(b["object"]["kind"], "Pod");
    assert_eq!(b["object"]["metadata"]["resourceVersion"], rv.as_str());
    assert_eq!(
        b["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    // Without the two settings it needs, sendInitialEvents is a 422.
    let (code, body) = w.api(
        "GET",
        "/api/v1/namespaces/default/pods?watch=true&sendInitialEvents=true",
        None,
    );
    assert_eq!(code, 422, "{body}");
    let causes = body["details"]["causes"].as_array().unwrap();
    let fields: Vec<&str> = causes
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["resourceVersionMatch", "allowWatchBookmarks"]);
}

#[test]
fn a_table_watch_sends_the_columns_once() {
    let w = still_world();
    create(&w, "p", "a");
    let watch = Watch::open(
        &w,
        "/api/v1/namespaces/default/pods?watch=true",
        TABLE_ACCEPT,
    );
    create(&w, "q", "a");
    let first = watch.next();
    let second = watch.next();
    for (e, name) in [(&first, "p"), (&second, "q")] {
        assert_eq!(e["type"], "ADDED");
        assert_eq!(e["object"]["kind"], "Table", "{e}");
        assert_eq!(e["object"]["rows"][0]["cells"][0], name);
    }
    assert_eq!(first["object"]["columnDefinitions"][0]["name"], "Name");
    assert!(second["object"]["columnDefinitions"].is_null(), "{second}");
}

#[test]
fn shutdown_ends_open_watches_at_once() {
    let w = still_world();
    let watches: Vec<Watch> = (0..3)
        .map(|_| Watch::open(&w, "/api/v1/pods?watch=true", "application/json"))
        .collect();
    let t = Instant::now();
    w.sim.stop();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    for watch in &watches {
        assert!(watch.until_end(Duration::from_secs(5)).is_empty());
    }
}

/// `podalloc sim` writing a kubeconfig into a fresh directory, pods Running 250 ms after
/// their creation and stopping 500 ms after a graceful delete (the default); killed on drop.
struct SimProcess {
    child: Child,
    dir: tempfile::TempDir,
}

impl SimProcess {
    /// A started simulator with pod `name` created by kubectl; `None` when kubectl is
    /// missing (see [`no_kubectl`]).
    fn with_pod(name: &str) -> Option<SimProcess> {
        if crate::util::kubectl_missing() {
            return None;
        }
        let sim = SimProcess::start();
        sim.create(name);
        Some(sim)
    }

    fn start() -> SimProcess {
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        let child = podalloc()
            .args(["sim", "--listen", "127.0.0.1:0", "--write-kubeconfig"])
            .arg(&kc)
            .args(["--schedule-latency", "50ms", "--startup-latency", "200ms"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::metadata(&kc).map_or(true, |m| m.len() == 0) {
            assert!(
                Instant::now() < deadline,
                "podalloc sim wrote no kubeconfig"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        SimProcess { child, dir }
    }

    fn kubectl(&self) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("kcache"));
        c
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "kubectl {args:?}: {err}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn create(&self, name: &str) {
        let manifest = self.dir.path().join(format!("{name}.json"));
        std::fs::write(&manifest, pod(name, "w").to_string()).unwrap();
        self.kubectl_ok(&["create", "-f", manifest.to_str().unwrap()]);
    }
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn kubectl_get_pods_watch_shows_a_new_pod() {
    let Some(sim) = SimProcess::with_pod("first") else {
        return;
    };
    let mut get = sim
        .kubectl()
        .args(["get", "pods", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = get.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let wait_line = |what: &str, f: &dyn Fn(&str) -> bool| -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if f(&l) => return l,
                Ok(_) => {}
                Err(e) => panic!("kubectl get -w printed no line {what}: {e}"),
            }
        }
    };
    let header = wait_line("header", &|l| l.starts_with("NAME"));
    assert!(header
        .split_whitespace()
        .eq(["NAME", "READY", "STATUS", "RESTARTS", "AGE"]));
    wait_line("for the first pod", &|l| l.starts_with("first "));
    sim.create("second");
    let line = wait_line("for the second pod", &|l| l.starts_with("second "));
    assert_eq!(line.split_whitespace().count(), 5, "{line}");
    // The pod goes Running: kubectl prints its new state.
    wait_line("with second Running", &|l| {
        l.starts_with("second ") && l.contains("Running")
    });
    assert!(get.try_wait().unwrap().is_none(), "kubectl get -w exited");
    let _ = get.kill();
    let _ = get.wait();
}

#[test]
fn kubectl_delete_pod_returns_once_the_pod_is_gone() {
    let Some(sim) = SimProcess::with_pod("doomed") else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let phase = || sim.kubectl_ok(&["get", "pod", "doomed", "-o", "jsonpath={.status.phase}"]);
    while phase() != "Running" {
        assert!(Instant::now() < deadline, "the pod never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    // `get pod NAME` asks for a Table too.
    let shown = sim.kubectl_ok(&["get", "pod", "doomed"]);
    let mut lines = shown
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>());
    assert_eq!(
        lines.next().unwrap(),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    assert_eq!(lines.next().unwrap()[..3], ["doomed", "1/1", "Running"]);
    let t = Instant::now();
    let out = sim.kubectl_ok(&["delete", "pod", "doomed"]);
    assert_eq!(out.trim(), "pod \"doomed\" deleted");
    // Graceful: the kubelet model takes its 500 ms stop latency before the pod is removed,
    // and kubectl waited for that on its watch.
    assert!(
        t.elapsed() >= Duration::from_millis(450),
        "{:?}",
        t.elapsed()
    );
    let out = sim
        .kubectl()
        .args(["get", "pod", "doomed"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("NotFound"), "{err}");
}
