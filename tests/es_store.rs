//! The ExecutorSet store (`--state-store executorset:NAME`, `docs/executorset.md`) on
//! kube-apiserver with the CRD of `deploy/crd.yaml`: created when missing, seeded by
//! `--target`; a restart with another `--target` changes nothing; `kubectl scale es` reaches a
//! loop at rest within 2 s with at most 2 pod lists a minute and no write; the target is
//! clamped by `spec.minReplicas`/`spec.maxReplicas`; `remove` applied once; the controller
//! never writes `spec` (the server's own record of requests: kube-apiserver's audit log, the
//! simulator's request log); two resource profiles of one app, an ExecutorSet each, scaled
//! on their own by `kubectl scale es` with one id counter. Each test runs on both servers
//! (`both!`).

use crate::both::{both, Env, Pods, AT_REST};
use crate::steer::Bg;
use crate::util::succeeded;
use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The ExecutorSet `name` of the test's namespace, read as the admin (`None`: 404).
fn es(e: &Env, name: &str) -> Option<Value> {
    let path = format!(
        "/apis/podalloc.io/v1alpha1/namespaces/{}/executorsets/{name}",
        e.ns
    );
    let (code, body) = e.admin("GET", &path, None);
    match code {
        404 => None,
        200 => Some(body),
        _ => panic!("GET {path}: {code} {body}"),
    }
}

