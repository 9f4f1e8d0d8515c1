//! Steering an app that a `podalloc apps` process owns: `scale`, `add` and `remove` hand
//! their request to it through the store it uses (the request file beside the state file;
//! with `--state-configmaps PREFIX`, the state ConfigMap's requests field), and it applies
//! them at the app's next tick, exactly once, also when the process is killed with SIGKILL
//! at random points (the same crash rounds as `run`'s in tests/steer.rs). Then a SIGTERM
//! while the API server stalls a list: the runner exits at once.

use crate::steer::{
    assert_handed_to, assert_only_lease_writes, cm_world, crash_rounds_of, remove_first_running,
    requests_at_rest, settled, stop, wait_until, world, Bg, CRASH_LEASE,
};
use crate::util::{code, podalloc, stderr, write, SimWorld, World};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The apps file of the world's one app: its state file is the world's (`state.json`, the
/// file `w.cmd` passes as `--state-file`), so the steering commands address the same store.
fn apps_file(w: &World, target: Option<u32>) -> std::path::PathBuf {
    let path = w.path("apps.yaml");
    let target = target.map_or(String::new(), |t| format!("  target: {t}\n"));
    let text = format!(
        "apps:\n- app-id: {}\n  image: img\n  state-file: state.json\n{target}",
        w.app
    );
    write(&path, &text);
    path
}

/// [`apps_file`] without the state file: with `--state-configmaps PREFIX` the app's state
/// lives in the ConfigMap PREFIX-<app id>.
fn configmap_apps_file(w: &World, target: Option<u32>) {
    let path = apps_file(w, target);
    let text = std::fs::read_to_string(&path).unwrap();
    write(&path, &text.replace("  state-file: state.json\n", ""));
}

/// `podalloc apps --file apps.yaml` connected to the world's simulator (no app flags), then
/// `args`.
fn apps_cmd(w: &World, args: &[&str]) -> Command {
    let mut c = podalloc();
    c.args(["--server", &w.sim.url(), "--token", &w.token])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .args(["-n", "default", "--batch-delay", "100ms", "apps", "--file"])
        .arg(w.path("apps.yaml"))
        .args(args);
    c
}

fn spawn(mut c: Command) -> Bg {
    Bg(Some(
        c.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ))
}

/// `add`, `remove`, `scale` (with and without `--wait`) handed to the apps process with the
/// store flags `store`, each applied at its next tick. `woken`: a queued request wakes the
/// app at rest (file store); else the app's idle interval is short.
fn steer_an_apps_owner(w: &World, store: &[&str]) {
    let with = |args: &[&str]| {
        let mut a = store.to_vec();
        a.extend_from_slice(args);
        w.run(&a)
    };
    // `status` names the owner that will apply the requests, without taking its lock.
    let out = with(&["status"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said = crate::util::stdout(&out);
    assert!(said.contains("owner: held by `podalloc apps`"), "{said}");
    let started = Instant::now();
    assert_handed_to(&with(&["add", "2"]), "podalloc apps");
    wait_until(w, 10, "4 running", |w| settled(w, 4));
    assert!(started.elapsed() < Duration::from_secs(10));
    let e = remove_first_running(w, &with, 3);
    assert!(e.contains("podalloc apps"), "{e}");
    let out = with(&["scale", "5", "--wait", "--timeout", "30s"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let e = stderr(&out);
    assert!(
        e.contains("podalloc apps") && e.contains("converged"),
        "{e}"
    );
    assert_eq!(w.live().len(), 5, "{:?}", w.executors());
    let out = with(&["add", "1", "--wait", "--timeout", "30s"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(w.live().len(), 6, "{:?}", w.executors());
    let out = with(&["scale", "7"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    wait_until(w, 10, "7 running", |w| settled(w, 7));
    // Refused at once, never queued: an id the app never had.
    let out = with(&["remove", "999"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(w.sim.stats().duplicate_executor_ids, 0);
    assert!(w.max_live() <= 7, "{}", w.max_live());
}

#[test]
fn an_apps_process_is_steered_by_add_remove_and_scale_on_its_next_tick() {
    let w = world("steer-apps");
    apps_file(&w, Some(2));
    // At rest the app ticks only every 30 s: the requests below wake it.
    let apps = spawn(apps_cmd(
        &w,
        &["--interval", "100ms", "--idle-interval", "30s"],
    ));
    wait_until(&w, 15, "2 running", |w| settled(w, 2));
    steer_an_apps_owner(&w, &[]);
    let left: Vec<_> = (std::fs::read_dir(w.path("state.json.requests")).unwrap())
        .flatten()
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(w.state()["target"], 7);
    let log = stop(apps);
    assert!(log.contains("applying steering request"), "{log}");
    // Every line of the app's tick names it.
    let line = (log.lines())
        .find(|l| l.contains("applying steering request"))
        .unwrap();
    assert!(line.contains("app=steer-apps ns=default"), "{line}");
}

#[test]
fn an_apps_process_on_configmaps_is_steered_through_the_state_configmap() {
    let w = cm_world("steer-apps-cm");
    // The file entry names no state file: the state lives in PREFIX-<app id>.
    configmap_apps_file(&w, Some(2));
    let prefix = ["--state-configmaps", "steer"];
    let mut args = prefix.to_vec();
    args.extend(["--interval", "100ms", "--idle-interval", "500ms"]);
    let apps = spawn(apps_cmd(&w, &args));
    wait_until(&w, 15, "2 running", |w| settled(w, 2));
    steer_an_apps_owner(&w, &["--state-store", "configmap:steer-steer-apps-cm"]);
    let (_, cm) = w.api(
        "GET",
        "/api/v1/namespaces/default/configmaps/steer-steer-apps-cm",
        None,
    );
    assert!(cm["data"].get("requests.json").is_none(), "{cm}");
    let state: serde_json::Value =
        serde_json::from_str(cm["data"]["state.json"].as_str().unwrap()).unwrap();
    assert_eq!(state["target"], 7, "{cm}");
    stop(apps);
}

#[test]
fn killed_apps_processes_apply_every_request_exactly_once() {
    let w = world("steer-apps-crash");
    apps_file(&w, None);
    // The claim Lease of a killed process goes stale in 1 s.
    let looper = |extra: &[&str]| {
        let mut args = CRASH_LEASE.to_vec();
        args.extend_from_slice(extra);
        apps_cmd(&w, &args)
    };
    let r = crash_rounds_of(&w, &[], &looper, 1200, 60, 0xa995);
    assert_eq!(
        w.state()["target"],
        r.target,
        "after {} requests",
        r.requests
    );
    let queue: Vec<_> = (std::fs::read_dir(w.path("state.json.requests")).unwrap())
        .flatten()
        .collect();
    assert!(queue.is_empty(), "{queue:?}");
    assert!(r.kills >= 50, "only {} kills", r.kills);
}

/// The holder of Lease `name` (empty: none, or released).
fn lease_holder(w: &World, name: &str) -> String {
    let path = format!("/apis/coordination.k8s.io/v1/namespaces/default/leases/{name}");
    let (_, l) = w.api("GET", &path, None);
    l["spec"]["holderIdentity"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

/// Sends SIGTERM to `child` (the loop `what`, its list stalled) and checks that it stops at
/// once: exit 0 within 2 s, saying `stopping now` and, as the signal's line, on lines that
/// carry `app` (`*` for `apps`, its lines about the process) and the namespace. Returns its
/// standard error.
fn sigterm_stops_at_once(what: &str, app: &str, child: std::process::Child) -> String {
    let sent = Instant::now();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("{what}: SIGTERM during a stalled list: exited in {took:?}");
    assert_eq!(code(&out), 0, "{what}: {err}");
    assert!(took < Duration::from_secs(2), "{what}: {took:?}: {err}");
    assert!(err.contains("stopping now"), "{what}: {err}");
    for said in ["SIGTERM received: finishing", "stopping now"] {
        let line = err.lines().find(|l| l.contains(said)).unwrap();
        assert!(line.contains(&format!(" app={app} ns=default] ")), "{line}");
    }
    err
}

#[test]
fn sigterm_during_a_stalled_list_stops_run_and_apps_at_once() {
    // Every pod list stalls for 100 s (the request timeout is 10 s).
    let w = SimWorld::fast("stalled", "stall-token-0123456789")
        .namespace("default")
        .faults(&["list:delay:100000"])
        .start();
    apps_file(&w, Some(1));
    let elect = [
        "--leader-elect-lease-duration",
        "2s",
        "--leader-elect-renew-deadline",
        "1s",
        "--leader-elect-retry-period",
        "200ms",
    ];
    let mut run_args = vec![
        "run",
        "--target",
        "1",
        "--interval",
        "100ms",
        "--leader-elect",
    ];
    run_args.extend(elect);
    let mut apps_args = vec!["--interval", "100ms"];
    apps_args.extend(elect);
    let loops = [
        ("run", w.cmd(&run_args), "podalloc-stalled", "stalled"),
        ("apps", apps_cmd(&w, &apps_args), "podalloc-apps", "*"),
    ];
    for (what, mut cmd, lease, app) in loops {
        let child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Once it leads (its Lease, or apps' claim), its first tick starts with the list.
        wait_until(&w, 15, "the Lease taken", |w| {
            !lease_holder(w, lease).is_empty()
        });
        std::thread::sleep(Duration::from_millis(500));
        sigterm_stops_at_once(what, app, child);
        // Nothing was written by the tick, and the Lease was given up.
        assert!(!w.state_file().exists(), "{what}");
        assert_eq!(lease_holder(&w, lease), "", "{what}");
    }
    assert_eq!(w.sim.stats().live_pods, 0);
}

/// The holder record (annotation) and the state (parsed) of ConfigMap `name`.
fn cm_holder_and_state(w: &World, name: &str) -> (Option<String>, serde_json::Value) {
    let path = format!("/api/v1/namespaces/default/configmaps/{name}");
    let (_, cm) = w.api("GET", &path, None);
    let holder = cm["metadata"]["annotations"]["podalloc.io/holder"]
        .as_str()
        .map(str::to_string);
    let state = (cm["data"]["state.json"].as_str())
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    (holder, state)
}

#[test]
fn sigterm_during_a_stalled_list_gives_up_the_configmap_holder_record() {
    // The first pod list answers; every later one stalls for 100 s.
    let w = SimWorld::fast("stalled-cm", "stall-token-0123456789")
        .namespace("default")
        .no_state_file()
        .faults(&["list:delay:100000@2-1000"])
        .start();
    let args = [
        "--state-store",
        "configmap:stall-cm",
        "run",
        "--target",
        "1",
    ];
    let child = w
        .cmd(&args)
        .args(["--interval", "100ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first tick saved the state with the loop's holder record; the next list stalls.
    wait_until(&w, 15, "the holder record", |w| {
        cm_holder_and_state(w, "stall-cm").0.is_some()
    });
    std::thread::sleep(Duration::from_millis(800));
    let (_, before) = cm_holder_and_state(&w, "stall-cm");
    let err = sigterm_stops_at_once("run on a ConfigMap store", "stalled-cm", child);
    // The record is given up (a loop started now is not refused), the state as it was.
    let (holder, after) = cm_holder_and_state(&w, "stall-cm");
    assert_eq!(holder, None, "{err}");
    assert_eq!(after, before);
}

/// A converged app of an `apps` process (`--state-configmaps`, idle interval `idle`) for
/// `secs` seconds after it settled: the requests by verb and resource, and its ticks (pod
/// lists).
fn apps_at_rest(
    w: &World,
    idle: &str,
    secs: u64,
) -> (std::collections::BTreeMap<String, u64>, u64) {
    let args = [
        "--state-configmaps",
        "rest",
        "--interval",
        "100ms",
        "--idle-interval",
        idle,
    ];
    requests_at_rest(w, spawn(apps_cmd(w, &args)), secs)
}

#[test]
fn a_converged_apps_process_writes_nothing_and_ticks_at_the_idle_interval() {
    let w = cm_world("rest-apps");
    configmap_apps_file(&w, Some(3));
    let (by, ticks) = apps_at_rest(&w, "100ms", 4);
    assert!(ticks >= 10, "{ticks} ticks: {by:?}");
    // The holder record is written once, when the app's store is claimed (never renewed):
    // none in 4 s; the claim Lease every retry period.
    assert_only_lease_writes("apps", &by);
    // At the default idle interval (30 s) a converged app does not tick in 3 s at all.
    let (by, ticks) = apps_at_rest(&w, "30s", 3);
    assert_eq!(ticks, 0, "{by:?}");
}
