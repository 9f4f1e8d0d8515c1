//! `--metrics-bind-address` and `--health-probe-bind-address` (issue: run in a cluster the
//! way controllers are run): `/metrics` scraped from `run` and from `apps` (a series per
//! app), `/healthz` and `/readyz` probed, liveness failing while the loop is stuck, and the
//! leadership `/metrics` says being the election's at the moment of the scrape.

use crate::steer::Bg;
use crate::util::{podalloc, stderr, ticking, SimWorld, World};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
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

/// The status of `GET http://ADDR/PATH` (`None` while nothing listens).
fn code(addr: &str, path: &str) -> Option<u16> {
    get(addr, path).map(|r| r.0)
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

/// Stops `c` as [`crate::util::stop_all`] does (SIGTERM, exit 0 checked); its stderr.
fn stop(what: &str, c: Child) -> String {
    stderr(&crate::util::stop_all(what, vec![c])[0])
}

#[test]
fn run_serves_metrics_and_probes_once_its_state_is_loaded() {
    let (_w, c, m, p) = serving("etl", 3);
    assert_eq!(code(&p, "/healthz"), Some(200));
    let body = get(&m, "/metrics").unwrap().1;
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
        code(&m, "/healthz"),
        Some(404),
        "probes are on their own address"
    );
    // Each address is announced with what it serves (both lines said all three paths).
    let err = stop("run", c);
    serves(&err, &m, "(/metrics, --metrics-bind-address)");
    serves(
        &err,
        &p,
        "(/healthz, /livez, /readyz, --health-probe-bind-address)",
    );
}

/// Asserts that `err` announces `addr` once, with what it serves: `what`.
fn serves(err: &str, addr: &str, what: &str) {
    let at = format!("serving http://{addr} ");
    let lines: Vec<_> = err.lines().filter(|l| l.contains(&at)).collect();
    assert_eq!(lines.len(), 1, "{addr} announced once: {err}");
    assert!(lines[0].ends_with(what), "{addr}: {}", lines[0]);
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
    assert_eq!(code(&addr, "/readyz"), Some(200), "one address serves all");
    let err = stop("apps", c);
    assert_eq!(err.matches("serving http://").count(), 1, "{err}");
    let all = "(/metrics, /healthz, /livez, /readyz, --metrics-bind-address and \
               --health-probe-bind-address)";
    serves(&err, &addr, all);
}

/// A loop stuck in a tick (paused between its write-ahead save and its creates, longer than
/// a tick's budget of 4 × --request-timeout plus two intervals) fails liveness; once the
/// tick ends, liveness passes again.
#[test]
fn liveness_fails_while_the_loop_is_stuck_and_recovers() {
    let w: World = SimWorld::new().app("stuck").start();
    let p = free_addr();
    let c = spawn({
        let front = [
            "--request-timeout",
            "1s",
            "--health-probe-bind-address",
            &p,
            "run",
        ];
        let mut c = w.cmd(&[&front[..], &ticking("2", "200ms")].concat());
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
    assert!(!stop("run", c).contains("panicked"));
}

// Hostile clients (issue 30, item 3): each leaves the process alive, its memory flat, and a
// fresh client's /healthz answered within 1.5 s, because the loop answers the endpoints
// itself, non-blocking and bounded (src/controller/serve.rs).

/// A `run` at rest serving `/metrics` and the probes on addresses of their own, ready:
/// (the world, the process, the metrics address, the probe address).
fn at_rest() -> (World, Child, String, String) {
    serving("calm", 1)
}

/// `run --target TARGET` of app `app` serving `/metrics` and the probes on addresses of
/// their own, ready, its metrics showing `target` running: (the world, the process, the
/// metrics address, the probe address).
fn serving(app: &str, target: u32) -> (World, Child, String, String) {
    let w = SimWorld::new().app(app).start();
    let (m, p) = (free_addr(), free_addr());
    let t = target.to_string();
    let c = spawn(w.cmd(&[
        "--metrics-bind-address",
        &m,
        "--health-probe-bind-address",
        &p,
        "run",
        "--target",
        &t,
    ]));
    until(&p, "/readyz", 20, |c, _| c == 200);
    let running = format!("podalloc_running{{app=\"{app}\",namespace=\"default\"}} {target}");
    until(&m, "/metrics", 20, |_, b| b.contains(&running));
    (w, c, m, p)
}

/// The resident memory of process `pid` in KiB (`VmRSS` of `/proc/PID/status`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// How many descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A fresh client's `GET /healthz` is answered 200 within 1.5 s, while the process lives.
fn fresh_healthz_in_time(c: &mut Child, p: &str) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(1500)))
        .build()
        .into();
    let t = Instant::now();
    let r = agent.get(format!("http://{p}/healthz")).call();
    let took = t.elapsed();
    assert!(c.try_wait().unwrap().is_none(), "the process has ended");
    let code = r.map(|r| r.status().as_u16());
    assert_eq!(code.ok(), Some(200), "took {took:?}");
    assert!(took < Duration::from_millis(1500), "took {took:?}");
}

