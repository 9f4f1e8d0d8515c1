//! `--metrics-bind-address` and `--health-probe-bind-address` (issue: run in a cluster the
//! way controllers are run): `/metrics` scraped from `run` and from `apps` (a series per
//! app), `/healthz` and `/readyz` probed, and liveness failing while the loop is stuck.

use crate::util::{podalloc, stderr, SimWorld, World};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback address (bound, then released for the process under test).
fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `GET http://ADDR/PATH`: the status and body (`None` while nothing listens).
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut r = agent.get(format!("http://{addr}{path}")).call().ok()?;
    let code = r.status().as_u16();
    Some((code, r.body_mut().read_to_string().unwrap_or_default()))
}

/// Polls `GET ADDR/PATH` every 50 ms for up to `secs` until `f` holds; the last answer.
fn until(addr: &str, path: &str, secs: u64, f: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let end = Instant::now() + Duration::from_secs(secs);
    let mut last = (0, String::new());
    while Instant::now() < end {
        if let Some((c, b)) = get(addr, path) {
            if f(c, &b) {
                return (c, b);
            }
            last = (c, b);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("GET {path}: never as wanted; last {last:?}");
}

/// The value of the sample `series` (name and labels, as written) in a Prometheus text; 0
/// when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `/metrics` at `addr` once it counts at least `n` pod creates answered 201.
fn until_created(addr: &str, n: u32) -> String {
    let creates = r#"podalloc_api_requests_total{verb="create",resource="pods",code="201"}"#;
    until(addr, "/metrics", 20, |_, b| {
        sample(b, creates) >= f64::from(n)
    })
    .1
}

fn spawn(mut c: Command) -> Child {
    c.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn stop(what: &str, c: Child) {
    crate::util::stop_all(what, vec![c]);
}

#[test]
fn run_serves_metrics_and_probes_once_its_state_is_loaded() {
    let w = SimWorld::new().app("etl").start();
    let (m, p) = (free_addr(), free_addr());
    let c = spawn(w.cmd(&[
        "--metrics-bind-address",
        &m,
        "--health-probe-bind-address",
        &p,
        "run",
        "--target",
        "3",
    ]));
    until(&p, "/readyz", 20, |c, _| c == 200);
    assert_eq!(get(&p, "/healthz").map(|r| r.0), Some(200));
    let (_, body) = until(&m, "/metrics", 20, |_, b| {
        b.contains("podalloc_running{app=\"etl\",namespace=\"default\"} 3")
    });
    assert!(
        body.contains("# TYPE podalloc_tick_success gauge"),
        "{body}"
    );
    assert_eq!(body.matches("# TYPE podalloc_target ").count(), 1, "{body}");
    // The process's requests by verb, resource and code: at least the 3 creates and a list.
    let body = until_created(&m, 3);
    assert!(
        sample(
            &body,
            r#"podalloc_api_requests_total{verb="list",resource="pods",code="200"}"#
        ) >= 1.0,
        "{body}"
    );
    assert_eq!(
        get(&m, "/healthz").map(|r| r.0),
        Some(404),
        "probes are on their own address"
    );
    stop("run", c);
}

#[test]
fn apps_serves_one_series_per_app_on_one_address() {
    let w = SimWorld::new().start();
    std::fs::write(
        w.path("apps.yaml"),
        "apps:\n- app-id: etl\n  image: spark:3.5\n  target: 2\n- app-id: ml\n  image: spark:3.5\n  target: 1\n- app-id: sys\n  namespace: kube-system\n  image: spark:3.5\n  target: 1\n",
    )
    .unwrap();
    let addr = free_addr();
    let mut c = podalloc();
    c.args(["--server", &w.sim.url(), "--token", &w.token])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .args(["--batch-delay", "100ms", "--metrics-bind-address", &addr])
        .args(["--health-probe-bind-address", &addr, "apps", "--state-dir"])
        .arg(w.path("states"))
        .arg("--file")
        .arg(w.path("apps.yaml"));
    let c = spawn(c);
    let (_, body) = until(&addr, "/metrics", 20, |_, b| {
        b.contains("podalloc_running{app=\"etl\",namespace=\"default\"} 2")
            && b.contains("podalloc_running{app=\"ml\",namespace=\"default\"} 1")
            && b.contains("podalloc_running{app=\"sys\",namespace=\"kube-system\"} 1")
    });
    assert_eq!(body.matches("# HELP podalloc_target ").count(), 1, "{body}");
    // One client serves both namespaces: one series of requests, every app's creates in it.
    let body = until_created(&addr, 4);
    assert_eq!(
        body.matches("# TYPE podalloc_api_requests_total ").count(),
        1,
        "{body}"
    );
    assert_eq!(
        get(&addr, "/readyz").map(|r| r.0),
        Some(200),
        "one address serves all"
    );
    stop("apps", c);
}

/// A loop stuck in a tick (paused between its write-ahead save and its creates, longer than
/// a tick's budget of 4 × --request-timeout plus two intervals) fails liveness; once the
/// tick ends, liveness passes again.
#[test]
fn liveness_fails_while_the_loop_is_stuck_and_recovers() {
    let w: World = SimWorld::new().app("stuck").start();
    let p = free_addr();
    let c = spawn({
        let mut c = w.cmd(&[
            "--request-timeout",
            "1s",
            "--health-probe-bind-address",
            &p,
            "run",
            "--target",
            "2",
            "--interval",
            "200ms",
            "--idle-interval",
            "200ms",
        ]);
        c.env("PODALLOC_PAUSE_AT", "after-write-ahead:1:9000");
        c
    });
    let t = Instant::now();
    let (_, body) = until(&p, "/healthz", 15, |c, _| c == 500);
    assert!(body.contains("has not finished a pass"), "{body}");
    assert!(
        t.elapsed() >= Duration::from_secs(3),
        "failed too early: {:?}",
        t.elapsed()
    );
    until(&p, "/healthz", 15, |c, _| c == 200);
    until(&p, "/readyz", 5, |c, _| c == 200);
    let out = crate::util::stop_all("run", vec![c]);
    assert!(!stderr(&out[0]).contains("panicked"));
}
