//! An app's one home, on both servers (`both!`): every command finds the app's
//! home in its namespace before it falls back to the state file; the ConfigMap store never
//! writes people's intent back, applies requests and annotation edits once and in the
//! order they were made, and lets seeds fill only an empty home; a killed loop's successor
//! waits as a standby instead of exiting 3. Each test plays one reported failure.

use crate::both::{both, Env, Pods, AT_REST};
use crate::util::{
    assert_contains_all, is_leader, spawn_replica, stderr, ticking, with_fast_leader_elect,
};
use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The state ConfigMap every test here uses.
const CM: &str = "home-state";
const STORE: &str = "configmap:home-state";

/// `run --leader-elect` as candidate `who` (`POD_NAME=pod-WHO`) on [`CM`], target `target`,
/// ticking every 200 ms at rest, on a 3 s Lease.
fn candidate(e: &Env, who: &str, target: &str) -> Child {
    let args = [
        "--state-store",
        STORE,
        "run",
        "--target",
        target,
        "--idle-interval",
        "200ms",
    ];
    let mut cmd = e.candidate_cmd(who, &with_fast_leader_elect(&args));
    spawn_replica(&mut cmd, &format!("pod-{who}"), Stdio::piped())
}

/// A plain `run` on [`CM`] (30 s at rest), with `extra` flags after `run`.
fn plain_run(e: &Env, extra: &[&str]) -> Child {
    let mut args = vec!["--state-store", STORE, "run"];
    args.extend_from_slice(extra);
    (e.cmd(&args).stdout(Stdio::null()).stderr(Stdio::piped()))
        .spawn()
        .unwrap()
}

/// [`plain_run`] at `--target` `n`, once its `n` executors are live (within 30 s).
fn plain_run_to(e: &Env, n: usize) -> Child {
    let run = plain_run(e, &["--target", &n.to_string()]);
    until_live(e, n, 30);
    run
}

fn signal(c: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(c.id() as i32, sig) }, 0);
}

/// SIGTERMs `c` and waits for it; it must exit 0. Returns its standard error.
fn stop(c: Child) -> String {
    signal(&c, libc::SIGTERM);
    let out = c.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    err
}

/// Kills `c` with SIGKILL and reaps it.
fn kill(mut c: Child) {
    signal(&c, libc::SIGKILL);
    let _ = c.wait();
}

/// The state ConfigMap (`Value::Null` while it does not exist).
fn configmap(e: &Env) -> Value {
    let path = format!("/api/v1/namespaces/{}/configmaps/{CM}", e.ns);
    match e.admin("GET", &path, None) {
        (200, cm) => cm,
        _ => Value::Null,
    }
}

/// The target the state ConfigMap's state holds.
fn cm_target(e: &Env) -> Option<u64> {
    let cm = configmap(e);
    let text = cm["data"]["state.json"].as_str()?;
    serde_json::from_str::<Value>(text).ok()?["target"].as_u64()
}

/// `kubectl annotate configmap home-state podalloc.io/executors=N --overwrite`, as a read
/// and a conditional update (a 409 read again).
fn annotate(e: &Env, n: u32) {
    let path = format!("/api/v1/namespaces/{}/configmaps/{CM}", e.ns);
    for _ in 0..10 {
        let mut cm = configmap(e);
        assert!(!cm.is_null(), "no ConfigMap {CM}");
        if !cm["metadata"]["annotations"].is_object() {
            cm["metadata"]["annotations"] = json!({});
        }
        cm["metadata"]["annotations"]["podalloc.io/executors"] = json!(n.to_string());
        match e.admin("PUT", &path, Some(&cm)) {
            (200, _) => return,
            (409, _) => continue,
            (code, out) => panic!("annotate: {code} {out}"),
        }
    }
    panic!("annotate: 409 ten times");
}

/// The annotation `podalloc.io/executors` of the state ConfigMap.
fn annotation(e: &Env) -> Option<String> {
    let cm = configmap(e);
    (cm["metadata"]["annotations"]["podalloc.io/executors"].as_str()).map(str::to_string)
}

/// Waits (at most `secs`) until exactly `n` executors are live.
fn until_live(e: &Env, n: usize, secs: u64) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if e.live().len() == n {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("never {n} live executors: {:?}", e.live());
}

