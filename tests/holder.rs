//! Who acts on an in-cluster home without a `--leader-elect` Lease, on both servers
//! (`both!`): a `run` loop writes its holder record once (the ConfigMap's annotation
//! `podalloc.io/holder`, the ExecutorSet's `status.holder`) and never renews it; a process
//! that finds another holder's record asks it whether it lives (a ping, answered by a pong
//! at the holder's next read of its home). Each test plays one reported failure.

use crate::both::{both, Env, Pods};
use crate::util::{is_leader, stderr};
use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The path of ExecutorSet `name` (`sub`: a subresource, e.g. `/status`).
fn es_path(e: &Env, name: &str, sub: &str) -> String {
    format!(
        "/apis/podalloc.io/v1alpha1/namespaces/{}/executorsets/{name}{sub}",
        e.ns
    )
}

/// The path of ConfigMap `name`.
fn cm_path(e: &Env, name: &str) -> String {
    format!("/api/v1/namespaces/{}/configmaps/{name}", e.ns)
}

/// `run` as candidate `who` (audited) on `store`, with `args` after `run` and its metrics in
/// `metrics`.
fn start(e: &Env, who: &str, store: &str, metrics: &std::path::Path, args: &[&str]) -> Child {
    let m = metrics.to_str().unwrap();
    let mut a = vec!["--metrics-file", m, "--state-store", store, "run"];
    a.extend_from_slice(args);
    (e.candidate_cmd(who, &a))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The ConfigMap and the ExecutorSet home of the test's app, in the order of `cm`: for each,
/// whether it is the ConfigMap, its name (`APP-cm`, `APP-es`) and its `--state-store`.
fn homes(e: &Env, cm: [bool; 2]) -> [(bool, String, String); 2] {
    cm.map(|cm| {
        let (kind, short) = if cm {
            ("configmap", "cm")
        } else {
            ("executorset", "es")
        };
        let name = format!("{}-{short}", e.app);
        let store = format!("{kind}:{name}");
        (cm, name, store)
    })
}

/// [`start`] of candidate `a` on `store` at `--target` `target`, a tick a second, with a
/// metrics file of its own.
fn start_a(e: &Env, store: &str, target: &str) -> Child {
    let metrics = e
        .dir
        .path()
        .join(format!("{}.prom", store.replace(':', "-")));
    start(
        e,
        "a",
        store,
        &metrics,
        &["--target", target, "--interval", "1s"],
    )
}

/// The time since `t0`, printed as how long `what` took on `store` on this server; fails
/// when it is not below `limit` (with `err`, the command's standard error, if any).
fn timed(e: &Env, store: &str, what: &str, t0: Instant, limit: Duration, err: &str) {
    let took = t0.elapsed();
    eprintln!("{}: {store}: {what} in {} ms", server(e), took.as_millis());
    assert!(took < limit, "{took:?}: {err}");
}

/// SIGTERMs `c`, waits for it (exit 0) and returns its standard error.
fn stop(c: Child) -> String {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let out = c.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    err
}

/// Which server `e` runs on, for the figures printed.
fn server(e: &Env) -> &'static str {
    match e.control_plane() {
        Some(_) => "kube-apiserver",
        None => "simulator",
    }
}

/// The holder record of the ConfigMap (`cm: true`) or ExecutorSet `name`, as JSON.
fn holder(e: &Env, cm: bool, name: &str) -> Value {
    if cm {
        let (_, c) = e.admin("GET", &cm_path(e, name), None);
        (c["metadata"]["annotations"]["podalloc.io/holder"].as_str())
            .and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or(Value::Null)
    } else {
        let (_, o) = e.admin("GET", &es_path(e, name, ""), None);
        o["status"]["holder"].clone()
    }
}

/// A holder record of a `run` on another host, pid 4242, that answers within 5 s (as a loop
/// with `--interval 1s` writes it: 3 × 1 s + 2 s), renewed just now with a 90 s staleness
/// (as an older podalloc's loop with a 30 s idle interval wrote it): fresh for 90 s to a
/// podalloc that judged records by their age.
fn other_host() -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    json!({"command": "run", "host": "elsewhere", "pid": 4242,
           "since": "2026-01-01T00:00:00Z", "since_ms": 1, "answer_within_ms": 5000,
           "renewed_ms": now, "stale_after_s": 90})
}