/// The memory has not grown by more than 4 MiB since `before` (KiB).
fn flat(pid: u32, before: u64) {
    let now = rss_kib(pid);
    assert!(now < before + 4096, "VmRSS {before} KiB → {now} KiB");
}

/// After a hostile client: a fresh client's `/healthz` is answered in time, the memory
/// (VmRSS `before`, KiB) stayed flat, and `run` stops as asked.
fn held_up(mut c: Child, probe: &str, before: u64) {
    fresh_healthz_in_time(&mut c, probe);
    flat(c.id(), before);
    stop("run", c);
}

fn raw(addr: &str) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Once aborted the process (exit 134): the allocation of the announced body.
#[test]
fn a_healthz_announcing_a_100_gb_body_is_refused_413() {
    use std::io::{Read, Write};
    let (_w, c, _m, p) = at_rest();
    let before = rss_kib(c.id());
    let mut s = raw(&p);
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    assert!(answer.contains("Connection: close"), "{answer}");
    held_up(c, &p, before);
}

/// RFC 9112 §6.3: two differing `Content-Length`s are a 400 and the connection closed. The
/// first one used to win, and the "body" the other announced was read as a second request
/// (two 200s).
#[test]
fn conflicting_content_lengths_are_refused_400_and_closed() {
    use std::io::{Read, Write};
    let (_w, c, _m, p) = at_rest();
    let before = rss_kib(c.id());
    let mut s = raw(&p);
    s.write_all(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 24\r\n\r\n\
          GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(answer.contains("Connection: close"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    held_up(c, &p, before);
}

#[test]
fn a_pipelining_client_that_never_reads_holds_no_one() {
    use std::io::Write;
    let (_w, mut c, m, p) = at_rest();
    let before = rss_kib(c.id());
    let mut s = raw(&m);
    let writer = std::thread::spawn(move || {
        let req = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
        // Until its buffers are full and the writes time out: it never reads an answer.
        let sent = (0..200).take_while(|_| s.write_all(&req).is_ok()).count();
        (s, sent)
    });
    std::thread::sleep(Duration::from_millis(1500));
    fresh_healthz_in_time(&mut c, &p);
    let (s, sent) = writer.join().unwrap();
    assert!(sent < 200, "every request was taken in: {sent} thousand");
    fresh_healthz_in_time(&mut c, &p);
    flat(c.id(), before);
    drop(s);
    stop("run", c);
}

#[test]
fn a_silent_half_request_holds_no_one() {
    use std::io::Write;
    let (_w, mut c, _m, p) = at_rest();
    let mut silent: Vec<_> = (0..10).map(|_| raw(&p)).collect();
    for s in &mut silent {
        s.write_all(b"GET /heal").unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    fresh_healthz_in_time(&mut c, &p);
    fresh_healthz_in_time(&mut c, &p);
    stop("run", c);
}

#[test]
fn an_endless_header_is_cut_at_8_kib() {
    use std::io::Write;
    let (_w, c, _m, p) = at_rest();
    let before = rss_kib(c.id());
    let mut s = raw(&p);
    let t = Instant::now();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        .unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    // 64 MiB at most: the server stops reading at 8 KiB, answers 431 and closes.
    let written = (0..1024)
        .take_while(|_| s.write_all(&chunk).is_ok())
        .count();
    assert!(written < 1024, "64 MiB of one header were taken in");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    held_up(c, &p, before);
}

#[test]
fn three_thousand_connections_hold_no_one() {
    let (_w, mut c, _m, p) = at_rest();
    let before = (rss_kib(c.id()), open_fds(c.id()));
    let held: Vec<_> = (0..3000)
        .map(|_| std::net::TcpStream::connect(&p).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    fresh_healthz_in_time(&mut c, &p);
    let fds = open_fds(c.id());
    assert!(fds <= before.1 + 64 + 1, "{} → {fds} descriptors", before.1);
    flat(c.id(), before.0);
    drop(held);
    fresh_healthz_in_time(&mut c, &p);
    stop("run", c);
}

/// The names of process `pid`'s threads (`/proc/PID/task/*/comm`), sorted.
fn threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect();
    names.sort();
    names
}

/// One thread (issue 30): a `run --leader-elect` at rest, both endpoints served, its pods'
/// Events posted, runs the loop alone (16 threads once, with tiny_http's; 3 with the
/// watchdog and the election thread); so does `apps --discover --leader-elect` with both
/// endpoints. The loop renews the Lease itself: it still leads after 2.5 s at rest on a 2 s
/// renew deadline. On both servers.
mod at_rest_run_and_apps_run_one_thread {
    use super::*;
    use crate::both::{Env, Pods};

    /// `cmd ARGS` with both endpoints and a fast election; the process, its metrics and
    /// its probe address once `/metrics` shows `series`.
    fn endpoints_up(mut cmd: Command, args: &[&str], series: &str) -> (Child, String, String) {
        let (m, p) = (free_addr(), free_addr());
        let mut all = vec![
            "--metrics-bind-address",
            &m,
            "--health-probe-bind-address",
            &p,
        ];
        all.extend(args);
        cmd.args(crate::util::with_fast_leader_elect(&all));
        let c = spawn(cmd);
        until(&m, "/metrics", 40, |_, b| b.contains(series));
        (c, m, p)
    }

    fn body(e: &Env) {
        let running = format!(
            "podalloc_running{{app=\"{}\",namespace=\"{}\"}} 2",
            e.app, e.ns
        );
        let args = ["run", "--target", "2"];
        let (mut c, m, p) = endpoints_up(e.cmd(&[]), &args, &running);
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(threads(c.id()), ["podalloc"], "run at rest");
        let (_, metrics) = get(&m, "/metrics").unwrap();
        let leading = format!(
            "podalloc_is_leader{{app=\"{}\",namespace=\"{}\"}}",
            e.app, e.ns
        );
        assert_eq!(sample(&metrics, &leading), 1.0, "{metrics}");
        fresh_healthz_in_time(&mut c, &p);
        stop("run", c);

        e.create_pod(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "drv", "labels": {"spark-role": "driver", "spark-app-selector": "two"},
            "annotations": {"podalloc.io/executors": "1"}},
            "spec": {"containers": [{"name": "d", "image": "spark"}]}}));
        let mut cmd = e.connect(e.token());
        cmd.args(["--batch-delay", "100ms", "--image", "img"]);
        let args = [
            "apps",
            "--discover",
            "spark-role=driver",
            "--state-configmaps",
            "podalloc-state",
        ];
        let series = format!("podalloc_running{{app=\"two\",namespace=\"{}\"}} 1", e.ns);
        let (mut c, _, p) = endpoints_up(cmd, &args, &series);
        std::thread::sleep(Duration::from_millis(2500));
        assert_eq!(threads(c.id()), ["podalloc"], "apps at rest");
        fresh_healthz_in_time(&mut c, &p);
        stop("apps", c);
    }

    #[test]
    fn on_sim() {
        body(&Env::sim("one", &Pods::default()));
    }

    /// The server given by name: its lookups run on a helper joined before they return
    /// (`kube/resolver.rs`), so at rest the loop is still alone.
    #[test]
    fn on_sim_by_name() {
        body(&Env::sim("one", &Pods::default()).by_name());
    }

    #[test]
    fn on_real() {
        if let Some(e) = Env::real("one_thread", "one", &Pods::default()) {
            body(&e);
        }
    }
}

/// A `run --leader-elect` standby serves `podalloc_is_leader 0` on `--metrics-bind-address`
/// (issue 28 item 5), not an empty body (found by a new-user trial: only `--metrics-file`
/// had it).
#[test]
fn a_standby_serves_is_leader_0_on_its_metrics_address() {
    let w = SimWorld::new().app("ha").no_state_file().start();
    let (a, b) = (w.path("a.json"), w.path("b.json"));
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let leader = {
        let mut c = w.cmd(&["--state-file", a, "run", "--target", "1", "--leader-elect"]);
        c.env("POD_NAME", "pod-a");
        spawn(c)
    };
    let m = free_addr();
    let standby = {
        let mut c = w.cmd(&[
            "--metrics-bind-address",
            &m,
            "--state-file",
            b,
            "run",
            "--target",
            "1",
            "--leader-elect",
        ]);
        c.env("POD_NAME", "pod-b");
        spawn(c)
    };
    // Killed on drop if an assertion below fails (a panicking test left both running).
    let (mut standby, mut leader) = (Bg(Some(standby)), Bg(Some(leader)));
    let (_, body) = until(&m, "/metrics", 30, |c, b| {
        c == 200 && b.contains("podalloc_is_leader{app=\"ha\",namespace=\"default\"} 0")
    });
    assert!(body.contains("# TYPE podalloc_is_leader gauge"), "{body}");
    let both = vec![standby.0.take().unwrap(), leader.0.take().unwrap()];
    crate::util::stop_all("run", both);
}

/// A DNS server on port 53 of a loopback address of its own that answers every query for
/// any name (an A query: 127.0.0.1; others: no record) only `delay` after it came: the
/// system resolver of a process pointed at it (its `/etc/resolv.conf` replaced in a mount
/// namespace of its own, [`behind_slow_dns`]) takes that long to look up a name.
struct SlowDns {
    ip: std::net::Ipv4Addr,
    /// Queries received and answers sent.
    counts: Arc<[AtomicUsize; 2]>,
    stop: Arc<AtomicBool>,
}

impl SlowDns {
    /// `None` when port 53 cannot be bound (not root).
    fn start(delay: Duration) -> Option<SlowDns> {
        // An address no other test (or process) of this machine's uses.
        let net = (std::process::id() % 250) as u8;
        let (socket, ip) = (1..=250u8).find_map(|host| {
            let ip = std::net::Ipv4Addr::new(127, 77, net, host);
            Some((std::net::UdpSocket::bind((ip, 53)).ok()?, ip))
        })?;
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let dns = SlowDns {
            ip,
            counts: Default::default(),
            stop: Default::default(),
        };
        let (counts, stop) = (dns.counts.clone(), dns.stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stop.load(SeqCst) {
                let Ok((n, from)) = socket.recv_from(&mut buf) else {
                    continue;
                };
                counts[0].fetch_add(1, SeqCst);
                let (query, socket, counts) = (
                    buf[..n].to_vec(),
                    socket.try_clone().unwrap(),
                    counts.clone(),
                );
                std::thread::spawn(move || {
                    std::thread::sleep(delay);
                    let _ = socket.send_to(&dns_answer(&query), from);
                    counts[1].fetch_add(1, SeqCst);
                });
            }
        });
        Some(dns)
    }

    /// Queries received and not yet answered.
    fn pending(&self) -> usize {
        self.counts[0].load(SeqCst) - self.counts[1].load(SeqCst)
    }
}