/// Waits (at most 20 s) until the Lease `podalloc-<app>` has a holder.
fn until_leader(e: &Env) {
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/podalloc-{}",
        e.ns, e.app
    );
    e.wait_for("a leader", |e| {
        let (code, v) = e.admin("GET", &path, None);
        code == 200
            && v["spec"]["holderIdentity"]
                .as_str()
                .is_some_and(|h| !h.is_empty())
    });
}

both!(
    add_without_a_store_reaches_the_leader_s_configmap,
    "home-add",
    Pods::default(),
    |e| {
        // Reported: `add 2` without --state-store said "handed to the leader", exited 0 and
        // wrote a request file the leader never reads.
        let (a, b) = (candidate(e, "a", "3"), candidate(e, "b", "3"));
        until_leader(e);
        until_live(e, 3, 30);
        let err = e.ok(&["add", "2"]);
        assert!(err.contains("handed to"), "{err}");
        until_live(e, 5, 30);
        assert_eq!(cm_target(e), Some(5));
        let queue = e.dir.path().join("state.json.requests");
        assert!(!queue.exists(), "a request file was written: {queue:?}");
        stop(a);
        stop(b);
    }
);

both!(
    reconcile_and_a_plain_run_refuse_while_a_leader_holds_the_lease,
    "home-ha",
    Pods::default(),
    |e| {
        // Reported: `reconcile` without --state-store while an HA leader ran used an old
        // state file (and deleted Running executors); a plain `run` on the leader's
        // ConfigMap made both replicas exit 3.
        e.ok(&["reconcile", "--target", "1"]);
        assert!(
            e.dir.path().join("state.json").exists(),
            "the old state file"
        );
        let (a, b) = (candidate(e, "a", "4"), candidate(e, "b", "4"));
        until_leader(e);
        until_live(e, 4, 30);
        let before = e.live();
        let err = e.exits(&["reconcile", "--target", "1"], 3);
        assert!(err.contains("the leader pod-"), "{err}");
        let err = e.exits(&["--state-store", STORE, "reconcile"], 3);
        assert!(err.contains("the leader pod-"), "{err}");
        let out = plain_run(e, &["--target", "4", "--timeout", "10s"])
            .wait_with_output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(stderr(&out).contains("the leader pod-"), "{}", stderr(&out));
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(e.live(), before, "nothing deleted, nothing created");
        // The pair is still running and still steerable.
        e.ok(&["--state-store", STORE, "scale", "5"]);
        until_live(e, 5, 30);
        stop(a);
        stop(b);
    }
);

both!(
    an_annotation_edit_survives_a_sigterm_and_is_followed,
    "home-ann",
    Pods::default(),
    |e| {
        // Reported: `kubectl annotate configmap … podalloc.io/executors=5 --overwrite`, then
        // SIGTERM within seconds: the annotation read 3 again.
        let run = plain_run_to(e, 3);
        e.wait_for("the state saved", |e| cm_target(e) == Some(3));
        annotate(e, 5);
        stop(run);
        assert_eq!(annotation(e).as_deref(), Some("5"), "{}", configmap(e));
        converge(e, "3", "30s");
        assert_eq!(e.live().len(), 5);
        assert_eq!(cm_target(e), Some(5));
        assert_eq!(annotation(e).as_deref(), Some("5"));
        // An `add` then changes the target; the annotation, untouched, is not applied again.
        e.ok(&["--state-store", STORE, "add", "1"]);
        let err = converge(e, "3", "30s");
        assert_eq!(cm_target(e), Some(6), "{err}");
        assert_eq!(annotation(e).as_deref(), Some("5"));
    }
);

both!(
    requests_and_annotation_edits_apply_in_the_order_made,
    "home-order",
    Pods::default(),
    |e| {
        // Reported: an older queued `scale` overrode a newer annotation (and rewrote it).
        converge(e, "2", "30s");
        for (first_scale, then_annotation, want) in [(true, 4, 4), (false, 1, 3)] {
            // A loop holds the app, frozen (SIGSTOP): requests wait in the queue; the command
            // waits its answer deadline (3 × 1 s + 2 s + its tick budget, 4 × 1 s) for the
            // loop to take its request, then says it stays queued (exit 3).
            let run = plain_run(e, &["--interval", "1s", "--request-timeout", "1s"]);
            e.wait_for("the loop's holder record", |e| {
                !configmap(e)["metadata"]["annotations"]["podalloc.io/holder"].is_null()
            });
            signal(&run, libc::SIGSTOP);
            let queued = || {
                let err = e.exits(&["--state-store", STORE, "scale", "3"], 3);
                assert!(err.contains("handed to"), "{err}");
                assert!(err.contains("stays queued"), "{err}");
            };
            if first_scale {
                queued();
                annotate(e, then_annotation);
            } else {
                annotate(e, then_annotation);
                queued();
            }
            signal(&run, libc::SIGCONT);
            stop(run);
            converge(e, "2", "30s");
            assert_eq!(cm_target(e), Some(want), "{}", configmap(e));
            assert_eq!(
                annotation(e),
                Some(then_annotation.to_string()),
                "the annotation is people's: never rewritten"
            );
        }
    }
);