/// Writes the home of kind `cm` (ConfigMap or ExecutorSet) `name` by hand, holding 2 as
/// target, with [`other_host`] as its holder: a loop killed on another host, never to answer.
fn home_held_elsewhere(e: &Env, cm: bool, name: &str) {
    if cm {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name,
                "labels": {"app.kubernetes.io/managed-by": "podalloc", "spark-app-selector": e.app},
                "annotations": {"podalloc.io/holder": other_host().to_string()}},
            "data": {}});
        let path = format!("/api/v1/namespaces/{}/configmaps", e.ns);
        let (code, b) = e.admin("POST", &path, Some(&body));
        assert_eq!(code, 201, "{b}");
    } else {
        let body = json!({"apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
            "metadata": {"name": name, "labels": {"spark-app-selector": e.app}},
            "spec": {"appId": e.app, "replicas": 2}});
        let path = format!(
            "/apis/podalloc.io/v1alpha1/namespaces/{}/executorsets",
            e.ns
        );
        let (code, mut o) = e.admin("POST", &path, Some(&body));
        assert_eq!(code, 201, "{o}");
        o["status"] = json!({"holder": other_host()});
        let (code, b) = e.admin("PUT", &es_path(e, name, "/status"), Some(&o));
        assert_eq!(code, 200, "{b}");
    }
}

/// Scales the app of `store` to 0 and stops its running executors, with one-shot ticks (the
/// ExecutorSet's `scale` writes its spec, which a tick follows) until none is live.
fn drain(e: &Env, store: &str) {
    e.ok(&["--state-store", store, "scale", "0"]);
    let end = Instant::now() + Duration::from_secs(30);
    while !e.live().is_empty() {
        assert!(Instant::now() < end, "still live: {:?}", e.live());
        e.ok(&["--scale-down-running", "--state-store", store, "reconcile"]);
        std::thread::sleep(Duration::from_millis(500));
    }
}

both!(
    a_holder_killed_on_another_host_is_taken_over_within_seconds,
    "elsewhere",
    Pods::default(),
    |e| {
        // Reported: after kill -9 of a `run` on another host, a new `run` on the ConfigMap
        // store waited until the record went stale (90 s); on the ExecutorSet store nothing
        // said who acts at all.
        for (cm, name, store) in homes(e, [true, false]) {
            home_held_elsewhere(e, cm, &name);
            let t0 = Instant::now();
            let run = start_a(e, &store, "2");
            let pid = u64::from(run.id());
            e.wait_for("the new loop's holder record", |e| {
                holder(e, cm, &name)["pid"].as_u64() == Some(pid)
            });
            timed(e, &store, "taken over", t0, Duration::from_secs(10), "");
            // Its own deadline covers a whole tick (3 × 1 s + 2 s + the tick budget, 4 ×
            // the default --request-timeout of 30 s): it answers only between ticks, and a
            // holder taken for dead inside a slow tick had its late create land after the
            // takeover (5 s: a removed executor came back).
            let mine = holder(e, cm, &name);
            assert_eq!(mine["answer_within_ms"], 125_000, "{mine}");
            assert!(mine["pid_ns"].is_string(), "{mine}");
            e.wait_for("2 executors", |e| e.live().len() == 2);
            let err = stop(run);
            assert!(err.contains("waiting as a standby"), "{err}");
            assert!(err.contains("did not answer"), "{err}");
            assert!(err.contains("host elsewhere, pid 4242"), "{err}");
            // Stopped cleanly: its record is given up.
            assert!(holder(e, cm, &name).is_null(), "{}", holder(e, cm, &name));
            drain(e, &store);
        }
    }
);

