//! Steering a running controller (`scale`, `add`, `remove` beside a `run` loop), the target's
//! one home (the store, not the command line), a converged tick writing nothing, and the
//! idle interval.
//!
//! The crash test kills the loop with SIGKILL at random crash points and random moments
//! (tests/crash.rs's `PODALLOC_CRASH_AT`) while requests are handed to it, then checks that
//! every request was applied exactly once: the target is the sum of the requests, the pods
//! match it, and no executor id was reused or pods ever exceeded the target.

use crate::util::{
    agent, code, spawn_replica, stderr, with_fast_leader_elect, SimWorld, World, FAST_LEADER_ELECT,
};
use podalloc::reconcile::CRASH_POINTS;
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A deterministic PRNG (splitmix64), as in tests/crash.rs.
pub(crate) struct Rng(u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub(crate) fn sim_world(app: &str) -> SimWorld {
    SimWorld::fast(app, "steer-token-0123456789")
        .namespace("default")
        .startup(Duration::from_millis(150))
        .stop(Duration::from_millis(20))
}

pub(crate) fn world(app: &str) -> World {
    sim_world(app).start()
}

/// A world whose commands pass no `--state-file` (for the ConfigMap store).
pub(crate) fn cm_world(app: &str) -> World {
    sim_world(app).no_state_file().start()
}

/// A child process killed when dropped (a failed assertion never leaves it running).
pub(crate) struct Bg(pub(crate) Option<Child>);

impl Bg {
    pub(crate) fn id(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// The process, no longer killed on drop (to stop it another way).
    pub(crate) fn take(&mut self) -> Child {
        self.0.take().expect("a process")
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `run` in the background with `args` after the command.
pub(crate) fn spawn_run(w: &World, args: &[&str]) -> Bg {
    let mut full = vec!["run", "--interval", "100ms"];
    full.extend_from_slice(args);
    Bg(Some(
        w.cmd(&full)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

/// Polls `f` every 50 ms for up to `secs` seconds; panics naming `what`.
pub(crate) fn wait_until(w: &World, secs: u64, what: &str, mut f: impl FnMut(&World) -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f(w) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}: {:?}", w.executors());
}

pub(crate) fn running(w: &World) -> Vec<u64> {
    (w.executors().into_iter())
        .filter(|(_, ph, del)| ph == "Running" && !del)
        .map(|(id, _, _)| id)
        .collect()
}

/// Exactly `n` live executors, all running.
pub(crate) fn settled(w: &World, n: usize) -> bool {
    w.live().len() == n && running(w).len() == n
}

pub(crate) fn stop(mut bg: Bg) -> String {
    let mut child = bg.0.take().unwrap();
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_running_loop_is_steered_by_add_remove_and_scale_on_its_next_tick() {
    let w = world("steer-app");
    // At rest the loop ticks only every 30 s: the requests below wake it.
    let run = spawn_run(&w, &["--target", "2", "--idle-interval", "30s"]);
    wait_until(&w, 15, "2 running", |w| settled(w, 2));
    let started = Instant::now();
    let e = assert_handed_to(&w.run(&["add", "2"]), "podalloc run");
    assert!(e.contains("pid"), "{e}");
    wait_until(&w, 10, "4 running", |w| settled(w, 4));
    assert!(started.elapsed() < Duration::from_secs(10));
    let victim = running(&w)[0];
    let out = w.run(&["remove", &victim.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    wait_until(&w, 10, "3 running without the removed one", |w| {
        settled(w, 3) && !w.live().contains(&victim)
    });
    // --wait returns once the loop has applied the request and the app has converged.
    let out = w.run(&["scale", "5", "--wait", "--timeout", "30s"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("converged"), "{}", stderr(&out));
    assert_eq!(w.live().len(), 5);
    let out = w.run(&["add", "1", "--wait", "--timeout", "30s"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(w.live().len(), 6);
    let last = running(&w)[5];
    let out = w.run(&["remove", &last.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    wait_until(&w, 10, "5 running", |w| settled(w, 5));
    // Refused at once, never queued: an id the app never had, a negative target.
    let out = w.run(&["remove", "999"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("no executor 999"), "{}", stderr(&out));
    let out = w.run(&["scale", "--", "-1"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let queue = w.path("state.json.requests");
    let left: Vec<_> = std::fs::read_dir(&queue).unwrap().flatten().collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(w.state()["target"], 5);
    let log = stop(run);
    assert!(log.contains("applying steering request"), "{log}");
    let s = w.sim.stats();
    assert_eq!(s.duplicate_executor_ids, 0);
    assert!(w.max_live() <= 6, "{}", w.max_live());
}

#[test]
fn status_lists_the_requests_a_stopped_loop_has_not_applied() {
    let w = world("steer-status");
    let run = spawn_run(&w, &["--target", "1"]);
    wait_until(&w, 15, "1 running", |w| settled(w, 1));
    // The loop is frozen (SIGSTOP): it holds the lock but applies nothing.
    let pid = run.id() as i32;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let out = w.run(&["add", "2"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = w.run(&["status"]);
    let text = crate::util::stdout(&out);
    assert!(text.contains("queued: add 2"), "{text}");
    let out = w.run(&["status", "--output", "json"]);
    let v: Value = serde_json::from_str(&crate::util::stdout(&out)).unwrap();
    assert_eq!(v["queued_requests"][0]["op"], "add", "{v}");
    unsafe { libc::kill(pid, libc::SIGCONT) };
    wait_until(&w, 10, "3 running", |w| settled(w, 3));
    let out = w.run(&["status", "--output", "json"]);
    let v: Value = serde_json::from_str(&crate::util::stdout(&out)).unwrap();
    assert!(v.get("queued_requests").is_none(), "{v}");
    stop(run);
}

/// Checks that the steering command that printed `out` exited 0 saying it handed its request
/// to the loop `owner` (`podalloc run`, `podalloc apps`); returns its standard error.
pub(crate) fn assert_handed_to(out: &std::process::Output, owner: &str) -> String {
    assert_eq!(code(out), 0, "{}", stderr(out));
    let e = stderr(out);
    assert!(e.contains("handed to the loop") && e.contains(owner), "{e}");
    e
}

/// Removes the first running executor with `steer(["remove", ID])` (a steering command with
/// its store flags, which must exit 0) and waits until it is gone and `left` executors run.
/// Returns the command's standard error.
pub(crate) fn remove_first_running(
    w: &World,
    steer: &dyn Fn(&[&str]) -> std::process::Output,
    left: usize,
) -> String {
    let victim = running(w)[0];
    let out = steer(&["remove", &victim.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    wait_until(w, 10, &format!("{left} running without {victim}"), |w| {
        settled(w, left) && !w.live().contains(&victim)
    });
    stderr(&out)
}

/// One request of the crash test (with the store flags `store`) and what it does to the
/// expected target.
pub(crate) fn submit_random(
    w: &World,
    store: &[&str],
    rng: &mut Rng,
    target: &mut u64,
    removed: &mut Vec<u64>,
) {
    let live: Vec<u64> = (running(w).into_iter())
        .filter(|id| !removed.contains(id))
        .collect();
    let choice = rng.below(20);
    // Removals about as often as adds keep the target small; a scale never goes below the
    // target (running executors are not deleted to shrink, so the pods could not follow).
    let (args, next): (Vec<String>, u64) = if choice < 9 && !live.is_empty() && *target > 2 {
        let id = live[rng.below(live.len() as u64) as usize];
        removed.push(id);
        (vec!["remove".into(), id.to_string()], *target - 1)
    } else if choice < 12 {
        let n = *target + rng.below(2);
        (vec!["scale".into(), n.to_string()], n)
    } else {
        (vec!["add".into(), "1".into()], *target + 1)
    };
    let mut full = store.to_vec();
    full.extend(args.iter().map(String::as_str));
    let out = w.cmd(&full).args(["--log-level", "warn"]).output().unwrap();
    assert_eq!(code(&out), 0, "{full:?}: {}", stderr(&out));
    *target = next;
}

/// Counts a child's end: killed by SIGKILL (a crash point or ours), or still running (then
/// killed now).
pub(crate) fn reap(mut child: Child) -> bool {
    match child.try_wait().unwrap() {
        Some(st) => st.signal() == Some(9),
        None => {
            let _ = child.kill();
            child.wait().unwrap();
            true
        }
    }
}

/// What a crash run did: SIGKILLs, requests made, the target they add up to, the highest
/// target on the way.
pub(crate) struct CrashRun {
    pub(crate) kills: u32,
    pub(crate) requests: u32,
    pub(crate) target: u64,
    pub(crate) max_target: u64,
}

/// `rounds` rounds of: a `run` loop (store flags `store`) started with a random crash point
/// (or, every third round, killed from outside at a random moment), one or two random
/// requests handed to it (or applied by the command itself while no loop runs), the loop
/// reaped. Then an uninterrupted `run --until-converged`. Checks no overshoot on the way.
fn crash_rounds(
    w: &World,
    store: &[&str],
    loop_flags: &[&str],
    rounds: u32,
    seed: u64,
) -> CrashRun {
    let looper = |extra: &[&str]| {
        let mut run = store.to_vec();
        run.push("run");
        run.extend_from_slice(extra);
        run.extend_from_slice(loop_flags);
        w.cmd(&run)
    };
    // Under leader election, the killed leader's Lease expires first.
    let settle = if loop_flags.is_empty() { 0 } else { 1200 };
    crash_rounds_of(w, store, &looper, settle, rounds, seed)
}

/// [`crash_rounds`] with the loop `looper(extra)` (`extra`: its flags for the round), which
/// is given `settle_ms` (and up to 200 ms more) before the requests of a round.
pub(crate) fn crash_rounds_of(
    w: &World,
    store: &[&str],
    looper: &dyn Fn(&[&str]) -> std::process::Command,
    settle_ms: u64,
    rounds: u32,
    seed: u64,
) -> CrashRun {
    let mut rng = Rng(seed);
    let mut r = CrashRun {
        kills: 0,
        requests: 0,
        target: 3,
        max_target: 3,
    };
    let mut first = store.to_vec();
    first.extend(["reconcile", "--target", "3"]);
    let out = w.run(&first);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let mut removed = Vec::new();
    for round in 0..rounds {
        let point = CRASH_POINTS[rng.below(CRASH_POINTS.len() as u64) as usize];
        let nth = rng.below(4) + 1;
        let mut cmd = looper(&["--interval", "50ms", "--creation-timeout", "2s"]);
        if round % 3 != 2 {
            cmd.env("PODALLOC_CRASH_AT", format!("{point}:{nth}"));
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(settle_ms + rng.below(200)));
        for _ in 0..=rng.below(2) {
            submit_random(w, store, &mut rng, &mut r.target, &mut removed);
            r.max_target = r.max_target.max(r.target);
            r.requests += 1;
        }
        std::thread::sleep(Duration::from_millis(rng.below(300)));
        if reap(child) {
            r.kills += 1;
        }
        assert!(
            w.live().len() as u64 <= r.max_target,
            "round {round}: {:?} live, target at most {}",
            w.live(),
            r.max_target
        );
    }
    // Uninterrupted, the loop applies what is left and converges on the requests' target.
    let out = looper(&["--until-converged", "--timeout", "60s"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        w.live().len() as u64,
        r.target,
        "after {} requests",
        r.requests
    );
    assert_eq!(w.sim.stats().duplicate_executor_ids, 0);
    assert!(
        w.max_live() <= r.max_target,
        "{} > {}",
        w.max_live(),
        r.max_target
    );
    eprintln!(
        "steering crash test {store:?}: {} kills, {} requests, target {}",
        r.kills, r.requests, r.target
    );
    r
}

#[test]
fn killed_loops_apply_every_request_exactly_once() {
    let w = world("steer-crash");
    let r = crash_rounds(&w, &[], &[], 60, 0x57ee7);
    assert_eq!(
        w.state()["target"],
        r.target,
        "after {} requests",
        r.requests
    );
    let queue: Vec<_> = std::fs::read_dir(w.path("state.json.requests"))
        .unwrap()
        .flatten()
        .collect();
    assert!(queue.is_empty(), "{queue:?}");
    assert!(r.kills >= 50, "only {} kills", r.kills);
}

/// Leader-election timings under which a killed holder's Lease (or an apps process's claim)
/// goes stale in 1 s: the crash rounds' (a 800 ms renew deadline, a 300 ms retry period).
pub(crate) const CRASH_LEASE: [&str; 6] = [
    "--leader-elect-lease-duration",
    "1s",
    "--leader-elect-renew-deadline",
    "800ms",
    "--leader-elect-retry-period",
    "300ms",
];

#[test]
fn killed_loops_on_the_configmap_store_apply_every_request_exactly_once() {
    let w = cm_world("steer-crash-cm");
    // Leader election (a killed loop's Lease expires in 1 s; a killed holder record keeps
    // others out until a ping goes unanswered, 3 × the interval + 2 s).
    let mut elect = vec!["--leader-elect"];
    elect.extend(CRASH_LEASE);
    let store = ["--state-store", "configmap:crash-cm"];
    let r = crash_rounds(&w, &store, &elect, 30, 0xc0ffee);
    let (_, cm) = w.api(
        "GET",
        "/api/v1/namespaces/default/configmaps/crash-cm",
        None,
    );
    let st: Value = serde_json::from_str(cm["data"]["state.json"].as_str().unwrap()).unwrap();
    assert_eq!(st["target"], r.target, "after {} requests", r.requests);
    assert!(cm["data"].get("requests.json").is_none(), "{cm}");
    assert!(r.kills >= 25, "only {} kills", r.kills);
}

/// The simulator's requests from `since` (a `seq`) on, by `verb resource`, and the last seq.
pub(crate) fn requests_by_verb(w: &World, since: u64) -> (BTreeMap<String, u64>, u64) {
    let mut by = BTreeMap::new();
    let mut last = since;
    for line in w.sim.request_log().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let seq = v["seq"].as_u64().unwrap();
        last = last.max(seq);
        if seq <= since {
            continue;
        }
        let path = v["path"].as_str().unwrap_or("");
        let parts: Vec<&str> = path.split('/').collect();
        let resource = match parts.iter().position(|p| *p == "namespaces") {
            Some(i) => parts.get(i + 2).copied().unwrap_or("namespaces"),
            None => "other",
        };
        let verb = v["verb"].as_str().unwrap_or("?");
        *by.entry(format!("{verb} {resource}")).or_insert(0) += 1;
    }
    (by, last)
}

pub(crate) fn last_seq(w: &World) -> u64 {
    requests_by_verb(w, 0).1
}

/// Runs a converged `run` with `args` for `secs` seconds and returns the requests by verb and
/// resource in that window, and the number of ticks (pod lists).
fn at_rest(w: &World, args: &[&str], secs: u64) -> (BTreeMap<String, u64>, u64) {
    let mut full = vec![
        "--state-store",
        "configmap:rest-state",
        "run",
        "--target",
        "3",
        "--interval",
        "100ms",
        "--idle-interval",
        "100ms",
    ];
    full.extend_from_slice(args);
    let child = Bg(Some(
        w.cmd(&full)
            .env("POD_NAME", "rest-pod")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    requests_at_rest(w, child, secs)
}

/// Asserts that `by` (requests by verb and resource, of `what` at rest) writes nothing but
/// Leases: no create, update, patch or delete of another resource.
pub(crate) fn assert_only_lease_writes(what: &str, by: &BTreeMap<String, u64>) {
    for (k, n) in by {
        let write = ["create", "update", "patch", "delete"]
            .iter()
            .any(|v| k.starts_with(v));
        assert!(
            !write || k.ends_with(" leases"),
            "{what}: {n} × {k} at rest: {by:?}"
        );
    }
}

/// Once the loop `bg` has 3 executors running (and 1.5 s more), the requests by verb and
/// resource it makes in the next `secs` seconds, and its ticks in them (pod lists). Stops it.
pub(crate) fn requests_at_rest(w: &World, bg: Bg, secs: u64) -> (BTreeMap<String, u64>, u64) {
    wait_until(w, 15, "3 running", |w| settled(w, 3));
    std::thread::sleep(Duration::from_millis(1500));
    let since = last_seq(w);
    std::thread::sleep(Duration::from_secs(secs));
    let (by, _) = requests_by_verb(w, since);
    stop(bg);
    let ticks = by.get("list pods").copied().unwrap_or(0);
    (by, ticks)
}

#[test]
fn a_converged_tick_writes_nothing_lease_renewals_aside() {
    for (name, args) in [
        ("holder", &[][..]),
        ("leader-elect", &FAST_LEADER_ELECT[..]),
    ] {
        let w = cm_world(&format!("rest-{name}"));
        let (by, ticks) = at_rest(&w, args, 4);
        eprintln!("{name}: {ticks} converged ticks: {by:?}");
        assert!(ticks >= 10, "{name}: {ticks} ticks: {by:?}");
        // The ConfigMap holder record is written once, when the loop claims it (never
        // renewed): none in a 4 s window; a Lease renewal every retry period.
        assert_only_lease_writes(name, &by);
        assert!(
            by.get("get configmaps").copied().unwrap_or(0) <= ticks,
            "{by:?}"
        );
    }
    // The file store: the state file is not rewritten at rest.
    let w = world("rest-file");
    let run = spawn_run(&w, &["--target", "2", "--idle-interval", "100ms"]);
    wait_until(&w, 15, "2 running", |w| settled(w, 2));
    std::thread::sleep(Duration::from_millis(1000));
    let m = std::fs::metadata(w.state_file())
        .unwrap()
        .modified()
        .unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(
        std::fs::metadata(w.state_file())
            .unwrap()
            .modified()
            .unwrap(),
        m
    );
    stop(run);
}

/// Replaces ConfigMap `name`'s annotation `key` with `value` (GET, then PUT with its
/// resourceVersion, as `kubectl annotate` amounts to).
fn annotate(w: &World, name: &str, key: &str, value: &str) {
    let path = format!("/api/v1/namespaces/default/configmaps/{name}");
    let (code, mut cm) = w.api("GET", &path, None);
    assert_eq!(code, 200, "{cm}");
    cm["metadata"]["annotations"][key] = Value::String(value.into());
    let a = agent(w.sim.ca_pem().unwrap().as_bytes());
    let resp = a
        .put(&format!("{}{path}", w.sim.url()))
        .header("Authorization", &format!("Bearer {}", w.token))
        .content_type("application/json")
        .send(cm.to_string())
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
}

fn replica(w: &World, who: &str) -> Bg {
    let mut cmd = w.cmd(&with_fast_leader_elect(&[
        "--state-store",
        "configmap:roll-state",
        "run",
        "--target",
        "4",
        "--interval",
        "100ms",
        "--idle-interval",
        "1s",
    ]));
    Bg(Some(spawn_replica(
        &mut cmd,
        &format!("roll-{who}"),
        Stdio::null(),
    )))
}

fn cm_target(w: &World) -> (Option<u64>, Option<String>) {
    let (_, cm) = w.api(
        "GET",
        "/api/v1/namespaces/default/configmaps/roll-state",
        None,
    );
    let st: Option<Value> = cm["data"]["state.json"]
        .as_str()
        .and_then(|t| serde_json::from_str(t).ok());
    let ann = cm["metadata"]["annotations"]["podalloc.io/executors"]
        .as_str()
        .map(str::to_string);
    (st.and_then(|s| s["target"].as_u64()), ann)
}

#[test]
fn a_rollout_never_changes_the_annotated_target() {
    let w = cm_world("roll-app");
    let mut a = replica(&w, "a");
    let mut b = replica(&w, "b");
    wait_until(&w, 20, "4 running", |w| settled(w, 4));
    // The annotation is people's: the controller never writes it.
    assert_eq!(cm_target(&w), (Some(4), None));
    annotate(&w, "roll-state", "podalloc.io/executors", "6");
    // The ConfigMap store has no cheap wake: the leader sees the annotation at its next
    // idle tick.
    wait_until(&w, 20, "6 running", |w| settled(w, 6));
    let creates = w.sim.stats().creates;
    // Each replica restarted in turn, with its --target 4 unchanged.
    for who in ["a", "b"] {
        let old = if who == "a" { &mut a } else { &mut b };
        unsafe { libc::kill(old.id() as i32, libc::SIGTERM) };
        let _ = old.0.as_mut().unwrap().wait();
        *old = replica(&w, who);
        let end = Instant::now() + Duration::from_secs(6);
        while Instant::now() < end {
            assert!(w.live().len() <= 6, "{:?}", w.executors());
            let (t, ann) = cm_target(&w);
            assert_eq!((t, ann.as_deref()), (Some(6), Some("6")));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    assert!(settled(&w, 6), "{:?}", w.executors());
    let s = w.sim.stats();
    assert_eq!(s.creates, creates, "no create after reaching 6");
    assert_eq!(s.deletes, 0, "no delete");
    assert_eq!(s.duplicate_executor_ids, 0);
    stop(a);
    stop(b);
}

/// Milliseconds until `f` holds, polling every 20 ms for up to `max`.
fn ms_until(w: &World, max: Duration, mut f: impl FnMut(&World) -> bool) -> u128 {
    let t = Instant::now();
    while t.elapsed() < max {
        if f(w) {
            return t.elapsed().as_millis();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("not within {max:?}: {:?}", w.executors());
}

/// Turns the first running executor of app `idle-app` Failed and returns the ms until
/// `count(w)` (a simulator counter: creates, deletes) grows.
fn fail_one_and_time(w: &World, count: impl Fn(&World) -> u64) -> u128 {
    let victim = running(w)[0];
    let before = count(w);
    w.sim
        .set_pod_phase("default", &format!("idle-app-exec-{victim}"), "Failed")
        .unwrap();
    ms_until(w, Duration::from_secs(10), |w| count(w) > before)
}

#[test]
fn a_failed_executor_is_noticed_within_the_idle_interval_at_rest_and_one_tick_in_flight() {
    let w = world("idle-app");
    let run = spawn_run(&w, &["--target", "3", "--idle-interval", "2s"]);
    wait_until(&w, 15, "3 running", |w| settled(w, 3));
    std::thread::sleep(Duration::from_millis(2500));
    // At rest: a tick every 2 s. A failed executor is deleted and replaced by the next one.
    let ms = fail_one_and_time(&w, |w| w.sim.stats().creates);
    eprintln!("at rest: the failed executor was replaced after {ms} ms");
    assert!(ms <= 2000 + 100 + 900, "replaced after {ms} ms at rest");
    wait_until(&w, 10, "3 running again", |w| settled(w, 3));
    // In flight (a pod held Pending): a tick every 100 ms.
    let held = running(&w)[0];
    w.sim
        .set_pod_phase("default", &format!("idle-app-exec-{held}"), "Pending")
        .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let ms = fail_one_and_time(&w, |w| w.sim.stats().deletes);
    eprintln!("in flight: the failed executor was deleted after {ms} ms");
    assert!(ms <= 100 + 900, "noticed after {ms} ms in flight");
    stop(run);
}

#[test]
fn a_loop_on_the_configmap_store_is_steered_through_its_configmap() {
    let w = cm_world("steer-cm");
    let store = ["--state-store", "configmap:steer-cm-state"];
    let mut full = store.to_vec();
    full.extend([
        "run",
        "--target",
        "2",
        "--interval",
        "100ms",
        "--idle-interval",
        "500ms",
    ]);
    let run = Bg(Some(
        w.cmd(&full)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    wait_until(&w, 15, "2 running", |w| settled(w, 2));
    let with = |args: &[&str]| {
        let mut a = store.to_vec();
        a.extend_from_slice(args);
        w.run(&a)
    };
    let out = with(&["add", "2", "--wait", "--timeout", "30s"]);
    assert_handed_to(&out, "podalloc run");
    assert!(settled(&w, 4), "{:?}", w.executors());
    remove_first_running(&w, &with, 3);
    let out = with(&["remove", "77"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    let (_, cm) = w.api(
        "GET",
        "/api/v1/namespaces/default/configmaps/steer-cm-state",
        None,
    );
    assert!(cm["data"].get("requests.json").is_none(), "{cm}");
    // The target annotation belongs to people: the controller never writes it.
    assert!(
        cm["metadata"]["annotations"]
            .get("podalloc.io/executors")
            .is_none(),
        "{cm}"
    );
    // Stopped cleanly, the loop gives up its holder record (a killed one would keep others
    // out until it is stale).
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let mut run = run;
    let _ = run.0.as_mut().unwrap().wait();
    // No loop: the commands apply their requests themselves, through the same queue.
    let out = with(&["add", "1"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!stderr(&out).contains("handed to"), "{}", stderr(&out));
    assert_eq!(w.live().len(), 4, "{:?}", w.executors());
    let out = with(&["scale", "5", "--wait", "--timeout", "30s"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(settled(&w, 5), "{:?}", w.executors());
    let (_, cm) = w.api(
        "GET",
        "/api/v1/namespaces/default/configmaps/steer-cm-state",
        None,
    );
    assert!(cm["data"].get("requests.json").is_none(), "{cm}");
}
