//! Highly available `run`: several `run --leader-elect` processes on one app, against the
//! simulator's Leases. Each process has its own bearer token, so the simulator's request log
//! names the process behind every request. Short durations: lease 3 s, renew deadline 2 s,
//! retry period 500 ms.
//!
//! What is checked: exactly one process ticks at any time (the pod lists and writes of the
//! processes form disjoint, ordered intervals in the request log); a SIGTERM hands over
//! within about one retry period (the leader releases the Lease); a SIGKILL within lease
//! duration + retry period; a leader cut off from the API stops acting before its lease can
//! expire; no overshoot and no duplicate executor id through any of it.

use crate::util::{agent, stderr, SimWorld, World, FAST_LEADER_ELECT};
use serde_json::{json, Value};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const APP: &str = "ha";
const LEASE: &str = "podalloc-ha";
const TARGET: u64 = 4;

fn world() -> World {
    let users = ["a", "b", "c"]
        .iter()
        .map(|u| (format!("token-{u}-0123456789"), format!("user-{u}")))
        .collect();
    SimWorld::new()
        .app(APP)
        .batch_delay("200ms")
        .no_state_file()
        .options(|o| o.users = users)
        .start()
}

/// `run --leader-elect` as process `who` (`POD_NAME=pod-WHO`, token `token-WHO-…`).
fn candidate(w: &World, who: &str) -> Child {
    candidate_with(w, who, &[])
}

/// [`candidate`] with extra environment variables (the pause hook).
fn candidate_with(w: &World, who: &str, env: &[(&str, &str)]) -> Child {
    let metrics = metrics_path(w, who);
    w.cmd_as(
        &format!("token-{who}-0123456789"),
        &[
            "--metrics-file",
            metrics.to_str().unwrap(),
            "--state-store",
            "configmap:ha-state",
            "run",
            "--target",
            &TARGET.to_string(),
            // At rest too, a tick every batch delay: the hand-over tests time replacements.
            "--idle-interval",
            "200ms",
        ]
        .iter()
        .chain(&FAST_LEADER_ELECT)
        .copied()
        .collect::<Vec<_>>(),
    )
    .env("POD_NAME", format!("pod-{who}"))
    .envs(env.iter().copied())
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

fn metrics_path(w: &World, who: &str) -> std::path::PathBuf {
    w.path(&format!("metrics-{who}.prom"))
}

/// The value of metric `name` in process `who`'s metrics file.
fn metric(w: &World, who: &str, name: &str) -> Option<String> {
    let text = std::fs::read_to_string(metrics_path(w, who)).ok()?;
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .map(str::to_string)
}

/// The Lease's holder (`None`: no Lease).
fn holder(w: &World) -> Option<String> {
    let (code, v) = w.api(
        "GET",
        &format!("/apis/coordination.k8s.io/v1/namespaces/default/leases/{LEASE}"),
        None,
    );
    (code == 200).then(|| {
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string()
    })
}

/// Polls until `f` holds, at most `secs`; returns how long it took.
fn until(secs: u64, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(secs), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    t.elapsed()
}

fn signal(c: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(c.id() as i32, sig) }, 0);
}