both!(
    reconcile_beside_a_live_run_exits_3_at_once,
    "beside",
    Pods::default(),
    |e| {
        // The holder record is not renewed: a one-shot command asks the holder whether it
        // lives; the live loop answers within its interval, the command exits 3 naming it
        // (before: exit 3 at once on the ConfigMap store, which judged the record by its
        // renewals; on the ExecutorSet store nothing stopped it).
        for (cm, name, store) in homes(e, [true, false]) {
            let run = start_a(e, &store, "1");
            e.wait_for("1 executor", |e| e.live().len() == 1);
            e.wait_for("the loop's record", |e| !holder(e, cm, &name).is_null());
            std::thread::sleep(Duration::from_secs(2));
            let t0 = Instant::now();
            let err = e.exits(&["--state-store", &store, "reconcile", "--target", "3"], 3);
            let what = "reconcile beside a live run exited 3";
            timed(e, &store, what, t0, Duration::from_secs(4), &err);
            assert!(err.contains("owned by a running loop"), "{err}");
            assert!(err.contains("answered a ping"), "{err}");
            assert!(err.contains(&format!("pid {}", run.id())), "{err}");
            assert_eq!(e.live().len(), 1, "the reconcile did nothing");
            stop(run);
            drain(e, &store);
        }
    }
);

both!(
    two_plain_runs_on_one_home_create_the_target_once,
    "twice",
    Pods::default(),
    |e| {
        // Reported: two plain `run`s on one ExecutorSet both acted (target 5, 8 creates).
        // The same on the ConfigMap store, and what the standby's asking costs at rest.
        for (_, name, store) in homes(e, [false, true]) {
            let ma = e.dir.path().join(format!("{name}-a.prom"));
            let mb = e.dir.path().join(format!("{name}-b.prom"));
            let args = ["--target", "5", "--interval", "1s"];
            let creates = e.stats().creates;
            let a = start(e, "a", &store, &ma, &args);
            let b = start(e, "b", &store, &mb, &args);
            e.wait_for("5 executors", |e| e.live().len() == 5);
            e.wait_for("a standby", |_| {
                [&ma, &mb]
                    .iter()
                    .any(|m| is_leader(m).as_deref() == Some("0"))
            });
            // A minute of the pair at rest: the standby asks about every 30 s (a ping and
            // its pong), and stays one.
            std::thread::sleep(Duration::from_secs(2));
            let from = e.server_now_us();
            std::thread::sleep(Duration::from_secs(60));
            let to = e.server_now_us();
            let writes: Vec<_> = (e.acts_with_subresources().into_iter())
                .filter(|x| (from..to).contains(&x.at_us))
                .filter(|x| !matches!(x.verb.as_str(), "get" | "list" | "watch"))
                .map(|x| (x.user, x.verb, x.resource, x.code))
                .collect();
            eprintln!(
                "{}: {store}: a standby pair at rest: {} writes in a minute: {writes:?}",
                server(e),
                writes.len()
            );
            assert!(writes.len() <= 6, "{writes:?}");
            assert_eq!(e.stats().creates - creates, 5, "exactly the target created");
            assert_eq!(e.live().len(), 5);
            let (ea, eb) = (stop(a), stop(b));
            let standbys = [&ea, &eb]
                .iter()
                .filter(|err| err.contains("waiting as a standby"))
                .count();
            assert_eq!(standbys, 1, "a:\n{ea}\nb:\n{eb}");
            drain(e, &store);
        }
    }
);

both!(
    a_forced_target_against_the_executorset_is_refused_before_waiting_as_a_standby,
    "forced",
    Pods::default(),
    |e| {
        // Reported: a standby started with --force-target waited quietly, then exited 2 at
        // the takeover it was there for (the first tick compared the targets), leaving its
        // new holder record behind.
        let store = "executorset:forced";
        let run = start_a(e, store, "2");
        e.wait_for("2 executors", |e| e.live().len() == 2);
        let t0 = Instant::now();
        let args = [
            "--state-store",
            store,
            "run",
            "--target",
            "4",
            "--force-target",
            "--timeout",
            "20s",
        ];
        let err = e.exits(&args, 2);
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert!(
            err.contains("--target 4 conflicts with the target of ExecutorSet forced, 2"),
            "{err}"
        );
        assert_eq!(
            holder(e, false, "forced")["pid"].as_u64(),
            Some(u64::from(run.id()))
        );
        stop(run);
        drain(e, store);
    }
);