both!(
    an_add_before_the_first_leader_keeps_the_seed,
    "home-seed",
    Pods::default(),
    |e| {
        // Reported: an `add` made before the first leader acted was applied to an empty
        // store, and the `--target 4` seed was lost for good.
        let err = e.ok(&["--state-store", STORE, "add", "2"]);
        assert!(err.contains("no target yet"), "{err}");
        assert!(e.live().is_empty(), "{:?}", e.live());
        let a = candidate(e, "a", "4");
        until_live(e, 6, 30);
        assert_eq!(cm_target(e), Some(6));
        stop(a);
    }
);

both!(
    a_killed_loop_s_successor_waits_as_a_standby_and_takes_over,
    "home-kill",
    Pods::default(),
    |e| {
        // Reported: after kill -9, a new `run` on the ConfigMap store exited 3 ("owned by a
        // running loop … stale after 90s"): a Deployment crash-looped for 90 s.
        let first = plain_run_to(e, 2);
        let metrics = e.dir.path().join("second.prom");
        let m = metrics.to_str().unwrap();
        let mut args = vec!["--metrics-file", m, "--state-store", STORE, "run"];
        args.extend(ticking("2", "200ms"));
        let second = (e.cmd(&args).stdout(Stdio::null()).stderr(Stdio::piped()))
            .spawn()
            .unwrap();
        e.wait_for("the standby's metrics", |_| {
            is_leader(&metrics).as_deref() == Some("0")
        });
        kill(first);
        let t = Instant::now();
        e.wait_for("the standby taking over", |_| {
            is_leader(&metrics).as_deref() == Some("1")
        });
        let took = t.elapsed();
        assert!(took < Duration::from_secs(10), "took over after {took:?}");
        e.ok(&["--state-store", STORE, "scale", "3"]);
        until_live(e, 3, 30);
        let err = stop(second);
        assert!(err.contains("waiting as a standby"), "{err}");
        assert!(err.contains("process is gone"), "{err}");
        // Killed again and restarted at once: no exit 3, no wait for the record to go stale.
        let third = plain_run(e, &["--target", "3"]);
        e.wait_for("the third loop's holder record", |e| {
            let cm = configmap(e);
            let h = cm["metadata"]["annotations"]["podalloc.io/holder"].as_str();
            h.is_some_and(|h| h.contains(&format!("\"pid\":{}", third.id())))
        });
        kill(third);
        let t = Instant::now();
        converge(e, "3", "20s");
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }
);

both!(
    a_lost_answer_does_not_apply_an_add_twice,
    "home-lost",
    Pods::default(),
    |e| {
        // Reported: when the answer to the request's write was lost, the command retried, got
        // 409, appended the request again, and the owner applied both: `add 2` took the
        // target 2 -> 6.
        converge(e, "2", "30s");
        // A loop holds the app, frozen (SIGSTOP), so the request is seen queued: the command
        // waits the loop's answer deadline (3 × 1 s + 2 s + its tick budget, 4 × 1 s) for it
        // to be taken, then says it stays queued (exit 3).
        let run = plain_run(e, &["--interval", "1s", "--request-timeout", "1s"]);
        e.wait_for("the loop's holder record", |e| {
            !configmap(e)["metadata"]["annotations"]["podalloc.io/holder"].is_null()
        });
        signal(&run, libc::SIGSTOP);
        e.lose_next_write_answer("b");
        let out = (e.candidate_cmd("b", &["--state-store", STORE, "add", "2"]))
            .output()
            .unwrap();
        if e.control_plane().is_none() {
            e.sim_faults(&[]);
        }
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{err}");
        assert!(err.contains("handed to"), "{err}");
        assert!(err.contains("stays queued"), "{err}");
        // The server's record: the write carried out, its answer lost, the retry answered 409.
        let updates: Vec<u16> = (e.acts().into_iter())
            .filter(|a| a.user == "podalloc-b" && a.verb == "update" && a.resource == "configmaps")
            .map(|a| a.code)
            .collect();
        assert_eq!(updates.len(), 2, "{updates:?}: {err}");
        assert_eq!(updates[1], 409, "{updates:?}: {err}");
        assert!(err.contains("not queued twice"), "{err}");
        let cm = configmap(e);
        let queued: Vec<Value> =
            serde_json::from_str(cm["data"]["requests.json"].as_str().unwrap()).unwrap();
        assert_eq!(queued.len(), 1, "{cm}");
        signal(&run, libc::SIGCONT);
        stop(run);
        converge(e, "2", "30s");
        assert_eq!(cm_target(e), Some(4), "{}", configmap(e));
        assert_eq!(e.live().len(), 4);
    }
);