/// The request log's lines.
fn log(w: &World) -> Vec<Value> {
    w.sim
        .request_log()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A candidate's tick request (pods and the state ConfigMap), carried out (not the 504 of
/// a cut).
fn acting(l: &Value, writes_only: bool) -> bool {
    let path = l["path"].as_str().unwrap_or("");
    let method = l["method"].as_str().unwrap_or("");
    let tick = path.contains("/pods") || path.contains("/configmaps");
    // The test's own calls authenticate with the world's token, not as a candidate.
    let candidate = l["user"].as_str().is_some_and(|u| u.starts_with("user-"));
    candidate && tick && l["status"] != 504 && !(writes_only && method == "GET")
}

/// Each user's first and last acting request (ms), in the order they first acted.
fn terms(lines: &[Value], writes_only: bool) -> Vec<(String, u64, u64)> {
    let mut out: Vec<(String, u64, u64)> = Vec::new();
    for l in lines.iter().filter(|l| acting(l, writes_only)) {
        let user = l["user"].as_str().unwrap_or("?").to_string();
        let ms = l["ms"].as_u64().unwrap();
        match out.iter_mut().find(|t| t.0 == user) {
            Some(t) => t.2 = ms,
            None => out.push((user, ms, ms)),
        }
    }
    out
}

/// The terms do not overlap: each user's last acting request comes before the next user's
/// first.
fn assert_disjoint(terms: &[(String, u64, u64)]) {
    for pair in terms.windows(2) {
        assert!(
            pair[0].2 < pair[1].1,
            "{} acted until {} ms, {} from {} ms: overlap",
            pair[0].0,
            pair[0].2,
            pair[1].0,
            pair[1].1
        );
    }
}

fn fail_pod(w: &World, id: u64) {
    let (code, body) = w.api(
        "POST",
        &format!("/sim/pods/default/{APP}-exec-{id}/phase"),
        Some(&json!({"phase": "Failed", "exitCode": 137, "reason": "OOMKilled"})),
    );
    assert_eq!(code, 200, "{body}");
}

fn assert_no_overshoot(w: &World) {
    let s = w.sim.stats();
    assert_eq!(s.duplicate_executor_ids, 0);
    assert!(w.max_live() <= TARGET, "max live {}", w.max_live());
}

#[test]
fn one_leader_acts_and_sigterm_then_sigkill_hand_over() {
    let w = world();
    let a = candidate(&w, "a");
    until(10, "a leads", || holder(&w).as_deref() == Some("pod-a"));
    until(10, "a converges", || w.live().len() as u64 == TARGET);
    let mut b = candidate(&w, "b");
    std::thread::sleep(Duration::from_millis(1500));
    // The standby only ever touched the Lease.
    let b_calls: Vec<Value> = log(&w)
        .into_iter()
        .filter(|l| l["user"] == "user-b")
        .collect();
    assert!(!b_calls.is_empty());
    assert!(
        b_calls
            .iter()
            .all(|l| l["path"].as_str().unwrap().contains("/leases/")),
        "{b_calls:?}"
    );
    assert_eq!(holder(&w).as_deref(), Some("pod-a"));
    assert_eq!(metric(&w, "a", "podalloc_is_leader").as_deref(), Some("1"));
    assert_eq!(metric(&w, "b", "podalloc_is_leader").as_deref(), Some("0"));
    assert_eq!(
        metric(&w, "b", "podalloc_leader_transitions_total").as_deref(),
        Some("0")
    );

    // SIGTERM: a finishes its tick, releases the Lease, exits 0; b takes over within one
    // retry period (plus client-go's jitter of up to 1.2 periods while standing by).
    signal(&a, libc::SIGTERM);
    let took = until(5, "b leads after SIGTERM", || {
        holder(&w).as_deref() == Some("pod-b")
    });
    let out = a.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("released lease podalloc-ha"), "{err}");
    assert!(err.contains("pod-a became the leader"), "{err}");
    eprintln!("leader: SIGTERM handover took {:.2}s", took.as_secs_f64());
    assert!(took < Duration::from_millis(2500), "{took:?}");

    // b acts: a failed executor is replaced by b.
    fail_pod(&w, 2);
    until(5, "b's metrics say it leads", || {
        metric(&w, "b", "podalloc_is_leader").as_deref() == Some("1")
    });
    assert_eq!(
        metric(&w, "b", "podalloc_leader_transitions_total").as_deref(),
        Some("1")
    );
    until(10, "b replaces executor 2", || {
        let live = w.live();
        live.len() as u64 == TARGET && !live.contains(&2)
    });

    // SIGKILL: no release; c takes over once the Lease has not changed for its duration.
    let c = candidate(&w, "c");
    std::thread::sleep(Duration::from_millis(700));
    signal(&b, libc::SIGKILL);
    let killed = Instant::now();
    until(10, "c leads after SIGKILL", || {
        holder(&w).as_deref() == Some("pod-c")
    });
    let took = killed.elapsed();
    eprintln!("leader: SIGKILL handover took {:.2}s", took.as_secs_f64());
    assert!(took < Duration::from_millis(3000 + 1100 + 1500), "{took:?}");
    let _ = b.wait();
    fail_pod(&w, 3);
    until(10, "c replaces executor 3", || {
        let live = w.live();
        live.len() as u64 == TARGET && !live.contains(&3)
    });
    signal(&c, libc::SIGTERM);
    let out = c.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let t = terms(&log(&w), false);
    let users: Vec<&str> = t.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(users, ["user-a", "user-b", "user-c"], "{t:?}");
    assert_disjoint(&t);
    assert_no_overshoot(&w);
    // Pod creates: each term's creates come from its own leader only.
    let creates: Vec<String> = log(&w)
        .iter()
        .filter(|l| l["method"] == "POST" && l["path"].as_str().unwrap().ends_with("/pods"))
        .map(|l| l["user"].as_str().unwrap().to_string())
        .collect();
    assert!(
        creates.starts_with(&vec!["user-a".to_string(); TARGET as usize]),
        "{creates:?}"
    );
    assert!(creates.contains(&"user-b".to_string()) && creates.contains(&"user-c".to_string()));
    let (_, status) = w.api("GET", "/api/v1/namespaces/default/pods", None);
    assert!(status["items"].is_array());
}

