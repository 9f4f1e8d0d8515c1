//! Quiet at rest: a converged `podalloc apps` managing 20 discovered apps logs nothing but
//! its heartbeat (one tick line per app every `--log-every`). The defaults are a 5 min
//! heartbeat and a 30 s idle interval; the test runs them ten times faster (`--log-every 30s
//! --idle-interval 3s`, the same ten idle ticks per heartbeat) so that the default run of
//! `cargo test` holds no 340 s test, and checks from `apps --help` that the defaults are still
//! the ones scaled. Everything else is at its defaults but the pace of converging
//! (`--batch-delay`).

use crate::util::{podalloc, SimWorld, World};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const APPS: usize = 20;
/// The default `--log-every` (5m) and `--idle-interval` (30s), ten times faster.
const HEARTBEAT: Duration = Duration::from_secs(30);
const IDLE: Duration = Duration::from_secs(3);
/// A window just past the heartbeat plus one idle tick (and a margin of one more), so that
/// each app's heartbeat falls inside the window exactly once.
const WINDOW: Duration = Duration::from_secs(30 + 3 + 3);

/// The defaults this test scales: `apps --help` shows `--idle-interval` 30s and `--log-every` 5m.
#[test]
fn the_scaled_defaults_are_still_the_defaults() {
    let out = podalloc().args(["apps", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    let default_of = |flag: &str| {
        let at = help
            .find(&format!("--{flag} <DURATION>"))
            .unwrap_or_else(|| panic!("{help}"));
        let rest = &help[at..];
        let d = rest.find("[default: ").unwrap() + "[default: ".len();
        rest[d..].split(']').next().unwrap().to_string()
    };
    assert_eq!(default_of("idle-interval"), "30s");
    assert_eq!(default_of("log-every"), "5m");
    assert_eq!(
        HEARTBEAT.as_secs() * 10,
        300,
        "the heartbeat is the default's tenth"
    );
    assert_eq!(
        IDLE.as_secs() * 10,
        30,
        "the idle interval is the default's tenth"
    );
}

/// A running driver pod in namespace default for each app of `want`, annotated with its
/// number of executors.
fn seed_drivers(w: &World, want: &BTreeMap<String, usize>) {
    for (app, n) in want {
        let driver = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{app}-driver"),
                "labels": {"spark-role": "driver", "spark-app-selector": app},
                "annotations": {"podalloc.io/executors": n.to_string()}},
            "spec": {"containers": [{"name": "d", "image": "spark"}]}});
        let (code, body) = w.api("POST", "/api/v1/namespaces/default/pods", Some(&driver));
        assert_eq!(code, 201, "{body}");
    }
}

/// `podalloc apps` discovering the drivers, logging JSON, at the test's heartbeat and idle
/// interval; its standard error piped.
fn spawn_apps(w: &World) -> std::process::Child {
    let mut c = podalloc();
    c.args(["--server", &w.sim.url(), "--token", &w.token])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .args(["--log-format", "json", "--image", "spark:3.5"])
        .args([
            "--batch-delay",
            "100ms",
            "apps",
            "--log-every",
            &format!("{}s", HEARTBEAT.as_secs()),
            "--idle-interval",
            &format!("{}s", IDLE.as_secs()),
            "--discover",
            "spark-role=driver",
        ])
        .arg("--state-dir")
        .arg(w.path("states"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c.spawn().unwrap()
}

/// Running executors (not being deleted) by app.
fn running_executors(w: &World) -> BTreeMap<String, usize> {
    let path = "/api/v1/namespaces/default/pods?labelSelector=spark-role%3Dexecutor";
    let (code, list) = w.api("GET", path, None);
    assert_eq!(code, 200, "{list}");
    let mut by_app: BTreeMap<String, usize> = BTreeMap::new();
    for p in list["items"].as_array().unwrap() {
        if p["metadata"]["deletionTimestamp"].is_null() && p["status"]["phase"] == "Running" {
            let app = p["metadata"]["labels"]["spark-app-selector"]
                .as_str()
                .unwrap();
            *by_app.entry(app.to_string()).or_default() += 1;
        }
    }
    by_app
}

/// Converged on twenty apps, `podalloc apps` logs one heartbeat per app and nothing else.
#[test]
fn a_converged_apps_process_with_twenty_apps_logs_only_its_heartbeat() {
    let w = SimWorld::new().pod_ms(20, 100).start();
    let want: BTreeMap<String, usize> = (0..APPS)
        .map(|i| (format!("quiet-{i}"), i % 3 + 1))
        .collect();
    seed_drivers(&w, &want);
    let mut child = spawn_apps(&w);
    // Every line, with when it was read.
    let lines: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let reader = {
        let (lines, err) = (Arc::clone(&lines), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap().push((Instant::now(), l));
            }
        })
    };
    let live = || running_executors(&w);
    let t = Instant::now();
    while live() != want {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "not converged: {:?}",
            live()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The ticks that see the last pods start log that change; then the window opens.
    std::thread::sleep(Duration::from_secs(3));
    let opened = Instant::now();
    std::thread::sleep(WINDOW);
    terminate(&child);
    let status = child.wait().unwrap();
    reader.join().unwrap();
    assert!(status.success(), "apps exited {status:?}");
    assert_eq!(live(), want, "the apps stayed converged");
    let lines = lines.lock().unwrap();
    let before = lines.iter().filter(|(at, _)| *at < opened).count();
    // While converging, every app's tick lines that created pods were logged: an identical
    // line of another app (`tick 1`) never holds one back.
    let parsed =
        |l: &str| -> Value { serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")) };
    let mut creating: BTreeMap<String, usize> = BTreeMap::new();
    for (_, l) in lines.iter().filter(|(at, _)| *at < opened) {
        let l = parsed(l);
        if l["tick"].is_u64() && l["created"].as_u64() > Some(0) {
            *creating
                .entry(l["app"].as_str().unwrap_or("none").to_string())
                .or_default() += 1;
        }
    }
    assert_eq!(
        creating.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "every app logged the ticks that created its pods"
    );
    let inside: Vec<Value> = (lines.iter())
        .filter(|(at, _)| *at >= opened && at.duration_since(opened) < WINDOW)
        .map(|(_, l)| parsed(l))
        .collect();
    let mut beats: BTreeMap<String, usize> = BTreeMap::new();
    for l in &inside {
        let app = l["app"].as_str().unwrap_or_else(|| panic!("no app: {l}"));
        assert_eq!(l["namespace"], "default", "{l}");
        assert!(l["tick"].is_u64(), "only heartbeats in the window, got {l}");
        assert_eq!(
            (l["created"].as_u64(), l["deleted"].as_u64()),
            (Some(0), Some(0)),
            "{l}"
        );
        assert_eq!(l["running"].as_u64(), Some(want[app] as u64), "{l}");
        *beats.entry(app.to_string()).or_default() += 1;
    }
    let every: BTreeMap<String, usize> = want.keys().map(|a| (a.clone(), 1)).collect();
    assert_eq!(
        beats, every,
        "one heartbeat per app in {WINDOW:?} ({HEARTBEAT:?} apart)"
    );
    eprintln!(
        "quiet: {APPS} apps converged in {:.1}s with {before} log lines; then {} lines in {}s, \
         all heartbeats",
        opened.duration_since(t).as_secs_f64(),
        inside.len(),
        WINDOW.as_secs()
    );
}

/// SIGTERM to `child` (the controller's graceful stop).
fn terminate(child: &std::process::Child) {
    // SAFETY: kill(2) with a child's pid and a valid signal number has no memory effects.
    let rc = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0, "kill");
}