/// The requests of candidate `a` (user `podalloc-a`) the server received in `[from, to)`
/// ([`Env::server_now_us`]), as (verb, resource): kube-apiserver's audit log, the simulator's request log.
fn acts_of_a(e: &Env, from: u64, to: u64) -> Vec<(String, String)> {
    (e.acts_with_subresources().into_iter())
        .filter(|a| a.user == "podalloc-a" && (from..to).contains(&a.at_us))
        .map(|a| (a.verb, a.resource))
        .collect()
}

/// The state ConfigMap `name`'s state target and target annotation, read as the admin.
fn target_and_annotation(e: &Env, name: &str) -> (Option<u64>, Option<String>) {
    let path = format!("/api/v1/namespaces/{}/configmaps/{name}", e.ns);
    let (_, cm) = e.admin("GET", &path, None);
    let state = (cm["data"]["state.json"].as_str())
        .and_then(|t| serde_json::from_str::<Value>(t).ok())
        .and_then(|s| s["target"].as_u64());
    let ann = cm["metadata"]["annotations"]["podalloc.io/executors"].as_str();
    (state, ann.map(str::to_string))
}

/// `run --target TARGET --until-converged --timeout TIMEOUT` on [`STORE`], which must exit
/// 0: its standard error.
fn converge(e: &Env, target: &str, timeout: &str) -> String {
    let args = ["--state-store", STORE, "run", "--target", target];
    e.ok(&[&args[..], &["--until-converged", "--timeout", timeout]].concat())
}

/// Polls (every 20 ms, at most 10 s) until the loop has saved target `n` in ConfigMap
/// `name`; returns the time since `t0`.
fn followed(e: &Env, name: &str, n: u64, t0: Instant) -> Duration {
    let end = t0 + Duration::from_secs(10);
    while target_and_annotation(e, name).0 != Some(n) {
        assert!(Instant::now() < end, "target {n} never followed");
        std::thread::sleep(Duration::from_millis(20));
    }
    t0.elapsed()
}

/// Runs steering command `args` (`what`, for the log line), which must hand its request to
/// the loop, and checks that the loop saved target `n` in ConfigMap `name` within 2 s of the
/// command's end.
fn handed_and_followed(e: &Env, name: &str, (what, args): (&str, &[&str]), n: u64) {
    let t0 = Instant::now();
    let err = e.ok(args);
    assert!(err.contains("handed to"), "{err}");
    let queued = t0.elapsed();
    let took = followed(e, name, n, t0);
    eprintln!(
        "{what} followed in {} ms ({} ms after the command ended)",
        took.as_millis(),
        (took - queued).as_millis()
    );
    assert!(took - queued <= Duration::from_secs(2), "{took:?}");
}