#[test]
fn a_leader_cut_off_from_the_api_stops_acting_before_its_lease_expires() {
    let w = world();
    let mut a = candidate(&w, "a");
    until(10, "a leads", || holder(&w).as_deref() == Some("pod-a"));
    until(10, "a converges", || w.live().len() as u64 == TARGET);
    let mut b = candidate(&w, "b");
    std::thread::sleep(Duration::from_millis(800));
    let cut = Instant::now();
    w.sim.cut_off("user-a", Duration::from_secs(6));
    // b may take the Lease only 3 s after a's last renewal, which a cannot make now.
    let took = until(10, "b leads while a is cut off", || {
        holder(&w).as_deref() == Some("pod-b")
    });
    eprintln!(
        "leader: takeover from a cut-off leader after {:.2}s",
        took.as_secs_f64()
    );
    assert!(took >= Duration::from_millis(2000), "{took:?}");
    // b acts while a is cut off, and again after the cut ended.
    fail_pod(&w, 1);
    until(10, "b replaces executor 1", || {
        let live = w.live();
        live.len() as u64 == TARGET && !live.contains(&1)
    });
    let rest = Duration::from_secs(6).saturating_sub(cut.elapsed());
    std::thread::sleep(rest + Duration::from_millis(1500));
    fail_pod(&w, 2);
    until(10, "b replaces executor 2", || {
        let live = w.live();
        live.len() as u64 == TARGET && !live.contains(&2)
    });
    assert_eq!(
        holder(&w).as_deref(),
        Some("pod-b"),
        "a did not take it back"
    );
    // a stood down: became leader, then stopped (2 transitions); `status` names b.
    until(5, "a's metrics say it stood down", || {
        metric(&w, "a", "podalloc_is_leader").as_deref() == Some("0")
    });
    assert_eq!(
        metric(&w, "a", "podalloc_leader_transitions_total").as_deref(),
        Some("2")
    );
    let st = w.ok(&["--state-store", "configmap:ha-state", "status"]);
    let text = crate::util::stdout(&st);
    assert!(
        text.contains("leader: pod-b (lease podalloc-ha, renewed 20"),
        "{text}"
    );
    let st = w.ok(&[
        "--state-store",
        "configmap:ha-state",
        "status",
        "-o",
        "json",
    ]);
    let v: Value = serde_json::from_slice(&st.stdout).unwrap();
    assert_eq!(v["leader"]["holder"], "pod-b");
    assert_eq!(v["leader"]["transitions"], 1);
    for p in [&mut a, &mut b] {
        signal(p, libc::SIGTERM);
    }
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let a_err = stderr(&a);
    assert!(
        a_err.contains("could not renew the lease within the renew deadline; stopped acting"),
        "{a_err}"
    );
    assert_eq!(a.status.code(), Some(0), "{a_err}");
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    // Writes (pods and the state ConfigMap) carried out by a all come before b's first.
    let t = terms(&log(&w), true);
    eprintln!("leader: writes of each term (user, first ms, last ms): {t:?}");
    let users: Vec<&str> = t.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(users, ["user-a", "user-b"], "{t:?}");
    assert_disjoint(&t);
    assert_no_overshoot(&w);
}