impl Drop for SlowDns {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}

/// The answer to DNS `query`: its id and question; for an A question, 127.0.0.1.
fn dns_answer(query: &[u8]) -> Vec<u8> {
    let mut i = 12;
    while query[i] != 0 {
        i += usize::from(query[i]) + 1;
    }
    let a = query[i + 1..i + 3] == [0, 1];
    let mut r = query[..2].to_vec();
    r.extend([0x81, 0x80, 0, 1, 0, u8::from(a), 0, 0, 0, 0]);
    r.extend(&query[12..i + 5]);
    if a {
        r.extend([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4, 127, 0, 0, 1]);
    }
    r
}

/// `c` run in a mount namespace of its own whose `/etc/resolv.conf` names only `dns` (and
/// whose `/etc/nsswitch.conf` looks names up in `/etc/hosts`, then DNS), written in `dir`:
/// the machine's own files are left as they are. `None` when mount namespaces cannot be
/// made here.
fn behind_slow_dns(c: &Command, dns: &SlowDns, dir: &std::path::Path) -> Option<Command> {
    let ok = Command::new("unshare").args(["-m", "true"]).status();
    if !ok.is_ok_and(|s| s.success()) {
        return None;
    }
    let (resolv, nss) = (dir.join("resolv.conf"), dir.join("nsswitch.conf"));
    let text = format!("nameserver {}\noptions timeout:30 attempts:1\n", dns.ip);
    std::fs::write(&resolv, text).unwrap();
    std::fs::write(&nss, "hosts: files dns\n").unwrap();
    let script = "mount --bind \"$1\" /etc/resolv.conf && mount --bind \"$2\" \
                  /etc/nsswitch.conf && shift 2 && exec \"$@\"";
    let mut u = Command::new("unshare");
    u.args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .arg(&resolv)
        .arg(&nss)
        .arg(c.get_program())
        .args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => u.env(k, v),
            None => u.env_remove(k),
        };
    }
    Some(u)
}