both!(
    configmap_intent_is_followed_within_2s_at_rest_with_no_write,
    "home-rest",
    Pods::default(),
    |e| {
        // Reported: at rest the loop read the ConfigMap only every --idle-interval (30 s), so
        // `add`, `scale` and `kubectl annotate` took effect up to 30 s later.
        let name = "podalloc-home-rest";
        let store = format!("configmap:{name}");
        let args = [&["--state-store", store.as_str(), "run"][..], &AT_REST].concat();
        let run = (e.candidate_cmd("a", &args))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        until_live(e, 2, 30);
        followed(e, name, 2, Instant::now());
        std::thread::sleep(Duration::from_secs(3));
        // kubectl annotate, as the README says (a merge PATCH).
        let t0 = Instant::now();
        let out = (e.kubectl(true))
            .args(["annotate", "configmap", name, "podalloc.io/executors=3"])
            .arg("--overwrite")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let took = followed(e, name, 3, t0);
        eprintln!("kubectl annotate followed in {} ms", took.as_millis());
        assert!(took <= Duration::from_secs(2), "{took:?}");
        until_live(e, 3, 30);
        std::thread::sleep(Duration::from_secs(3));
        // `add` without --state-store finds the home and hands the request to the loop.
        handed_and_followed(e, name, ("add", &["add", "1"]), 4);
        until_live(e, 4, 30);
        std::thread::sleep(Duration::from_secs(3));
        handed_and_followed(
            e,
            name,
            ("scale", &["--state-store", &store, "scale", "5"]),
            5,
        );
        until_live(e, 5, 30);
        // A minute at rest: the pods listed at most twice, nothing written (the holder
        // record is written once, when the loop claims the ConfigMap, never renewed: it
        // wrote one every 45 s with a 30 s idle interval).
        std::thread::sleep(Duration::from_secs(3));
        let before = target_and_annotation(e, name);
        let from = e.server_now_us();
        std::thread::sleep(Duration::from_secs(60));
        let acts = acts_of_a(e, from, e.server_now_us());
        let count = |f: &dyn Fn(&str, &str) -> bool| acts.iter().filter(|(v, r)| f(v, r)).count();
        let lists = count(&|v, r| v == "list" && r == "pods");
        let writes = count(&|v, _| !matches!(v, "get" | "list" | "watch"));
        let reads = count(&|v, r| v == "get" && r == "configmaps");
        eprintln!(
            "a minute at rest: {lists} pod lists, {writes} writes, {reads} ConfigMap reads, \
             {} requests",
            acts.len()
        );
        assert!(lists <= 2, "{acts:?}");
        assert_eq!(writes, 0, "{acts:?}");
        assert!(
            reads >= 30,
            "the ConfigMap is read every --interval: {reads}"
        );
        assert_eq!(target_and_annotation(e, name), before);
        assert_eq!(before, (Some(5), Some("3".to_string())));
        stop(run);
    }
);

/// The annotation value the ConfigMap's record (`applied.json`) says was followed last.
fn applied_executors(e: &Env) -> Option<String> {
    let cm = configmap(e);
    let text = cm["data"]["applied.json"].as_str()?;
    let v: Value = serde_json::from_str(text).ok()?;
    v["executors"].as_str().map(str::to_string)
}

both!(
    a_second_annotation_edit_is_applied_once_and_later_requests_win,
    "home-twice",
    Pods {
        // Pending for the whole test: an excess is deleted, so a tick that lowers the
        // target also saves after its calls.
        startup_ms: 600_000,
        ..Pods::default()
    },
    |e| {
        // Reported: after a second `kubectl annotate … podalloc.io/executors=N --overwrite`,
        // applied.json kept the first value and the annotation was applied again at later
        // writes, undoing a later `scale` or `add`.
        let cm = ["--state-store", STORE];
        e.ok(&[&cm[..], &["reconcile", "--target", "5"]].concat());
        until_live(e, 5, 30);
        annotate(e, 5);
        e.ok(&[&cm[..], &["reconcile"]].concat());
        assert_eq!(
            applied_executors(e).as_deref(),
            Some("5"),
            "{}",
            configmap(e)
        );
        // The second edit, then a `scale` made after it: one tick applies both, in that
        // order, and deletes the excess pending pods.
        annotate(e, 7);
        e.ok(&[&cm[..], &["scale", "3"]].concat());
        assert_eq!(cm_target(e), Some(3), "{}", configmap(e));
        assert_eq!(
            applied_executors(e).as_deref(),
            Some("7"),
            "{}",
            configmap(e)
        );
        // Later ticks and writes leave the target at what the last action said.
        for _ in 0..2 {
            e.ok(&[&cm[..], &["reconcile"]].concat());
            assert_eq!(cm_target(e), Some(3), "{}", configmap(e));
        }
        e.ok(&[&cm[..], &["add", "1"]].concat());
        assert_eq!(cm_target(e), Some(4), "{}", configmap(e));
        e.ok(&[&cm[..], &["reconcile"]].concat());
        assert_eq!(cm_target(e), Some(4), "{}", configmap(e));
        assert_eq!(annotation(e).as_deref(), Some("7"), "never written back");
        assert_eq!(
            applied_executors(e).as_deref(),
            Some("7"),
            "{}",
            configmap(e)
        );
    }
);