#[test]
fn leader_election_flags_are_validated_as_client_go_does() {
    let w = SimWorld::new().start();
    let bad = |extra: &[&str], want: &str| {
        let mut args = vec!["run", "--target", "1", "--leader-elect"];
        args.extend_from_slice(extra);
        let out = w.run(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(want), "{extra:?}: {}", stderr(&out));
    };
    bad(
        &["--leader-elect-lease-duration", "10s"],
        "--leader-elect-lease-duration (10s, in whole seconds) must be greater than --leader-elect-renew-deadline (10s)",
    );
    bad(
        &[
            "--leader-elect-renew-deadline",
            "2s",
            "--leader-elect-retry-period",
            "2s",
        ],
        "must be greater than --leader-elect-retry-period (2s) × 1.2",
    );
    bad(
        &["--leader-elect-resource-name", "Not_A_Name"],
        "is not a valid Lease name",
    );
    assert_eq!(w.sim.stats().requests, 0, "nothing was sent");
}

#[test]
fn the_simulator_serves_leases_with_optimistic_concurrency() {
    let w = SimWorld::new().start();
    let http = agent(w.sim.ca_pem().unwrap().as_bytes());
    let url = format!(
        "{}/apis/coordination.k8s.io/v1/namespaces/default/leases",
        w.sim.url()
    );
    let auth = format!("Bearer {}", w.token);
    let send = |method: &str, url: &str, body: Option<Value>| -> (u16, Value) {
        let b = ureq::http::Request::builder()
            .method(method)
            .uri(url)
            .header("Authorization", &auth)
            .header("Content-Type", "application/json");
        let mut resp = match body {
            Some(v) => http.run(b.body(v.to_string()).unwrap()),
            None => http.run(b.body(()).unwrap()),
        }
        .unwrap();
        let code = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        (code, serde_json::from_str(&text).unwrap_or(Value::Null))
    };
    let lease = |holder: &str, rv: Option<&str>| {
        let mut l = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 0}});
        if let Some(rv) = rv {
            l["metadata"]["resourceVersion"] = json!(rv);
        }
        l
    };
    let (code, created) = send("POST", &url, Some(lease("a", None)));
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["kind"], "Lease");
    let rv = created["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, st) = send("POST", &url, Some(lease("b", None)));
    assert_eq!(code, 409);
    assert_eq!(st["reason"], "AlreadyExists");
    assert_eq!(
        st["message"],
        "leases.coordination.k8s.io \"l\" already exists"
    );
    assert_eq!(st["details"]["group"], "coordination.k8s.io");
    let one = format!("{url}/l");
    let (code, updated) = send("PUT", &one, Some(lease("a", Some(&rv))));
    assert_eq!(code, 200, "{updated}");
    let (code, updated) = send("PUT", &one, Some(lease("b", Some(&rv))));
    assert_eq!(code, 200, "a changed spec writes a new version: {updated}");
    let (code, st) = send("PUT", &one, Some(lease("c", Some(&rv))));
    assert_eq!(code, 409);
    assert_eq!(st["reason"], "Conflict");
    assert_eq!(
        st["message"],
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"l\": the object has been modified; please apply your changes to the latest version and try again"
    );
    let (code, got) = send("GET", &one, None);
    assert_eq!(
        (code, got["spec"]["holderIdentity"].clone()),
        (200, json!("b"))
    );
    let (code, st) = send(
        "PUT",
        &one,
        Some(json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0}})),
    );
    assert_eq!(code, 422, "{st}");
    let (code, _) = send("DELETE", &one, None);
    assert_eq!(code, 200);
    let (code, st) = send("GET", &one, None);
    assert_eq!(code, 404);
    assert_eq!(st["message"], "leases.coordination.k8s.io \"l\" not found");
    // A partition: the user's calls hang until the cut ends, then 504, not carried out.
    let (code, _) = w.api(
        "POST",
        "/sim/cut",
        Some(&json!({"user": "system:serviceaccount:default:podalloc", "seconds": 0.5})),
    );
    assert_eq!(code, 200);
    let t = Instant::now();
    let (code, _) = send("POST", &url, Some(lease("a", None)));
    assert_eq!(code, 504);
    assert!(
        t.elapsed() >= Duration::from_millis(450),
        "{:?}",
        t.elapsed()
    );
    let (code, _) = send("GET", &one, None);
    assert_eq!(code, 404, "the cut-off create was not carried out");
    let last: Value = serde_json::from_str(w.sim.request_log().lines().last().unwrap()).unwrap();
    assert_eq!(last["user"], "system:serviceaccount:default:podalloc");
    assert_eq!(last["verb"], "lease-get");
}