/// A server given by a name whose lookup takes 4 s (a slow DNS server: the system's real
/// getaddrinfo, `kube/resolver.rs`): `run --leader-elect` serves `/healthz` within 1.5 s
/// while its Lease client looks the name up for its first connection, runs one thread
/// besides the lookup's meanwhile, then acquires the Lease and, at rest, runs one thread.
/// Needs root (port 53, a mount namespace); says so in one line and returns without. On
/// both servers.
mod a_slow_name_lookup_holds_up_neither_the_probes_nor_the_lease {
    use super::*;
    use crate::both::{Env, Pods};

    const NAME: &str = "slow-api.podalloc.test";

    fn body(e: Env, dns: &SlowDns) {
        let e = e.named(NAME);
        let (m, p) = (free_addr(), free_addr());
        let state = format!("configmap:{}-state", e.app);
        let mut c = e.cmd(&[]);
        c.args(["--tls-server-name", "localhost", "--state-store", &state])
            .args([
                "--metrics-bind-address",
                &m,
                "--health-probe-bind-address",
                &p,
            ])
            .args(["run", "--target", "2", "--leader-elect"]);
        let Some(c) = behind_slow_dns(&c, dns, e.dir.path()) else {
            crate::util::not_run_here(
                "a_slow_name_lookup…",
                "no mount namespace here (unshare -m needs root)",
            );
            return;
        };
        let started = Instant::now();
        let mut c = spawn(c);
        // The search for the app's home looked the name up first (4 s); then the endpoints
        // are served, and the loop's first Lease attempt connects its own client: another
        // lookup.
        until(&p, "/healthz", 30, |code, _| code == 200);
        let t = Instant::now();
        while dns.pending() == 0 {
            assert!(t.elapsed() < Duration::from_secs(10), "no second lookup");
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("a lookup pending {:.1?} after the start", started.elapsed());
        fresh_healthz_in_time(&mut c, &p);
        assert_eq!(
            threads(c.id()),
            ["kube-lookup", "podalloc"],
            "during the lookup"
        );
        assert!(
            dns.pending() > 0,
            "the lookup ended before the probe was answered"
        );
        let series =
            |name: &str, n: u32| format!("{name}{{app=\"{}\",namespace=\"{}\"}} {n}", e.app, e.ns);
        let leading = series("podalloc_is_leader", 1);
        let t = Instant::now();
        while !get(&m, "/metrics").is_some_and(|(_, b)| b.contains(&leading)) {
            if t.elapsed() > Duration::from_secs(30) {
                let out = crate::util::stop_all("run", vec![c]);
                panic!("never led: {}", stderr(&out[0]));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("leading {:.1?} after the start", started.elapsed());
        let running = series("podalloc_running", 2);
        until(&m, "/metrics", 30, |_, b| b.contains(&running));
        // At rest (a lookup for the Events' client may still be under way): the loop alone.
        let t = Instant::now();
        while threads(c.id()) != ["podalloc"] {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{:?}",
                threads(c.id())
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        fresh_healthz_in_time(&mut c, &p);
        stop("run", c);
    }

    /// The slow DNS server, or `None` (after one line; under CI a failure) when port 53
    /// cannot be bound here.
    fn dns() -> Option<SlowDns> {
        let dns = SlowDns::start(Duration::from_secs(4));
        if dns.is_none() {
            crate::util::not_run_here(
                "a_slow_name_lookup…",
                "port 53 cannot be bound here (run as root)",
            );
        }
        dns
    }

    #[test]
    fn on_sim() {
        if let Some(dns) = dns() {
            body(Env::sim("slowdns", &Pods::default()), &dns);
        }
    }

    #[test]
    fn on_real() {
        if let Some(dns) = dns() {
            if let Some(e) = Env::real("slow_dns", "slowdns", &Pods::default()) {
                body(e, &dns);
            }
        }
    }
}

// Leadership on `/metrics` (issue 30: trial findings): an `apps` standby served an empty
// body; an `apps` leader that stopped acting still said `podalloc_is_leader 1` until it led
// and ticked again; a `run` that led again still said 0 until its next tick, up to an idle
// interval later. `/metrics` now answers with the election's leadership at the moment it
// is scraped.
mod leadership {
    use super::*;
    use crate::both::{both, Env, Pods, AT_REST};
    use crate::leader::{
        apps_candidate, apps_candidate_with, lease_holder, put_lease_named, server,
    };
    use crate::util::{spawn_replica, with_fast_leader_elect, FAST_LEADER_ELECT};

    /// Whether the Prometheus text `body` has every line of `lines` (samples and values).
    fn has(body: &str, lines: &str) -> bool {
        lines.lines().all(|line| body.lines().any(|l| l == line))
    }

    /// The sample lines of the leadership series (`podalloc_is_leader`,
    /// `podalloc_leader_transitions_total`, whatever their labels) in the Prometheus text
    /// `body`.
    fn leadership_samples(body: &str) -> Vec<&str> {
        let sample = |l: &str, name: &str| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        };
        body.lines()
            .filter(|l| {
                sample(l, "podalloc_is_leader") || sample(l, "podalloc_leader_transitions_total")
            })
            .collect()
    }

    /// Asserts that `body` (`what`'s text) has one sample of each leadership series, the
    /// process's, without app labels (issue 30: trial findings: `apps` served one per app
    /// beside it, so `sum(podalloc_is_leader)` counted N+1 leaders, and in `--metrics-file`
    /// the apps' said 1 while the process's said 0), `is_leader` saying `leading`.
    fn one_unlabeled_leadership(body: &str, what: &str, leading: u32) {
        let samples = leadership_samples(body);
        assert_eq!(samples.len(), 2, "{what}: {samples:?}\n{body}");
        assert!(
            samples.contains(&format!("podalloc_is_leader {leading}").as_str()),
            "{what}: {samples:?}"
        );
        assert!(
            samples.iter().all(|l| !l.contains('{')),
            "{what}: {samples:?}"
        );
    }

    /// Reads `--metrics-file` `path` until it has every line of `lines` (at most 5 s).
    fn file_having(path: &std::path::Path, lines: &str) -> String {
        let t = Instant::now();
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            if has(&text, lines) || t.elapsed() > Duration::from_secs(5) {
                return text;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Reads `--metrics-file` `path` until it says `podalloc_is_leader LEADING`: written at
    /// once on a change of leadership, as `/metrics` is.
    fn file_saying(path: &std::path::Path, leading: u32) -> String {
        file_having(path, &format!("podalloc_is_leader {leading}"))
    }

    /// Polls `/metrics` at `addr` until it has every line of `lines`; how long that took.
    fn until_lines(addr: &str, secs: u64, lines: &[&str]) -> Duration {
        let t = Instant::now();
        until(addr, "/metrics", secs, |_, b| {
            lines.iter().all(|l| has(b, l))
        });
        t.elapsed()
    }

    /// Waits until Lease `lease` names `who` (at most 30 s).
    fn until_held(e: &Env, lease: &str, who: &str) {
        let t = Instant::now();
        while lease_holder(e, lease).as_deref() != Some(who) {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{who} never held {lease}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Takes Lease `lease` from `leader` (the `what` process, serving `/metrics` at `m`) at
    /// rest: its holder edited to a stranger, who never renews it. Waits until `/metrics`
    /// says, with `series(name, value)`'s samples, that it stopped acting (seen at its next
    /// renewal, a retry period of 500 ms later) and, once the stranger's Lease has gone a
    /// lease duration (3 s) without a renewal, that it leads again; reports how long each
    /// took after the edit, and stops it. `check` is called with the leadership (0, then 1)
    /// once `/metrics` says each.
    fn lose_and_retake(
        e: &Env,
        (what, mut leader): (&str, Bg),
        (m, lease): (&str, &str),
        series: impl Fn(&str, u32) -> String,
        check: impl Fn(u32),
    ) {
        let holder = lease_holder(e, lease).expect("a Lease");
        // At rest: its next tick is an idle interval (30 s) away.
        std::thread::sleep(Duration::from_secs(1));
        put_lease_named(
            e,
            lease,
            serde_json::json!({"holderIdentity": "someone-else"}),
        );
        let t = Instant::now();
        let transitions = |n| series("podalloc_leader_transitions_total", n);
        until_lines(m, 5, &[&series("podalloc_is_leader", 0), &transitions(2)]);
        let lost = t.elapsed();
        check(0);
        until_lines(m, 15, &[&series("podalloc_is_leader", 1), &transitions(3)]);
        check(1);
        assert_eq!(lease_holder(e, lease), Some(holder));
        eprintln!(
            "endpoints[{}]: the {what} leader's /metrics said is_leader 0 {lost:.2?} after its \
             Lease was taken, 1 again {:.2?} after",
            server(e),
            t.elapsed()
        );
        let err = stop(what, leader.take());
        assert!(err.contains("stopped acting at once"), "{err}");
    }

    // The standby knows no app (it neither ticks nor discovers): its leadership is the
    // process's, without app labels, as its API requests are.
    both!(
        an_apps_standby_serves_is_leader_0_then_1_once_it_takes_over,
        "ha",
        Pods::default(),
        |e| {
            let mut a = Bg(Some(apps_candidate(e, "a")));
            until_held(e, "podalloc-apps", "pod-a");
            let m = free_addr();
            let elect = [&FAST_LEADER_ELECT[..], &["--metrics-bind-address", &m]].concat();
            let mut b = Bg(Some(apps_candidate_with(e, "b", &elect)));
            let standby = [
                "podalloc_is_leader 0",
                "podalloc_leader_transitions_total 0",
            ];
            until_lines(&m, 30, &standby);
            assert_eq!(lease_holder(e, "podalloc-apps").as_deref(), Some("pod-a"));
            // a's SIGTERM releases the Lease; b takes it within about a retry period.
            stop("apps", a.take());
            let leading = [
                "podalloc_is_leader 1",
                "podalloc_leader_transitions_total 1",
            ];
            let took = until_lines(&m, 10, &leading);
            one_unlabeled_leadership(&get(&m, "/metrics").unwrap().1, "/metrics", 1);
            eprintln!(
                "endpoints[{}]: the apps standby's /metrics said is_leader 1 {took:.2?} after \
                 the leader's exit",
                server(e)
            );
            assert_eq!(lease_holder(e, "podalloc-apps").as_deref(), Some("pod-b"));
            stop("apps", b.take());
        }
    );

    // An `apps` leader at rest, one app discovered: its leadership, the process's alone
    // (no app labels: one Lease for every app), follows the Lease in /metrics and in
    // --metrics-file.
    both!(
        an_apps_leader_serves_is_leader_0_once_it_stops_acting_and_1_once_it_leads_again,
        "ha",
        Pods::default(),
        |e| {
            e.create_pod(&serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "drv", "labels": {"spark-role": "driver",
                "spark-app-selector": "etl"}, "annotations": {"podalloc.io/executors": "1"}},
                "spec": {"containers": [{"name": "d", "image": "spark"}]}}));
            let m = free_addr();
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("apps.prom");
            let f = file.to_str().unwrap();
            let flags = ["--metrics-bind-address", &m, "--metrics-file", f];
            let elect = [&FAST_LEADER_ELECT[..], &flags].concat();
            let a = Bg(Some(apps_candidate_with(e, "a", &elect)));
            let running = format!("podalloc_running{{app=\"etl\",namespace=\"{}\"}} 1", e.ns);
            until_lines(&m, 30, &[&running]);
            let check = |n| {
                let (_, body) = get(&m, "/metrics").unwrap();
                one_unlabeled_leadership(&body, "/metrics", n);
                one_unlabeled_leadership(&file_saying(&file, n), "--metrics-file", n);
            };
            let text = file_having(&file, &running);
            assert!(has(&text, &running), "{text}");
            check(1);
            let series = |name: &str, n| format!("{name} {n}");
            lose_and_retake(e, ("apps", a), (&m, "podalloc-apps"), series, check);
        }
    );

    // A `run --leader-elect` at rest ([`AT_REST`]: its ticks 30 s apart).
    both!(
        a_run_leader_serves_is_leader_0_once_it_stops_acting_and_1_once_it_leads_again,
        "ha",
        Pods::default(),
        |e| {
            let m = free_addr();
            let front = [
                "--metrics-bind-address",
                &m,
                "--state-store",
                "configmap:ha-state",
            ];
            let args = [&front[..], &["run"], &AT_REST].concat();
            let mut cmd = e.candidate_cmd("a", &with_fast_leader_elect(&args));
            let a = Bg(Some(spawn_replica(&mut cmd, "pod-a", Stdio::piped())));
            let series = |name: &str, n| format!("{name}{{app=\"ha\",namespace=\"{}\"}} {n}", e.ns);
            until_lines(&m, 30, &[&series("podalloc_running", 2)]);
            lose_and_retake(e, ("run", a), (&m, "podalloc-ha"), series, |_| ());
        }
    );
}