/// Kills and reaps a child the test started, whatever happens to the test.
struct Reap(Option<Child>);

impl Reap {
    /// The child, no longer killed on drop.
    fn take(mut self) -> Child {
        self.0.take().expect("the child")
    }
}

impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The Lease `podalloc-<app>` of the test's namespace, read as the admin.
fn lease(e: &Env) -> Value {
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/podalloc-{}",
        e.ns, e.app
    );
    e.admin("GET", &path, None).1
}

both!(
    a_leftover_configmap_beside_a_leader_on_an_executorset_is_never_its_home,
    "home-lease",
    Pods::default(),
    |e| {
        // Reported: beside a leader on an ExecutorSet, `add 1 --state-store
        // configmap:podalloc-APP` (a leftover state ConfigMap) said "handed to the leader" and
        // wrote a home the leader never reads; a `run --leader-elect` naming it waited as a
        // standby and, after a failover, followed the leftover.
        let left = "configmap:podalloc-home-lease";
        e.ok(&["--state-store", left, "reconcile", "--target", "0"]);
        let cm_path = format!("/api/v1/namespaces/{}/configmaps/podalloc-home-lease", e.ns);
        let (code, before) = e.admin("GET", &cm_path, None);
        assert_eq!(code, 200, "the leftover ConfigMap: {before}");
        let es_args = [
            "--state-store",
            "executorset:home-lease",
            "run",
            "--target",
            "2",
            "--idle-interval",
            "200ms",
        ];
        let mut cmd = e.candidate_cmd("a", &with_fast_leader_elect(&es_args));
        let a = Reap(Some(spawn_replica(&mut cmd, "pod-a", Stdio::piped())));
        until_leader(e);
        until_live(e, 2, 30);
        let l = lease(e);
        assert_eq!(
            l["metadata"]["annotations"]["podalloc.io/home"], "executorset/home-lease",
            "{l}"
        );
        // A store other than the leader's: exit 2 naming both, nothing written.
        let err = e.exits(&["--state-store", left, "add", "1"], 2);
        let parts = [
            "the leader pod-a",
            "ExecutorSet home-lease",
            "ConfigMap podalloc-home-lease",
            "--state-store executorset:home-lease",
        ];
        assert_contains_all(&err, &parts);
        // A candidate naming the leftover: exit 2 at once, never a standby.
        let cm_args = ["--state-store", left, "run", "--target", "2"];
        let t = Instant::now();
        let out = (e.candidate_cmd("b", &with_fast_leader_elect(&cm_args)))
            .env("POD_NAME", "pod-b")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("ExecutorSet home-lease"),
            "{}",
            stderr(&out)
        );
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        // Without --state-store: the leader's home, one line naming the leftover.
        let err = e.ok(&["add", "1"]);
        assert!(err.contains("ExecutorSet home-lease"), "{err}");
        assert!(
            err.contains("ConfigMap podalloc-home-lease in namespace")
                && err.contains("not in use"),
            "{err}"
        );
        until_live(e, 3, 30);
        let (_, after) = e.admin("GET", &cm_path, None);
        assert_eq!(after["data"], before["data"], "the leftover untouched");
        let err = stop(a.take());
        assert!(err.contains("released lease"), "{err}");
    }
);

/// `MicroTime` of now moved by `secs` (negative: the past).
fn micro_time_from_now(secs: i64) -> String {
    let now = std::time::SystemTime::now();
    let d = Duration::from_secs(secs.unsigned_abs());
    let t = if secs < 0 { now - d } else { now + d };
    humantime::format_rfc3339_micros(t).to_string()
}

/// Writes the app's Lease as the admin: holder `holder`, a 2 s duration, `renewTime`
/// `renew` (created when missing, else read and replaced with its version).
fn write_lease(e: &Env, holder: &str, renew: &str) {
    let dir = format!("/apis/coordination.k8s.io/v1/namespaces/{}/leases", e.ns);
    let path = format!("{dir}/podalloc-{}", e.app);
    let spec = json!({"holderIdentity": holder, "leaseDurationSeconds": 2, "renewTime": renew});
    let (code, mut l) = e.admin("GET", &path, None);
    if code == 404 {
        let l = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                       "metadata": {"name": format!("podalloc-{}", e.app)}, "spec": spec});
        let (code, body) = e.admin("POST", &dir, Some(&l));
        assert_eq!(code, 201, "{body}");
        return;
    }
    l["spec"] = spec;
    let (code, body) = e.admin("PUT", &path, Some(&l));
    assert_eq!(code, 200, "{body}");
}