/// The Lease's path under the simulator's API.
const LEASE_PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases/podalloc-ha";

/// How many times a candidate's acting requests (`writes_only`: its pod and state writes;
/// else also its ticks' pod lists) resume after another candidate's began: the number of
/// overlapping (interleaved) terms. 0 when terms are disjoint.
fn overlaps(lines: &[Value], writes_only: bool) -> usize {
    let mut runs: Vec<String> = Vec::new();
    for l in lines.iter().filter(|l| acting(l, writes_only)) {
        let user = l["user"].as_str().unwrap_or("?").to_string();
        if runs.last() != Some(&user) {
            runs.push(user);
        }
    }
    let mut distinct = runs.clone();
    distinct.sort();
    distinct.dedup();
    runs.len() - distinct.len()
}

/// Two candidates; `edit` changes the Lease under them (as `kubectl` would) while pods keep
/// failing, so whoever thinks it leads writes. Then: no overlapping writes, someone leads
/// and acts again, `expect_holder` (if given) holds it, no overshoot. Returns how long after
/// the edit the Lease was held again by a candidate that then acted.
fn lease_edit_keeps_one_actor(what: &str, edit: impl Fn(&World), expect_holder: Option<&str>) {
    let w = world();
    let a = candidate(&w, "a");
    until(20, "a leads", || holder(&w).as_deref() == Some("pod-a"));
    until(20, "a converges", || w.live().len() as u64 == TARGET);
    let b = candidate(&w, "b");
    std::thread::sleep(Duration::from_millis(1200));
    // Failures from 1 s before the edit to 5 s after it, one every 250 ms: whoever thinks it
    // leads has deletes and creates to make when the Lease changes.
    let mut edited = Instant::now();
    for i in 0..24 {
        if i == 4 {
            edited = Instant::now();
            edit(&w);
        }
        if let Some(&id) = w.live().iter().min() {
            let _ = w.api(
                "POST",
                &format!("/sim/pods/default/{APP}-exec-{id}/phase"),
                Some(&json!({"phase": "Failed", "exitCode": 1, "reason": "Error"})),
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let held = until(30, "a candidate leads again", || {
        matches!(holder(&w).as_deref(), Some("pod-a" | "pod-b"))
    });
    until(30, "the app converges again", || {
        w.live().len() as u64 == TARGET
    });
    let recovered = edited.elapsed();
    if let Some(h) = expect_holder {
        assert_eq!(holder(&w).as_deref(), Some(h), "{what}");
    }
    for p in [&a, &b] {
        signal(p, libc::SIGTERM);
    }
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    for out in [&a, &b] {
        assert_eq!(out.status.code(), Some(0), "{what}: {}", stderr(out));
    }
    let lines = log(&w);
    let t = terms(&lines, true);
    let n = overlaps(&lines, true);
    let ticks = overlaps(&lines, false);
    let (last_old, first_new) = pause_after_edit(&lines);
    eprintln!(
        "leader: {what}: overlapping writes between identities: {n}, overlapping ticks: {ticks}; after the edit the \
         leader's last write at +{last_old} ms, the next term's first at +{first_new} ms \
         (lease held again {:.1}s, converged {:.1}s after it); terms {t:?}",
        held.as_secs_f64() + 5.0,
        recovered.as_secs_f64()
    );
    assert_eq!(n, 0, "{what}: {t:?}");
    assert_eq!(ticks, 0, "{what}: {:?}", terms(&lines, false));
    assert_disjoint(&t);
    assert_disjoint(&terms(&lines, false));
    assert_no_overshoot(&w);
}

/// Around the test's own Lease edit: how long after it (ms) the last write before the
/// longest pause in writes came, and the first after that pause (both 0 when the writes
/// did not pause for a second: the leader went on).
fn pause_after_edit(lines: &[Value]) -> (u64, u64) {
    let edit = lines
        .iter()
        .find(|l| {
            l["path"].as_str().is_some_and(|p| p.contains("/leases/"))
                && matches!(l["method"].as_str(), Some("PUT" | "DELETE"))
                && !l["user"].as_str().is_some_and(|u| u.starts_with("user-"))
        })
        .and_then(|l| l["ms"].as_u64())
        .expect("the edit is in the request log");
    let writes: Vec<u64> = (lines.iter())
        .filter(|l| acting(l, true))
        .filter_map(|l| l["ms"].as_u64())
        .filter(|&ms| ms >= edit)
        .collect();
    let Some((a, b)) = std::iter::once(edit)
        .chain(writes)
        .collect::<Vec<_>>()
        .windows(2)
        .map(|p| (p[0], p[1]))
        .max_by_key(|(a, b)| b - a)
        .filter(|(a, b)| b - a >= 1000)
    else {
        return (0, 0);
    };
    (a - edit, b - edit)
}

/// A Lease PUT by hand: the current Lease with `spec` fields replaced (`null` removes).
/// Read and written again on 409, as `kubectl edit` has the user do when the leader renewed
/// in between.
fn put_lease(w: &World, spec: Value) {
    for _ in 0..10 {
        let (code, mut l) = w.api("GET", LEASE_PATH, None);
        assert_eq!(code, 200, "{l}");
        for (k, v) in spec.as_object().unwrap() {
            if v.is_null() {
                l["spec"].as_object_mut().unwrap().remove(k);
            } else {
                l["spec"][k] = v.clone();
            }
        }
        let (code, body) = w.api("PUT", LEASE_PATH, Some(&l));
        if code != 409 {
            assert_eq!(code, 200, "{body}");
            return;
        }
    }
    panic!("the Lease kept changing under 10 edits");
}

#[test]
fn a_deleted_lease_never_gives_two_leaders() {
    lease_edit_keeps_one_actor(
        "kubectl delete lease",
        |w| {
            let (code, body) = w.api("DELETE", LEASE_PATH, None);
            assert_eq!(code, 200, "{body}");
        },
        None,
    );
}

#[test]
fn a_holder_edited_to_the_standby_never_gives_two_leaders() {
    lease_edit_keeps_one_actor(
        "holder edited to the standby",
        |w| put_lease(w, json!({"holderIdentity": "pod-b"})),
        None,
    );
}

#[test]
fn a_holder_emptied_or_renamed_by_hand_never_gives_two_leaders() {
    lease_edit_keeps_one_actor(
        "holder emptied by hand",
        |w| put_lease(w, json!({"holderIdentity": ""})),
        None,
    );
    lease_edit_keeps_one_actor(
        "holder renamed to a stranger",
        |w| put_lease(w, json!({"holderIdentity": "someone-else"})),
        None,
    );
}

#[test]
fn a_renew_time_moved_by_hand_keeps_the_leader() {
    lease_edit_keeps_one_actor(
        "renewTime set in the future",
        |w| put_lease(w, json!({"renewTime": "2099-01-01T00:00:00.000000Z"})),
        Some("pod-a"),
    );
    lease_edit_keeps_one_actor(
        "renewTime set in the past",
        |w| put_lease(w, json!({"renewTime": "2001-01-01T00:00:00.000000Z"})),
        Some("pod-a"),
    );
}

#[test]
fn a_lease_stripped_of_its_fields_never_gives_two_leaders() {
    lease_edit_keeps_one_actor(
        "holder, duration and times removed",
        |w| {
            put_lease(
                w,
                json!({"holderIdentity": null, "leaseDurationSeconds": null,
                       "renewTime": null, "acquireTime": null}),
            )
        },
        None,
    );
}

/// The executor ids the state ConfigMap `ha-state` lists as unacknowledged.
fn unacknowledged_in_state(w: &World) -> Vec<u64> {
    let (code, cm) = w.api(
        "GET",
        "/api/v1/namespaces/default/configmaps/ha-state",
        None,
    );
    if code != 200 {
        return Vec::new();
    }
    let st: Value =
        serde_json::from_str(cm["data"]["state.json"].as_str().unwrap_or("{}")).unwrap_or_default();
    (st["unacknowledged"].as_array().into_iter().flatten())
        .filter_map(|u| u["executor_id"].as_u64())
        .collect()
}

/// A leader that loses its Lease between its write-ahead save and its creates (a tick
/// stalled past the renew deadline while the holder is edited away) makes none of them: its
/// fence stops the calls and the save that would record it. When it leads again it must
/// settle those saved ids by name at once (each created now, or found), not wait out the
/// 60 s creation timeout with the app short of its target; and no id is handed out twice.
#[test]
fn a_leader_fenced_between_its_save_and_its_creates_sends_them_when_it_leads_again() {
    let w = world();
    let a = candidate_with(
        &w,
        "a",
        &[("PODALLOC_PAUSE_AT", "after-write-ahead:1:3000")],
    );
    until(20, "a saves its first batch ahead of the creates", || {
        unacknowledged_in_state(&w).len() as u64 == TARGET
    });
    let saved = unacknowledged_in_state(&w);
    assert!(w.live().is_empty(), "paused before any create");
    put_lease(&w, json!({"holderIdentity": "someone-else"}));
    let t = until(25, "the app converges on the saved ids", || {
        w.live().len() as u64 == TARGET
    });
    let mut live = w.live();
    live.sort();
    assert_eq!(live, saved, "the saved ids are created by name, none fresh");
    assert_eq!(holder(&w).as_deref(), Some("pod-a"));
    signal(&a, libc::SIGTERM);
    let out = a.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("stopped acting at once"), "{err}");
    eprintln!(
        "leader: a fenced batch was created {:.1}s after the edit",
        t.as_secs_f64()
    );
    assert_no_overshoot(&w);
}

/// `apps --leader-elect --discover` as process `who`, the states in ConfigMaps
/// (`podalloc-state-<app id>`) that every replica reads.
fn apps_candidate(w: &World, who: &str) -> Child {
    let mut c = crate::util::podalloc();
    c.args([
        "--server",
        &w.sim.url(),
        "--token",
        &format!("token-{who}-0123456789"),
    ])
    .arg("--certificate-authority")
    .arg(&w.ca)
    .args(
        [
            "--batch-delay",
            "200ms",
            "--image",
            "spark:3.5",
            "apps",
            "--discover",
            "spark-role=driver",
            "--state-configmaps",
            "podalloc-state",
            "--interval",
            "200ms",
        ]
        .iter()
        .chain(&FAST_LEADER_ELECT)
        .copied()
        .collect::<Vec<_>>(),
    )
    .env("POD_NAME", format!("pod-{who}"))
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap()
}

const DRIVERS: usize = 20;

/// Live (Pending or Running, not terminating) executors per app.
fn live_by_app(w: &World) -> std::collections::BTreeMap<String, u64> {
    let (code, list) = w.api(
        "GET",
        "/api/v1/namespaces/default/pods?labelSelector=spark-role%3Dexecutor",
        None,
    );
    assert_eq!(code, 200, "{list}");
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

fn apps_lease_holder(w: &World) -> Option<String> {
    let (code, v) = w.api(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/podalloc-apps",
        None,
    );
    (code == 200).then(|| {
        v["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .to_string()
    })
}

#[test]
fn two_apps_replicas_on_twenty_discovered_apps_act_one_at_a_time_and_hand_over_on_sigkill() {
    let w = world();
    let want: std::collections::BTreeMap<String, u64> = (0..DRIVERS)
        .map(|i| (format!("app-{i}"), (i % 4 + 1) as u64))
        .collect();
    for i in 0..DRIVERS {
        let (s, b) = w.api(
            "POST",
            "/sim/pods/default",
            Some(&json!({"metadata": {"name": format!("drv-{i}"),
                "labels": {"spark-role": "driver", "spark-app-selector": format!("app-{i}")},
                "annotations": {"podalloc.io/executors": want[&format!("app-{i}")].to_string()}},
                "spec": {"containers": [{"name": "d", "image": "spark"}]},
                "status": {"phase": "Running"}})),
        );
        assert!(s == 200 || s == 201, "{b}");
    }
    let mut procs = vec![
        ("a", apps_candidate(&w, "a")),
        ("b", apps_candidate(&w, "b")),
    ];
    until(60, "every app at its target", || live_by_app(&w) == want);
    let leader = apps_lease_holder(&w).expect("a Lease");
    let li = procs
        .iter()
        .position(|p| format!("pod-{}", p.0) == leader)
        .unwrap();
    let (dead, mut killed) = procs.remove(li);
    let (alive, survivor) = procs.remove(0);
    // Failures keep the leader writing when it is killed.
    for id in 1..=3 {
        let _ = w.api(
            "POST",
            &format!("/sim/pods/default/app-3-exec-{id}/phase"),
            Some(&json!({"phase": "Failed", "exitCode": 1, "reason": "Error"})),
        );
    }
    std::thread::sleep(Duration::from_millis(150));
    signal(&killed, libc::SIGKILL);
    let t = Instant::now();
    until(20, "the survivor takes the Lease", || {
        apps_lease_holder(&w).as_deref() == Some(&format!("pod-{alive}"))
    });
    let took = t.elapsed();
    let _ = killed.wait();
    until(60, "every app at its target again", || {
        live_by_app(&w) == want
    });
    signal(&survivor, libc::SIGTERM);
    let out = survivor.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("pod-{alive} became the leader")),
        "{err}"
    );
    let lines = log(&w);
    let t_all = terms(&lines, false);
    let (n, n_writes) = (overlaps(&lines, false), overlaps(&lines, true));
    let s = w.sim.stats();
    eprintln!(
        "leader: apps --leader-elect, {DRIVERS} apps: {dead} led, SIGKILL, {alive} held the lease {:.2}s later; overlapping ticks {n}, writes {n_writes}; {} creates, duplicate ids {}; terms {t_all:?}",
        took.as_secs_f64(),
        s.creates,
        s.duplicate_executor_ids
    );
    assert!(took < Duration::from_millis(3000 + 1100 + 1500), "{took:?}");
    assert_eq!((n, n_writes), (0, 0), "{t_all:?}");
    assert_disjoint(&t_all);
    assert_eq!(t_all.len(), 2, "{t_all:?}");
    assert_eq!(s.duplicate_executor_ids, 0);
    // The simulator counts every live pod with the app's label: the driver is one of them.
    for (app, max) in &s.max_live_pods_by_app {
        if let Some(target) = want.get(app) {
            assert!(
                *max <= target + 1,
                "{app}: {max} live pods for a target of {target} and the driver"
            );
        }
    }
    assert!(s.max_live_pods_by_app.len() >= DRIVERS);
}

/// The simulator's Leases as the apiserver has them: an update without
/// `metadata.resourceVersion` is 422 (Leases allow no unconditional update), and a
/// `renewTime` must be a `MicroTime` with six fractional digits (400 otherwise).
#[test]
fn the_simulator_refuses_unconditional_lease_updates_and_loose_times() {
    let w = SimWorld::new().start();
    let url = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let lease = |renew: &str| {
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
               "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "renewTime": renew}})
    };
    let (code, st) = w.api("POST", url, Some(&lease("2026-01-01T00:00:00Z")));
    assert_eq!(code, 400, "{st}");
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .contains(r#"cannot parse "Z" as ".000000""#),
        "{st}"
    );
    let (code, st) = w.api("POST", url, Some(&lease("2026-01-01T00:00:00.000000Z")));
    assert_eq!(code, 201, "{st}");
    let (code, st) = w.api(
        "PUT",
        &format!("{url}/l"),
        Some(&lease("2026-01-01T00:00:01.000000Z")),
    );
    assert_eq!(code, 422, "{st}");
    assert_eq!(
        st["message"],
        "Lease.coordination.k8s.io \"l\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
    );
}