/// Polls ExecutorSet `name` every 20 ms for up to 30 s until `f` holds; returns it.
fn wait_es(e: &Env, name: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(o) = es(e, name).filter(|o| f(o)) {
            return o;
        }
        assert!(
            Instant::now() < end,
            "timed out waiting for {what}: {:?}",
            es(e, name)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `kubectl ARGS` as the admin in the test's namespace; must succeed.
fn kubectl(e: &Env, args: &[&str]) -> String {
    let out = e.kubectl(true).args(args).output().unwrap();
    succeeded(&out, &format!("kubectl {args:?}"))
}

/// Starts `run` as candidate `a` (audited) on ExecutorSet `name`, with `args` after `run`.
fn start_run(e: &Env, name: &str, args: &[&str]) -> Child {
    let store = format!("executorset:{name}");
    let mut a = vec!["--state-store", store.as_str(), "run"];
    a.extend_from_slice(args);
    (e.candidate_cmd("a", &a))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// [`start_run`] at `--target` `target`, and of profile `p` (one container of `image`) at
/// `p_target`, every 300 ms; returns once profile `p`'s ExecutorSet converged, with it.
fn run_with_profile(
    e: &Env,
    name: &str,
    target: u32,
    (p, p_target, image): (u32, u32, &str),
) -> (Bg, Value) {
    let tpl = profile_template(e, p, image);
    let (target, profile_target) = (target.to_string(), format!("{p}={p_target}"));
    let args = [
        "--target",
        &target,
        "--profile-target",
        &profile_target,
        "--profile-template",
        &tpl,
        "--interval",
        "300ms",
    ];
    let run = Bg(Some(start_run(e, name, &args)));
    let what = format!("profile {p} at {p_target}");
    let rp = format!("{name}-rp{p}");
    let o = wait_es(e, &rp, &what, |o| converged(o, p_target.into()));
    (run, o)
}

/// SIGTERM, then its standard error; it must exit 0.
fn stop(mut c: Child) -> String {
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let _ = c.stdin.take();
    let out = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{err}");
    err
}

/// [`stop`] for a child in a [`Bg`].
fn stop_bg(mut run: Bg) -> String {
    stop(run.0.take().unwrap())
}

fn converged(o: &Value, n: u64) -> bool {
    let s = &o["status"];
    s["target"] == n && s["replicas"] == n && s["pending"] == 0 && s["unacknowledged"] == 0
}

/// The events of the test's namespace, as `kubectl get events -o json` has them.
fn events(e: &Env) -> Value {
    serde_json::from_str(&kubectl(e, &["get", "events", "-o", "json"])).unwrap()
}

/// How many of `events` are of `reason`.
fn of_reason(events: &Value, reason: &str) -> usize {
    (events["items"].as_array().unwrap().iter())
        .filter(|ev| ev["reason"] == reason)
        .count()
}

/// The server's record of the requests of `user` in the test's namespace, subresources
/// included: (verb, resource or `resource/subresource`, received µs).
fn audited(e: &Env, user: &str) -> Vec<(String, String, u64)> {
    (e.acts_with_subresources().into_iter())
        .filter(|a| a.user == user)
        .map(|a| (a.verb, a.resource, a.at_us))
        .collect()
}

/// Fails when the controller (user `podalloc-a`) wrote an ExecutorSet other than through
/// `/status`, or created more than one.
fn assert_never_wrote_spec(e: &Env) {
    let acts = audited(e, "podalloc-a");
    let es_writes: Vec<_> = (acts.iter())
        .filter(|(v, r, _)| r.starts_with("executorsets") && !matches!(v.as_str(), "get" | "list"))
        .collect();
    let bad: Vec<_> = (es_writes.iter())
        .filter(|(v, r, _)| !(v == "update" && r == "executorsets/status") && v != "create")
        .collect();
    assert!(bad.is_empty(), "the controller wrote the spec: {bad:?}");
    let creates = es_writes.iter().filter(|(v, _, _)| v == "create").count();
    assert!(creates <= 1, "{es_writes:?}");
}

/// Runs candidate `a` on `store` at `--target` `target` until converged, within 60 s; it
/// must succeed.
fn run_until_converged(e: &Env, store: &str, target: &str) {
    let out = e
        .candidate_cmd(
            "a",
            &[
                "--state-store",
                store,
                "run",
                "--target",
                target,
                "--until-converged",
                "--timeout",
                "60s",
            ],
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

both!(
    created_seeded_and_a_restart_with_another_target_changes_nothing,
    "seed",
    Pods::default(),
    |e| {
        let store = "executorset:seed-es";
        run_until_converged(e, store, "3");
        let o = wait_es(e, "seed-es", "3 running", |o| converged(o, 3));
        assert_eq!(o["spec"]["appId"], "seed");
        assert_eq!(o["spec"]["replicas"], 3);
        assert_eq!(o["metadata"]["labels"]["spark-app-selector"], "seed");
        assert_eq!(
            o["status"]["selector"],
            "spark-app-selector=seed,spark-role=executor"
        );
        assert_eq!(
            o["status"]["observedGeneration"],
            o["metadata"]["generation"]
        );
        assert!(o["status"]["allocator"]["last_executor_id"].as_u64() >= Some(3));
        run_until_converged(e, store, "5");
        let again = es(e, "seed-es").unwrap();
        assert_eq!(
            again["spec"]["replicas"], 3,
            "a seed only fills an empty home"
        );
        assert!(converged(&again, 3), "{again}");
        assert_eq!(e.live().len(), 3);
        // `kubectl get es` prints the columns; /scale reports the running count and selector.
        let table = kubectl(e, &["get", "es", "seed-es"]);
        assert!(
            table.contains("TARGET") && table.contains("RUNNING"),
            "{table}"
        );
        let path = format!(
            "/apis/podalloc.io/v1alpha1/namespaces/{}/executorsets/seed-es/scale",
            e.ns
        );
        let (code, scale) = e.admin("GET", &path, None);
        assert_eq!(code, 200, "{scale}");
        assert_eq!(scale["status"]["replicas"], 3);
        assert_eq!(
            scale["status"]["selector"],
            "spark-app-selector=seed,spark-role=executor"
        );
        // Another app's ExecutorSet is refused, naming both.
        let mut other = e.connect(&e.candidate_token("a"));
        other.args([
            "--app-id",
            "other",
            "--image",
            "img",
            "--state-store",
            store,
        ]);
        let err = crate::util::exits(other.args(["reconcile", "--target", "1"]), 2);
        assert!(
            err.contains("\"seed\"") && err.contains("\"other\""),
            "{err}"
        );
        assert_never_wrote_spec(e);
    }
);

both!(
    kubectl_scale_is_followed_within_2s_at_rest_and_rest_costs_no_write,
    "inst",
    Pods::default(),
    |e| {
        let run = start_run(e, "inst", &AT_REST);
        wait_es(e, "inst", "2 running", |o| converged(o, 2));
        std::thread::sleep(Duration::from_secs(3));
        let t0 = Instant::now();
        kubectl(e, &["scale", "es", "inst", "--replicas", "4"]);
        wait_es(e, "inst", "the new target", |o| o["status"]["target"] == 4);
        let followed = t0.elapsed();
        eprintln!("kubectl scale es followed in {} ms", followed.as_millis());
        assert!(followed <= Duration::from_secs(2), "{followed:?}");
        wait_es(e, "inst", "4 running", |o| converged(o, 4));
        // A minute at rest: the pods listed at most twice, nothing written.
        std::thread::sleep(Duration::from_secs(2));
        let from = e.server_now_us();
        std::thread::sleep(Duration::from_secs(60));
        let to = e.server_now_us();
        let acts: Vec<_> = (audited(e, "podalloc-a").into_iter())
            .filter(|(_, _, at)| (from..to).contains(at))
            .collect();
        let count =
            |f: &dyn Fn(&str, &str) -> bool| acts.iter().filter(|(v, r, _)| f(v, r)).count();
        let lists = count(&|v, r| v == "list" && r == "pods");
        let writes = count(&|v, _| !matches!(v, "get" | "list" | "watch"));
        let es_gets = count(&|v, r| matches!(v, "get" | "list") && r == "executorsets");
        eprintln!("a minute at rest: {lists} pod lists, {writes} writes, {es_gets} ExecutorSet reads, {} requests", acts.len());
        assert!(lists <= 2, "{acts:?}");
        assert_eq!(writes, 0, "{acts:?}");
        assert!(
            es_gets >= 30,
            "the spec is read every --interval: {es_gets}"
        );
        stop(run);
        assert_never_wrote_spec(e);
    }
);

both!(
    the_target_is_clamped_and_removals_are_applied_once,
    "clamp",
    Pods::default(),
    |e| {
        let spec = json!({"replicas": 2, "minReplicas": 1, "maxReplicas": 3});
        post_es(e, "clamp", json!({}), spec);
        let run = start_run(e, "clamp", &["--interval", "300ms"]);
        wait_es(e, "clamp", "2 running", |o| converged(o, 2));
        kubectl(e, &["scale", "es", "clamp", "--replicas", "10"]);
        let o = wait_es(e, "clamp", "the clamped target", |o| converged(o, 3));
        assert_eq!(o["spec"]["replicas"], 10, "the spec is the user's");
        let events = kubectl(
            e,
            &[
                "get",
                "events",
                "--field-selector",
                "reason=TargetClamped",
                "-o",
                "json",
            ],
        );
        let events: Value = serde_json::from_str(&events).unwrap();
        let posted: Vec<_> = (e.acts().into_iter())
            .filter(|a| a.resource == "events")
            .map(|a| (a.user, a.verb, a.code))
            .collect();
        assert_eq!(
            events["items"].as_array().map(Vec::len),
            Some(1),
            "{events}\nthe controller's Event requests: {posted:?}; all: {}",
            e.admin("GET", &format!("/api/v1/namespaces/{}/events", e.ns), None)
                .1
        );
        // `remove` lowers spec.replicas and appends the removal in one write; applied once.
        kubectl(e, &["scale", "es", "clamp", "--replicas", "3"]);
        let live = e.live();
        let victim = live[0].to_string();
        let store = "executorset:clamp";
        e.ok(&["--state-store", store, "remove", &victim]);
        let o = wait_es(e, "clamp", "the removal applied", |o| {
            o["status"]["appliedRemovals"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
                && converged(o, 2)
        });
        assert_eq!(o["spec"]["replicas"], 2);
        assert!(!e.live().contains(&live[0]));
        std::thread::sleep(Duration::from_secs(2));
        assert!(converged(&es(e, "clamp").unwrap(), 2));
        assert_eq!(e.stats().duplicate_executor_ids, 0);
        // `add` and `scale` write the spec, with the request id annotation.
        e.ok(&[
            "--state-store",
            store,
            "add",
            "1",
            "--wait",
            "--timeout",
            "30s",
        ]);
        let o = es(e, "clamp").unwrap();
        assert_eq!(o["spec"]["replicas"], 3);
        assert!(
            o["metadata"]["annotations"]["podalloc.io/request"].is_string(),
            "{o}"
        );
        assert!(converged(&o, 3), "{o}");
        stop(run);
        assert_never_wrote_spec(e);
    }
);

/// The live executor pods of the test's app: (executor id, resource profile label).
fn live_profiles(e: &Env) -> Vec<(u64, String)> {
    (e.pods().iter())
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Failed" | "Succeeded")))
        .map(|p| {
            let l = &p["metadata"]["labels"];
            let id = l["spark-exec-id"].as_str().unwrap().parse().unwrap();
            let profile = l["spark-exec-resourceprofile-id"].as_str().unwrap_or("0");
            (id, profile.to_string())
        })
        .collect()
}

/// How many live executors of profile `p`.
fn of_profile(live: &[(u64, String)], p: &str) -> usize {
    live.iter().filter(|(_, q)| q == p).count()
}

/// Fails unless, for each `(p, n)` of `want`, profile `p` has `n` live executors.
fn assert_live_of_profiles(e: &Env, want: &[(&str, usize)]) {
    let live = live_profiles(e);
    let got: Vec<_> = want
        .iter()
        .map(|&(p, _)| (p, of_profile(&live, p)))
        .collect();
    assert_eq!(got, want, "{live:?}");
}

both!(
    two_profiles_are_scaled_on_their_own_with_one_id_counter,
    "prof",
    Pods::default(),
    |e| {
        let (run, gpu) = run_with_profile(e, "prof", 2, (1, 1, "gpu:1"));
        let home = wait_es(e, "prof", "profile 0 at 2", |o| converged(o, 2));
        assert_eq!(gpu["spec"]["resourceProfile"], 1);
        assert_eq!(gpu["spec"]["appId"], "prof");
        assert_eq!(gpu["metadata"]["labels"]["spark-app-selector"], "prof");
        assert!(
            gpu["status"]["allocator"].is_null(),
            "the home holds the state"
        );
        assert_eq!(
            gpu["status"]["selector"],
            "spark-app-selector=prof,spark-role=executor,spark-exec-resourceprofile-id=1"
        );
        assert_eq!(
            home["status"]["selector"],
            "spark-app-selector=prof,spark-role=executor,spark-exec-resourceprofile-id notin (1)"
        );
        // The immutable profile (CEL on kube-apiserver, the simulator alike).
        let path = format!(
            "/apis/podalloc.io/v1alpha1/namespaces/{}/executorsets/prof-rp1",
            e.ns
        );
        let mut moved = gpu.clone();
        moved["spec"]["resourceProfile"] = json!(2);
        let (code, body) = e.admin("PUT", &path, Some(&moved));
        assert_eq!(code, 422, "{body}");
        assert!(
            body.to_string().contains("resourceProfile is immutable"),
            "{body}"
        );
        // Each shape through its own /scale: the GPU shape up, then the CPU shape up.
        kubectl(e, &["scale", "es", "prof-rp1", "--replicas", "3"]);
        wait_es(e, "prof-rp1", "profile 1 at 3", |o| converged(o, 3));
        assert!(converged(&es(e, "prof").unwrap(), 2), "profile 0 untouched");
        kubectl(e, &["scale", "es", "prof", "--replicas", "4"]);
        wait_es(e, "prof", "profile 0 at 4", |o| converged(o, 4));
        assert!(
            converged(&es(e, "prof-rp1").unwrap(), 3),
            "profile 1 untouched"
        );
        assert_live_of_profiles(e, &[("0", 4), ("1", 3)]);
        // The commands name a profile: add to profile 1, remove one of its executors.
        let store = "executorset:prof";
        let err = add_one_waiting(e, store, "1");
        // The loop holds the app through the home, profile 0's object (it said "no loop
        // holds it now" for profile 1).
        assert!(err.contains("its controller, "), "{err}");
        assert!(!err.contains("no loop holds it"), "{err}");
        let gpu = es(e, "prof-rp1").unwrap();
        assert!(converged(&gpu, 4), "{gpu}");
        let victim = (live_profiles(e).into_iter())
            .find(|(_, p)| p == "1")
            .unwrap()
            .0
            .to_string();
        let wrong = e.exits(&["--state-store", store, "remove", &victim], 2);
        assert!(wrong.contains("--profile"), "{wrong}");
        e.ok(&["--state-store", store, "remove", "--profile", "1", &victim]);
        wait_es(e, "prof-rp1", "the removal applied", |o| {
            o["status"]["appliedRemovals"]
                .as_array()
                .is_some_and(|a| a.len() == 1)
                && converged(o, 3)
        });
        assert!(converged(&es(e, "prof").unwrap(), 4));
        let status = e.ok_out(&["--state-store", store, "status", "-o", "json"]);
        let status: Value = serde_json::from_str(&status).unwrap();
        assert_eq!(status["profiles"]["0"]["target"], 4, "{status}");
        assert_eq!(status["profiles"]["1"]["running"], 3, "{status}");
        // The app's counts are totals, its target too (it was profile 0's: 4 of 7 running).
        assert_eq!(
            (&status["target"], &status["running"]),
            (&json!(7), &json!(7)),
            "{status}"
        );
        // Without --state-store the commands find the home: profile 1's ExecutorSet is part
        // of it, not a second home.
        let found = e.ok_out(&["status", "-o", "json"]);
        let found: Value = serde_json::from_str(&found).unwrap();
        assert_eq!(found["profiles"]["1"]["running"], 3, "{found}");
        assert_eq!(found["home"], "executorset:prof", "{found}");
        assert_one_id_counter(e, "prof", 7);
        stop_bg(run);
    }
);

/// One id counter: `n` live executors, no id twice, every pod's id below the counter of
/// the home, ExecutorSet `home`.
fn assert_one_id_counter(e: &Env, home: &str, n: usize) {
    let live = live_profiles(e);
    let mut ids: Vec<u64> = live.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n, "{live:?}");
    let last = es(e, home).unwrap()["status"]["allocator"]["last_executor_id"].clone();
    assert!(
        ids.iter().all(|&id| Some(id) <= last.as_u64()),
        "{last} {live:?}"
    );
    assert_eq!(e.stats().duplicate_executor_ids, 0);
}

/// `add --profile P 1 --wait` through `store`, within 30 s; its standard error.
fn add_one_waiting(e: &Env, store: &str, p: &str) -> String {
    let args = ["add", "--profile", p, "1", "--wait", "--timeout", "30s"];
    e.ok(&[&["--state-store", store][..], &args].concat())
}

/// Live executor ids of profile `p`, ascending.
fn ids_of(e: &Env, p: &str) -> Vec<u64> {
    let mut ids: Vec<u64> = (live_profiles(e).into_iter())
        .filter(|(_, q)| q == p)
        .map(|(id, _)| id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Writes removal `request` of executor `id` on ExecutorSet `name`, lowering its
/// spec.replicas to `replicas`, as the attack did (one merge patch, as the admin).
fn misfile(e: &Env, name: &str, request: &str, id: u64, replicas: u32) {
    let patch = json!({
        "metadata": {"annotations": {"podalloc.io/request": request}},
        "spec": {"replicas": replicas, "removals": [{"request": request, "executors": [id]}]},
    });
    let patch = patch.to_string();
    kubectl(e, &["patch", "es", name, "--type", "merge", "-p", &patch]);
}

both!(
    a_removal_written_to_another_profiles_executorset_is_refused,
    "misf",
    Pods::default(),
    |e| {
        // Attack H2: a removal on prof-rp1 naming profile 0's executor was applied: the
        // executor deleted, a profile-0 replacement created (the home's spec.replicas was not
        // lowered), profile 1's target lowered; the reverse alike.
        let (run, _) = run_with_profile(e, "misf", 2, (1, 2, "gpu:1"));
        wait_es(e, "misf", "profile 0 at 2", |o| converged(o, 2));
        let (zero, one) = (ids_of(e, "0"), ids_of(e, "1"));
        let applied = |request: &'static str| {
            move |o: &Value| {
                (o["status"]["appliedRemovals"].as_array())
                    .is_some_and(|a| a.iter().any(|r| r == request))
            }
        };
        misfile(e, "misf-rp1", "r-wrong-1", zero[0], 1);
        wait_es(e, "misf-rp1", "r-wrong-1 applied", applied("r-wrong-1"));
        misfile(e, "misf", "r-wrong-0", one[0], 1);
        wait_es(e, "misf", "r-wrong-0 applied", applied("r-wrong-0"));
        std::thread::sleep(Duration::from_secs(2));
        assert_eq!(ids_of(e, "0"), zero, "profile 0's executors untouched");
        assert_eq!(ids_of(e, "1"), one, "profile 1's executors untouched");
        let err = stop_bg(run);
        assert!(
            err.contains("its removal was written to profile 1's"),
            "{err}"
        );
        assert!(
            err.contains("its removal was written to profile 0's"),
            "{err}"
        );
        assert!(!err.contains(", removed)"), "{err}");
        let events = events(e);
        assert_eq!(of_reason(&events, "RemovalRefused"), 2, "{events}");
        assert_eq!(e.stats().duplicate_executor_ids, 0);
    }
);

/// Creates ExecutorSet `name` of the test's app at `spec.replicas` `n`, with an annotation of
/// people's that makes its writes larger than 1,000 bytes (what the real server's lost
/// answer needs: [`Env::lose_next_es_write_answer_then_hold`]).
fn create_es(e: &Env, name: &str, n: u32) {
    create_es_spec(e, name, json!({"replicas": n}));
}

/// [`create_es`] with `spec` (`spec.appId` added).
fn create_es_spec(e: &Env, name: &str, spec: Value) {
    let note = json!({"example.com/note": "x".repeat(1200)});
    post_es(e, name, json!({ "annotations": note }), spec);
}

/// Creates ExecutorSet `name` of the test's app as the admin: `spec` with `spec.appId`
/// added, and the fields of `meta` (labels, annotations) in its metadata.
fn post_es(e: &Env, name: &str, meta: Value, mut spec: Value) {
    spec["appId"] = json!(e.app);
    let mut metadata = json!({"name": name, "namespace": e.ns});
    for (k, v) in meta.as_object().unwrap() {
        metadata[k] = v.clone();
    }
    let manifest = json!({
        "apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
        "metadata": metadata, "spec": spec,
    });
    let path = format!(
        "/apis/podalloc.io/v1alpha1/namespaces/{}/executorsets",
        e.ns
    );
    let (code, body) = e.admin("POST", &path, Some(&manifest));
    assert_eq!(code, 201, "{body}");
}

/// A child's standard error once it exited; it must exit 0.
fn exited_ok(mut c: Bg) -> String {
    let out = c.0.take().unwrap().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(0), "{err}");
    err
}

both!(
    a_lost_answer_and_a_later_request_apply_each_request_once,
    "lost2",
    Pods::default(),
    |e| {
        // Reported: `add 1` whose answer was lost, then `add 10` by another process: 14, not
        // 13 (the retry found another request's id in the annotation and applied itself
        // again); `scale 5` whose answer was lost, then `scale 8`: ended at 5.
        create_es(e, "lost2", 3);
        let store = "executorset:lost2";
        let cases: [(&[&str], u64, &[&str], u64); 2] = [
            (&["add", "1"], 4, &["add", "10"], 14),
            (&["scale", "5"], 5, &["scale", "8"], 8),
        ];
        for (round, (mine, landed, other, want)) in cases.into_iter().enumerate() {
            kubectl(e, &["scale", "es", "lost2", "--replicas", "3"]);
            let from = e.server_now_us();
            e.lose_next_es_write_answer_then_hold("a", Duration::from_secs(4));
            let a = Bg(Some(
                e.candidate_cmd("a", &[&["--state-store", store][..], mine].concat())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap(),
            ));
            wait_es(e, "lost2", "the write whose answer is lost", |o| {
                o["spec"]["replicas"] == landed
            });
            // Its retry is under way, held back; another process's request lands first.
            std::thread::sleep(Duration::from_secs(1));
            e.ok(&[&["--state-store", store][..], other].concat());
            let err = exited_ok(a);
            if e.control_plane().is_none() {
                e.sim_faults(&[]);
            }
            let o = es(e, "lost2").unwrap();
            assert_eq!(
                o["spec"]["replicas"], want,
                "{mine:?} then {other:?}: {err}\n{o}"
            );
            // The server's record: the write carried out, its answer lost (the simulator
            // records that it sent none: 0), the retry 409.
            let updates: Vec<u16> = (e.acts_with_subresources().into_iter())
                .filter(|a| a.user == "podalloc-a" && a.at_us >= from)
                .filter(|a| a.verb == "update" && a.resource == "executorsets")
                .map(|a| a.code)
                .collect();
            assert!(matches!(updates[..], [0 | 200, 409]), "{updates:?}: {err}");
            let ids: Vec<String> = serde_json::from_str(
                o["metadata"]["annotations"]["podalloc.io/requests"]
                    .as_str()
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(
                ids.len(),
                2 * (round + 1),
                "the requests of both rounds: {o}"
            );
            assert_eq!(
                o["metadata"]["annotations"]["example.com/note"]
                    .as_str()
                    .map(str::len),
                Some(1200)
            );
        }
    }
);

both!(
    a_reconcile_target_other_than_the_executorsets_is_refused,
    "rtarget",
    Pods::default(),
    |e| {
        // Reported: `reconcile --target N` on an ExecutorSet home was silently ignored (the
        // home's spec.replicas is the target). Now: exit 2 naming both and the fix; the same
        // target, or none, is a plain reconcile.
        create_es(e, "rtarget", 2);
        let store = ["--state-store", "executorset:rtarget"];
        let err = e.exits(&[&store[..], &["reconcile", "--target", "5"]].concat(), 2);
        assert!(
            err.contains("--target 5 conflicts with the target of")
                && err.contains("rtarget")
                && err.contains("podalloc scale 5"),
            "{err}"
        );
        assert!(e.live().is_empty(), "nothing created: {:?}", e.live());
        assert_eq!(es(e, "rtarget").unwrap()["spec"]["replicas"], 2);
        e.ok(&[&store[..], &["reconcile", "--target", "2"]].concat());
        e.ok(&[&store[..], &["reconcile"]].concat());
        e.wait_for("2 executors", |e| e.live().len() == 2);
    }
);

/// The live executor ids of the test's app, sorted.
fn live_ids(e: &Env) -> Vec<u64> {
    let mut ids: Vec<u64> = live_profiles(e).into_iter().map(|(id, _)| id).collect();
    ids.sort_unstable();
    ids
}

/// Removes executor `id` through ExecutorSet `name` and waits until its controller applied
/// it and converged on `left`.
fn remove_one(e: &Env, name: &str, id: u64, left: u64) {
    e.ok(&[
        "--state-store",
        &format!("executorset:{name}"),
        "remove",
        &id.to_string(),
    ]);
    wait_es(e, name, "the removal applied", |o| converged(o, left));
    e.wait_for("the removed executor gone", |e| !live_ids(e).contains(&id));
}

both!(
    a_home_deleted_or_wiped_under_a_loop_never_reuses_an_id,
    "reuse",
    Pods::default(),
    |e| {
        // Reported: the id counter lives only in the status, so after `kubectl delete es` or
        // a wiped status.allocator a new home handed out ids again; the loop whose
        // ExecutorSet was deleted exited "no target".
        let run = Bg(Some(start_run(
            e,
            "reuse",
            &["--target", "3", "--interval", "300ms"],
        )));
        wait_es(e, "reuse", "3 running", |o| converged(o, 3));
        remove_one(e, "reuse", 3, 2);
        kubectl(e, &["delete", "es", "reuse"]);
        let o = wait_es(e, "reuse", "the home recreated", |o| {
            o["status"]["allocator"]["last_executor_id"].as_u64() >= Some(3)
        });
        assert_eq!(o["spec"]["replicas"], 2, "its last spec: {o}");
        kubectl(e, &["scale", "es", "reuse", "--replicas", "3"]);
        wait_es(e, "reuse", "3 running again", |o| converged(o, 3));
        assert_eq!(live_ids(e), [1, 2, 4], "id 3 is not handed out again");
        // A wiped status: the loop writes its last state back.
        remove_one(e, "reuse", 4, 2);
        // At rest first (ticks every --idle-interval, 30 s), so only the wipe can wake it.
        wait_es(e, "reuse", "2 running", |o| converged(o, 2));
        std::thread::sleep(Duration::from_secs(2));
        kubectl(
            e,
            &[
                "patch",
                "es",
                "reuse",
                "--subresource=status",
                "--type=json",
                "-p",
                r#"[{"op":"remove","path":"/status/allocator"}]"#,
            ],
        );
        // Restored within a few intervals with no spec change (the wipe bumps no
        // generation): a successor started now would find the counter (it waited for the
        // idle tick, 30 s, before: a kill then lost the ids of gone executors).
        let wiped = Instant::now();
        wait_es(e, "reuse", "the allocator state restored", |o| {
            o["status"]["allocator"]["last_executor_id"].as_u64() >= Some(4)
        });
        assert!(
            wiped.elapsed() < Duration::from_secs(10),
            "{:?}",
            wiped.elapsed()
        );
        kubectl(e, &["scale", "es", "reuse", "--replicas", "3"]);
        wait_es(e, "reuse", "3 running after the wipe", |o| converged(o, 3));
        assert_eq!(live_ids(e), [1, 2, 5], "id 4 is not handed out again");
        let err = stop_bg(run);
        assert!(err.contains("recreated from its last known spec"), "{err}");
        assert!(err.contains("status.allocator is gone"), "{err}");
        let events = events(e);
        let counts = ["Recreated", "StateRestored"].map(|r| of_reason(&events, r));
        assert_eq!(counts, [1, 1], "{events}");
        assert_eq!(e.stats().duplicate_executor_ids, 0);
    }
);

both!(
    remove_lowers_the_target_once_per_executor_that_counts,
    "rmc",
    Pods {
        stop_ms: 4000,
        ..Pods::default()
    },
    |e| {
        // Reported: `remove` on an ExecutorSet lowered spec.replicas by every id named, also
        // a duplicate, one gone or one already being deleted (the file store's step counts
        // only the executors that count, once); under a maxReplicas clamp it lowered
        // spec.replicas above the clamp, so the removed executor was replaced; `add` and
        // `scale` asked for a template though they only write spec.
        create_es_spec(e, "rmc", json!({"replicas": 10, "maxReplicas": 3}));
        let run = Bg(Some(start_run(e, "rmc", &["--interval", "300ms"])));
        wait_es(e, "rmc", "3 running (clamped)", |o| converged(o, 3));
        assert_eq!(live_ids(e), [1, 2, 3]);
        let store = "executorset:rmc";
        e.ok(&["--state-store", store, "remove", "2", "2"]);
        let o = es(e, "rmc").unwrap();
        assert_eq!(o["spec"]["replicas"], 2, "the clamped 3, less one: {o}");
        wait_es(e, "rmc", "2 running", |o| converged(o, 2));
        e.wait_for("executor 2 terminating", |e| {
            (e.pods().iter()).any(|p| {
                p["metadata"]["labels"]["spark-exec-id"] == "2"
                    && !p["metadata"]["deletionTimestamp"].is_null()
            })
        });
        e.ok(&["--state-store", store, "remove", "2"]);
        assert_eq!(
            es(e, "rmc").unwrap()["spec"]["replicas"],
            2,
            "being deleted"
        );
        e.wait_for("executor 2 gone", |e| {
            !(e.pods().iter()).any(|p| p["metadata"]["labels"]["spark-exec-id"] == "2")
        });
        e.ok(&["--state-store", store, "remove", "2"]);
        assert_eq!(es(e, "rmc").unwrap()["spec"]["replicas"], 2, "gone");
        std::thread::sleep(Duration::from_secs(1));
        let o = wait_es(e, "rmc", "still 2 running", |o| converged(o, 2));
        assert_eq!(live_ids(e), [1, 3], "nothing replaced: {o}");
        // `add` and `scale` without --image or --template: they write the spec only.
        for args in [["add", "1"], ["scale", "3"]] {
            let mut c = e.connect(&e.candidate_token("b"));
            c.args(["--app-id", &e.app, "--state-store", store])
                .args(args);
            crate::util::exits(&mut c, 0);
        }
        assert_eq!(es(e, "rmc").unwrap()["spec"]["replicas"], 3);
        wait_es(e, "rmc", "3 running", |o| converged(o, 3));
        assert_eq!(live_ids(e), [1, 3, 4]);
        stop_bg(run);
        assert_eq!(e.stats().duplicate_executor_ids, 0);
    }
);

both!(
    a_bad_template_edited_into_a_live_executorset_is_reported_and_the_loop_goes_on,
    "tpl",
    Pods::default(),
    |e| {
        // Reported: a spec.template edited into a live ExecutorSet that cannot be used ended
        // the run loop (exit 2).
        let template = |image: Option<&str>| {
            let mut c = json!({"name": "executor"});
            if let Some(i) = image {
                c["image"] = json!(i);
            }
            json!({"spec": {"containers": [c]}})
        };
        create_es_spec(
            e,
            "tpl",
            json!({"replicas": 1, "template": template(Some("good:1"))}),
        );
        let run = Bg(Some(start_run(e, "tpl", &["--interval", "300ms"])));
        wait_es(e, "tpl", "1 running", |o| converged(o, 1));
        let patch = |t: Value| {
            let p = json!({"spec": {"template": t}}).to_string();
            kubectl(e, &["patch", "es", "tpl", "--type=merge", "-p", &p]);
        };
        patch(template(None));
        let blocked = |o: &Value| o["status"]["conditions"][1]["reason"].clone();
        wait_es(e, "tpl", "the Blocked condition", |o| {
            blocked(o) == "TemplateRefused"
        });
        kubectl(e, &["scale", "es", "tpl", "--replicas", "2"]);
        wait_es(e, "tpl", "2 running on the last good template", |o| {
            converged(o, 2)
        });
        let images: Vec<Value> = (e.pods().iter())
            .map(|p| p["spec"]["containers"][0]["image"].clone())
            .collect();
        assert_eq!(images, [json!("good:1"), json!("good:1")]);
        let events = kubectl(
            e,
            &[
                "get",
                "events",
                "--field-selector",
                "reason=TemplateRefused",
                "-o",
                "json",
            ],
        );
        let events: Value = serde_json::from_str(&events).unwrap();
        assert_eq!(
            events["items"].as_array().map(Vec::len),
            Some(1),
            "{events}"
        );
        // Fixed: the condition clears, the loop never stopped.
        patch(template(Some("good:2")));
        wait_es(e, "tpl", "the condition cleared", |o| {
            blocked(o) == "NotBlocked"
        });
        let err = stop_bg(run);
        assert_eq!(err.matches("spec.template: ").count(), 1, "one line: {err}");
    }
);

/// Creates ExecutorSet `name` of the test's app with label `spark-app-selector` and `spec`.
fn create_labelled(e: &Env, name: &str, spec: Value) {
    let labels = json!({"spark-app-selector": e.app});
    post_es(e, name, json!({ "labels": labels }), spec);
}

both!(
    a_second_object_of_a_profile_is_ignored_with_one_warning_and_the_loop_goes_on,
    "dup",
    Pods::default(),
    |e| {
        // Reported: a copy of NAME-rp2 under another name (same appId and profile) made the
        // running loop exit 2, and `status` and `add` too.
        let (run, _) = run_with_profile(e, "dup", 1, (2, 1, "p2:1"));
        // A later creationTimestamp (seconds), a name that sorts first: the older is kept.
        std::thread::sleep(Duration::from_millis(1100));
        create_labelled(e, "dup-a", json!({"resourceProfile": 2, "replicas": 3}));
        std::thread::sleep(Duration::from_secs(1));
        kubectl(e, &["scale", "es", "dup-rp2", "--replicas", "2"]);
        wait_es(e, "dup-rp2", "profile 2 at 2", |o| converged(o, 2));
        assert_live_of_profiles(e, &[("0", 1), ("2", 2)]);
        let store = "executorset:dup";
        let status = e.run(&["--state-store", store, "status", "-o", "json"]);
        let err = String::from_utf8_lossy(&status.stderr).to_string();
        assert_eq!(status.status.code(), Some(0), "{err}");
        assert!(
            err.contains("dup-a also keeps resource profile 2") && err.contains("delete"),
            "{err}"
        );
        let status: Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(status["profiles"]["2"]["running"], 2, "{status}");
        let err = add_one_waiting(e, store, "2");
        assert!(err.contains("dup-a also keeps"), "{err}");
        assert_eq!(es(e, "dup-rp2").unwrap()["spec"]["replicas"], 3);
        assert_eq!(es(e, "dup-a").unwrap()["spec"]["replicas"], 3, "untouched");
        assert!(es(e, "dup-a").unwrap()["status"].is_null(), "not written");
        let events = kubectl(
            e,
            &[
                "get",
                "events",
                "--field-selector",
                "reason=DuplicateProfile",
                "-o",
                "json",
            ],
        );
        let events: Value = serde_json::from_str(&events).unwrap();
        let items = events["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{events}");
        assert_eq!(items[0]["involvedObject"]["name"], "dup-a", "{events}");
        let err = stop_bg(run);
        assert_eq!(err.matches("dup-a also keeps").count(), 1, "once: {err}");
    }
);

both!(
    a_profiles_executorset_deleted_under_a_loop_is_recreated_at_once_with_its_template,
    "recp",
    Pods::default(),
    |e| {
        // Attack H1/L5: a deleted NAME-rp1 came back only at the next save (over 11 s at
        // rest), quietly, without its spec.template: profile 1's new executors got profile
        // 0's shape (the Spark plugin never sends the template again).
        let template =
            |image: &str| json!({"spec": {"containers": [{"name": "executor", "image": image}]}});
        create_es_spec(
            e,
            "recp",
            json!({"replicas": 1, "template": template("cpu:1")}),
        );
        let gpu = json!({"resourceProfile": 1, "replicas": 1, "template": template("gpu:1")});
        create_labelled(e, "recp-rp1", gpu);
        let run = Bg(Some(start_run(e, "recp", &["--interval", "300ms"])));
        wait_es(e, "recp", "profile 0 at 1", |o| converged(o, 1));
        let before = wait_es(e, "recp-rp1", "profile 1 at 1", |o| converged(o, 1));
        // At rest (ticks every --idle-interval, 30 s), so only the deletion can wake it.
        std::thread::sleep(Duration::from_secs(2));
        kubectl(e, &["delete", "es", "recp-rp1"]);
        let deleted = Instant::now();
        let uid = before["metadata"]["uid"].clone();
        // Scaled at once: a scale racing the recreated object's first status write is seen
        // (that write's 409 retry adopted the new generation, so the loop missed it until
        // the idle tick, 30 s).
        let back = wait_es(e, "recp-rp1", "profile 1's object recreated", |o| {
            o["metadata"]["uid"] != uid
        });
        assert!(
            deleted.elapsed() < Duration::from_secs(5),
            "{:?}",
            deleted.elapsed()
        );
        assert_eq!(back["spec"]["template"], template("gpu:1"), "{back}");
        assert_eq!(back["spec"]["replicas"], 1, "{back}");
        assert_eq!(back["spec"]["resourceProfile"], 1, "{back}");
        kubectl(e, &["scale", "es", "recp-rp1", "--replicas", "2"]);
        let end = Instant::now() + Duration::from_secs(20);
        while !es(e, "recp-rp1").is_some_and(|o| converged(&o, 2)) {
            if Instant::now() > end {
                let err = stop_bg(run);
                panic!(
                    "profile 1 not at 2 within 20 s: {:?}\n{err}",
                    es(e, "recp-rp1")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let images: Vec<(String, Value)> = (e.pods().iter())
            .map(|p| {
                let l = &p["metadata"]["labels"]["spark-exec-resourceprofile-id"];
                let c = &p["spec"]["containers"][0]["image"];
                (l.as_str().unwrap_or("0").to_string(), c.clone())
            })
            .collect();
        let gpus = images.iter().filter(|(l, _)| l == "1");
        assert!(gpus.clone().count() == 2, "{images:?}");
        assert!(gpus.into_iter().all(|(_, i)| i == "gpu:1"), "{images:?}");
        let err = stop_bg(run);
        assert!(err.contains("(resource profile 1) was deleted"), "{err}");
        assert!(err.contains("its spec.template"), "{err}");
        let events = events(e);
        assert_eq!(of_reason(&events, "Recreated"), 1, "{events}");
        assert_eq!(e.stats().duplicate_executor_ids, 0);
    }
);

/// Writes a pod template of one container `executor` with `image` into the directory, for
/// `--profile-template`: returns `P=PATH`.
fn profile_template(e: &Env, p: u32, image: &str) -> String {
    let path = e.dir.path().join(format!("profile-{p}.yaml"));
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: executor\n    image: {image}\n"
    );
    std::fs::write(&path, yaml).unwrap();
    format!("{p}={}", path.display())
}

/// The images of the live executor pods of profile `p`.
fn images_of_profile(e: &Env, p: &str) -> Vec<String> {
    (e.pods().iter())
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Failed" | "Succeeded")))
        .filter(|pod| {
            pod["metadata"]["labels"]["spark-exec-resourceprofile-id"]
                .as_str()
                .unwrap_or("0")
                == p
        })
        .map(|p| {
            p["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

both!(
    a_profile_keeps_its_template_across_a_restart_and_never_takes_profile_0s,
    "seedt",
    Pods::default(),
    |e| {
        // Reported: NAME-rp1 created by `run --profile-template 1=FILE` did not carry the
        // template; restarted without the flag, `kubectl scale es NAME-rp1` created profile
        // 1's pods with profile 0's shape, silently.
        let (run, gpu) = run_with_profile(e, "seedt", 1, (1, 1, "gpu:1"));
        assert_eq!(
            gpu["spec"]["template"]["spec"]["containers"][0]["image"], "gpu:1",
            "{gpu}"
        );
        stop_bg(run);
        let run = Bg(Some(start_run(e, "seedt", &["--interval", "300ms"])));
        kubectl(e, &["scale", "es", "seedt-rp1", "--replicas", "2"]);
        wait_es(e, "seedt-rp1", "profile 1 at 2", |o| converged(o, 2));
        assert_eq!(images_of_profile(e, "1"), ["gpu:1", "gpu:1"]);
        assert_eq!(images_of_profile(e, "0"), ["img"]);
        // A profile with no template at all gets none of profile 0's: nothing is created.
        create_labelled(e, "seedt-two", json!({"resourceProfile": 2, "replicas": 1}));
        std::thread::sleep(Duration::from_secs(3));
        assert!(images_of_profile(e, "2").is_empty(), "{:?}", e.pods());
        let err = stop_bg(run);
        assert!(
            err.contains("profile 2 has no pod template") && err.contains("--profile-template 2="),
            "{err}"
        );
    }
);