both!(
    a_lease_is_judged_live_by_its_changes_not_by_its_renew_time,
    "home-clock",
    Pods::default(),
    |e| {
        // Reported: commands judged the Lease's holder by its renewTime against their own
        // clock, so a leader whose clock runs behind was taken as gone while it renewed, and
        // a `reconcile` acted beside it.
        write_lease(e, "pod-behind", &micro_time_from_now(-3600));
        let stop = std::sync::atomic::AtomicBool::new(false);
        let err = std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(400));
                    write_lease(e, "pod-behind", &micro_time_from_now(-3600));
                }
            });
            let err = e.exits(&["reconcile", "--target", "1"], 3);
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            err
        });
        assert!(err.contains("the leader pod-behind"), "{err}");
        assert!(err.contains("watching it"), "{err}");
        assert!(e.live().is_empty(), "{:?}", e.live());
        // Nobody renews it now: taken as stopped once unchanged for its 2 s.
        let t = Instant::now();
        let err = e.ok(&["reconcile", "--target", "1"]);
        assert!(err.contains("taken as stopped"), "{err}");
        let took = t.elapsed();
        assert!(took >= Duration::from_secs(2), "{took:?}");
        assert_eq!(e.live().len(), 1);
        // A holder whose clock runs ahead: live at once, no watching.
        write_lease(e, "pod-ahead", &micro_time_from_now(3600));
        let err = e.exits(&["reconcile", "--target", "2"], 3);
        assert!(err.contains("the leader pod-ahead"), "{err}");
        assert!(!err.contains("watching"), "{err}");
        // Released (no holder): no leader, no wait.
        write_lease(e, "", &micro_time_from_now(0));
        let err = e.ok(&["reconcile"]);
        assert!(!err.contains("watching"), "{err}");
        eprintln!("home[{}]: a stale lease judged stopped in {took:?}", e.app);
    }
);

/// `run --leader-elect` as candidate `who` on ExecutorSet `home-first`, on an 8 s Lease
/// (renew deadline 5 s, retry period 1 s), killed on drop.
fn first_candidate(e: &Env, who: &str) -> Reap {
    let args = [
        "--state-store",
        "executorset:home-first",
        "run",
        "--target",
        "1",
        "--idle-interval",
        "200ms",
        "--leader-elect",
        "--leader-elect-lease-duration",
        "8s",
        "--leader-elect-renew-deadline",
        "5s",
        "--leader-elect-retry-period",
        "1s",
    ];
    let mut cmd = e.candidate_cmd(who, &args);
    Reap(Some(spawn_replica(
        &mut cmd,
        &format!("pod-{who}"),
        Stdio::piped(),
    )))
}

both!(
    the_first_leader_of_a_new_app_acts_at_once_and_a_deleted_lease_is_waited_out,
    "home-first",
    Pods::default(),
    |e| {
        // Reported: a `run --leader-elect` on a new app waited a lease duration (15 s by
        // default) before it created the Lease and acted; client-go creates it at once.
        let t = Instant::now();
        let a = first_candidate(e, "a");
        until_leader(e);
        let first = t.elapsed();
        until_live(e, 1, 30);
        assert!(first < Duration::from_secs(6), "led after {first:?}");
        let err = stop(a.take());
        assert!(err.contains("released lease"), "{err}");
        // The app's ExecutorSet exists now: a Lease missing beside it may have been deleted
        // under a running leader, so a new candidate creates it only after a lease duration.
        let path = format!(
            "/apis/coordination.k8s.io/v1/namespaces/{}/leases/podalloc-{}",
            e.ns, e.app
        );
        let (code, body) = e.admin("DELETE", &path, None);
        assert_eq!(code, 200, "{body}");
        let t = Instant::now();
        let b = first_candidate(e, "b");
        until_leader(e);
        let second = t.elapsed();
        assert!(second >= Duration::from_secs(8), "led after {second:?}");
        stop(b.take());
        eprintln!(
            "home[{}]: first leader of a new app after {first:?}; after a deleted lease beside its home {second:?}",
            e.app
        );
    }
);

/// Gives app `app` the home `store` (`reconcile --target 0` naming it), as the podalloc user.
fn give_home(e: &Env, app: &str, store: &str) {
    let mut c = e.connect(e.token());
    c.args(["--app-id", app, "--image", "img", "--state-store", store]);
    crate::util::exits(c.args(["reconcile", "--target", "0"]), 0);
}

/// The drivers `drv-APP` of apps `e.app` (annotated target 3), `disc-new` (2) and `disc-two`
/// (2), for `apps --discover spark-role=driver`.
fn annotated_drivers(e: &Env) {
    for (app, n) in [(e.app.as_str(), "3"), ("disc-new", "2"), ("disc-two", "2")] {
        e.create_pod(&json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("drv-{app}"),
                "labels": {"spark-role": "driver", "spark-app-selector": app},
                "annotations": {"podalloc.io/executors": n}},
            "spec": {"containers": [{"name": "driver", "image": "spark"}]}}));
    }
}

/// `apps --discover spark-role=driver`, a new app's state in the ConfigMap
/// `podalloc-state-<app id>`, the drivers listed every 200 ms.
fn discover(e: &Env) -> Reap {
    let mut c = e.connect(e.token());
    c.args(["--batch-delay", "200ms", "--image", "img", "apps"])
        .args(["--discover", "spark-role=driver", "--interval", "200ms"])
        .args(["--state-configmaps", "podalloc-state", "--timeout", "120s"]);
    Reap(Some(spawn_replica(&mut c, "pod-apps", Stdio::piped())))
}

/// Whether ConfigMap `name` exists in the test's namespace.
fn has_configmap(e: &Env, name: &str) -> bool {
    let path = format!("/api/v1/namespaces/{}/configmaps/{name}", e.ns);
    e.admin("GET", &path, None).0 == 200
}

both!(
    apps_discover_uses_an_app_s_home_and_refuses_an_app_with_two,
    "disc-home",
    Pods::default(),
    |e| {
        // Reported (a user trial): `apps --discover` made a state ConfigMap for an app beside
        // the ExecutorSet it already had, without a word; `status` then exited 2, "2 homes".
        e.ok(&[
            "--state-store",
            "executorset:disc-es",
            "reconcile",
            "--target",
            "1",
        ]);
        give_home(e, "disc-two", "configmap:disc-two-left");
        give_home(e, "disc-two", "executorset:disc-two-es");
        annotated_drivers(e);
        let apps = discover(e);
        let live = crate::leader::live_by_app;
        e.wait_for("the ExecutorSet's target 1 and disc-new's 2", |e| {
            let by = live(e);
            by.get(&e.app) == Some(&1) && by.get("disc-new") == Some(&2)
        });
        // Its driver's annotation edited: not applied (the ExecutorSet's spec is the app's
        // intent), one line; the app goes on following its ExecutorSet.
        let drv = format!("/api/v1/namespaces/{}/pods/drv-{}", e.ns, e.app);
        let edit = json!({"metadata": {"annotations": {"podalloc.io/executors": "4"}}});
        assert_eq!(e.admin("PATCH", &drv, Some(&edit)).0, 200);
        std::thread::sleep(Duration::from_secs(1));
        e.ok(&["scale", "2"]);
        e.wait_for("the ExecutorSet scaled to 2", |e| {
            live(e).get(&e.app) == Some(&2)
        });
        let err = stop(apps.take());
        let two = format!("app disc-two has 2 homes in namespace {}", e.ns);
        let parts = [
            "(ExecutorSet disc-two-es, ConfigMap disc-two-left)",
            &format!("`kubectl -n {} delete executorset disc-two-es`", e.ns),
            &format!("`kubectl -n {} delete configmap disc-two-left`", e.ns),
            "its home: ExecutorSet disc-es (the annotations only seed an empty spec.replicas)",
        ];
        assert_contains_all(&err, &parts);
        assert_eq!(err.matches(&two).count(), 1, "one line: {err}");
        let not_applied = "not applied: its home, ExecutorSet disc-es, holds its target";
        assert_eq!(err.matches(not_applied).count(), 1, "{err}");
        assert!(!err.contains("; stopped"), "{err}");
        // No second home; the app without one got discovery's own; the app with two: nothing.
        assert!(!has_configmap(e, "podalloc-state-disc-home"));
        assert!(!has_configmap(e, "podalloc-state-disc-two"));
        assert!(has_configmap(e, "podalloc-state-disc-new"));
        assert_eq!(live(e).get("disc-two"), None);
        let out = e.ok_out(&["status"]);
        assert!(out.contains("(home executorset:disc-es)"), "{out}");
    }
);
