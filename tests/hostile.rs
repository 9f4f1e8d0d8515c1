//! A hostile API server: answers that never come, bodies that trickle, 2xx bodies that are
//! not what they claim, redirects. Each test runs the real binary against the simulator and
//! checks what docs/faults.md promises: the exit code, the time it takes, and that the state
//! and the pods stay consistent.

use crate::util::{code, stderr as err, SimWorld, World};
use std::process::Stdio;
use std::time::{Duration, Instant};

const APP: &str = "hostile-app";

fn world(faults: &[&str]) -> World {
    SimWorld::fast(APP, "hostile-token")
        .startup(Duration::from_millis(100))
        .faults(faults)
        .start()
}

/// Runs `args` (with a 3 s timeout among them) against a world with `faults` and checks that
/// it exits `want` within 6 s, its standard error saying `says`. Returns the world.
fn ends_in_time(faults: &[&str], args: &[&str], want: i32, says: &str) -> World {
    let w = world(faults);
    let started = Instant::now();
    let out = w.run(args);
    let took = started.elapsed();
    assert_eq!(code(&out), want, "{}", err(&out));
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert!(err(&out).contains(says), "{}", err(&out));
    w
}

#[test]
fn run_timeout_is_honoured_while_a_list_hangs() {
    ends_in_time(
        &["list:delay:100000"],
        &["run", "--target", "3", "--timeout", "3s"],
        5,
        "--timeout of 3s passed",
    );
}

#[cfg(unix)]
#[test]
fn a_second_signal_aborts_a_hung_tick_at_once() {
    // A create that hangs: the tick has saved its write-ahead state, so the first signal
    // lets it finish (a list that hangs, before anything is written, stops at the first
    // signal: tests/steer_apps.rs).
    let w = world(&["create:delay:100000"]);
    let mut child = w
        .cmd(&["run", "--target", "3"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the first signal lets the tick finish"
    );
    let started = Instant::now();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(code(&out), 130, "{}", err(&out));
    let e = err(&out);
    let ack = e
        .find("SIGTERM received: finishing the current tick, SIGINT or SIGTERM again to abort")
        .expect(&e);
    let abort = e.find("second signal (SIGTERM): aborting now").expect(&e);
    assert!(ack < abort, "{e}");
    // Log lines like every other (they were bare `podalloc: …` lines): the app and namespace.
    for said in ["SIGTERM received: finishing", "second signal (SIGTERM)"] {
        let line = e.lines().find(|l| l.contains(said)).unwrap();
        assert!(line.contains(&format!(" app={APP} ns=default] ")), "{line}");
    }
    // The create never answered: the state is the write-ahead one (the ids it was about
    // to create, unacknowledged), nothing half-written; no pod was made.
    let st = w.state();
    assert_eq!(
        st["unacknowledged"].as_array().map(Vec::len),
        Some(3),
        "{st}"
    );
    assert_eq!(w.sim.stats().live_pods, 0);
}

/// A `run --leader-elect` leader whose intent read (a ConfigMap GET) hangs while the Lease
/// renewal it makes from inside that wait (the hook between requests) hangs too: SIGINT, then
/// after `gap` a second SIGINT, which must end the process with exit 130 within half a second
/// whatever the nested renewal waits for.
#[cfg(unix)]
fn second_signal_aborts_within_a_nested_lease_renewal(gap: Duration) {
    let w = world(&[]);
    let args = crate::util::with_fast_leader_elect(&[
        "--state-store",
        "configmap:hostile-state",
        "run",
        "--target",
        "2",
        "--idle-interval",
        "200ms",
    ]);
    let child = two_pods_live(&w, &mut w.cmd(&args));
    w.sim.set_faults(crate::util::rules(&[
        "cm-get:delay:100000",
        "lease-update:delay:100000",
    ]));
    // An intent read starts within 200 ms and a renewal falls due within 500 ms inside it.
    std::thread::sleep(Duration::from_millis(1200));
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    delivered(pid);
    std::thread::sleep(gap);
    let started = Instant::now();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    assert_eq!(code(&out), 130, "{}", err(&out));
    assert!(took < Duration::from_millis(500), "{took:?}: {}", err(&out));
}

/// Waits until the kernel has handed process `pid`'s pending SIGINT to its handler (two
/// SIGINTs pending at once are one for the kernel too).
#[cfg(unix)]
fn delivered(pid: libc::pid_t) {
    let t = Instant::now();
    let pending = || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        (status.lines())
            .filter_map(|l| l.strip_prefix("ShdPnd:").or(l.strip_prefix("SigPnd:")))
            .any(|m| u64::from_str_radix(m.trim(), 16).unwrap() & (1 << (libc::SIGINT - 1)) != 0)
    };
    while pending() {
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "SIGINT never delivered"
        );
    }
}

#[cfg(unix)]
#[test]
fn a_second_signal_aborts_during_a_nested_lease_renewal() {
    second_signal_aborts_within_a_nested_lease_renewal(Duration::from_millis(300));
}

/// Two signals between two reads of the signals (the second sent as soon as the first has
/// reached the handler, well within one 50 ms slice) are two: signal-hook's `Signals`
/// reported them as one, and the process did not abort.
#[cfg(unix)]
#[test]
fn two_signals_at_once_abort() {
    second_signal_aborts_within_a_nested_lease_renewal(Duration::ZERO);
}

/// A server that is down (`silent` false: a closed port, refused and retried with
/// back-off) or that never answers (a listener nobody accepts from: the TLS handshake
/// waits), for the startup tests: its URL, and the listener to keep while it is used.
#[cfg(unix)]
fn down(silent: bool) -> (Option<std::net::TcpListener>, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("https://{}", l.local_addr().unwrap());
    (silent.then_some(l), url)
}

/// Starts `args` against `url`, sends `sig` one second later (the process is still looking
/// for its app's home, or its Lease, which takes as long as the retries last against such a
/// server: about 38 s), and returns it with when the signal was sent. `ignored`: SIGINT is
/// ignored at exec, as a non-interactive shell starts a command with `&`.
#[cfg(unix)]
fn signalled_while_starting(
    url: &str,
    args: &[&str],
    (sig, ignored): (i32, bool),
) -> (std::process::Child, Instant) {
    use std::os::unix::process::CommandExt;
    let mut c = crate::util::podalloc();
    c.args([
        "--server",
        url,
        "--token",
        "t",
        "--insecure-skip-tls-verify",
    ])
    .args(["--image", "registry.example/spark:3.5.0", "-n", "default"])
    .args(args)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if ignored {
        // SAFETY: signal(2) between fork and exec, async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    let child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
    (child, Instant::now())
}

/// The process ended within 2 s of the signal, exit 0, with the line of a stop while
/// starting. Returns its standard error.
#[cfg(unix)]
fn stopped_while_starting(what: &str, (child, sent): (std::process::Child, Instant)) -> String {
    let out = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    let e = err(&out);
    eprintln!(
        "{what}: exited {:?} in {took:.2?} after the signal",
        out.status
    );
    assert_eq!(code(&out), 0, "{what}: {e}");
    assert!(took < Duration::from_secs(2), "{what}: {took:?}: {e}");
    assert!(
        e.contains("received while starting (before the first tick: connecting, finding the app's home): stopping now (exit 0); nothing was claimed or saved"),
        "{what}: {e}"
    );
    e
}

/// SIGTERM or SIGINT (also one the shell's `&` ignored) while `run` and `apps` are still
/// starting against a server that is down or never answers ends them at once, exit 0: the
/// handlers are installed before the first request, whose waits run the loop's hook. They
/// were installed after the startup, so a signal during its retries (about 38 s) killed
/// the process (SIGTERM) or was ignored (SIGINT after `&`).
#[cfg(unix)]
#[test]
fn a_signal_while_starting_against_a_server_that_is_down_ends_the_process_at_once() {
    let run: &[&str] = &[
        "--app-id",
        "startup-app",
        "--state-store",
        "configmap:startup-state",
        "run",
        "--target",
        "2",
        "--leader-elect",
    ];
    let apps: &[&str] = &[
        "apps",
        "--discover",
        "spark-role=driver",
        "--state-configmaps",
        "startup",
        "--leader-elect",
    ];
    // The signal, and whether it is ignored at exec (bg: as a shell's `&` leaves SIGINT).
    let (sigterm, sigint_bg) = ((libc::SIGTERM, false), (libc::SIGINT, true));
    // What runs, whether the server is a silent listener (else a closed port), the signal.
    let cases = [
        ("run, closed port, SIGTERM", run, false, sigterm),
        ("run, silent server, SIGINT after &", run, true, sigint_bg),
        ("apps, silent server, SIGTERM", apps, true, sigterm),
        ("apps, closed port, SIGINT after &", apps, false, sigint_bg),
    ];
    std::thread::scope(|s| {
        for (what, args, silent, sig) in cases {
            s.spawn(move || {
                let (_listener, url) = down(silent);
                stopped_while_starting(what, signalled_while_starting(&url, args, sig));
            });
        }
    });
}

/// The same on the simulator while the app's Lease lookup hangs (the search for its home
/// reads it): the process ends at once, and nothing was written on the way out: every
/// request it made was a read, and neither its Lease nor its ConfigMap exists.
#[cfg(unix)]
#[test]
fn a_signal_during_a_hung_lease_lookup_at_startup_writes_nothing() {
    let w = world(&["lease-get:delay:100000"]);
    let mut c = w.cmd(&crate::util::with_fast_leader_elect(&[
        "--state-store",
        "configmap:hostile-state",
        "run",
        "--target",
        "2",
    ]));
    let child = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // SAFETY: kill(2) on our own child.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    stopped_while_starting("hung Lease lookup", (child, Instant::now()));
    // The Lease GET hung (logged only once answered): the search had listed the app's
    // ExecutorSets and ConfigMaps.
    let f = w.sim.stats().faults_injected;
    assert!(f.keys().any(|k| k.contains("lease-get")), "{f:?}");
    let log = w.sim.request_log();
    for line in log.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(r["method"], "GET", "{line}");
    }
    w.sim.set_faults(vec![]);
    for at in [
        format!("/apis/coordination.k8s.io/v1/namespaces/default/leases/podalloc-{APP}"),
        "/api/v1/namespaces/default/configmaps/hostile-state".to_string(),
    ] {
        assert_eq!(w.api("GET", &at, None).0, 404, "{at}");
    }
}

/// Spawns `cmd` (stderr piped) and waits, at most 20 s, until `w` has 2 live pods.
#[cfg(unix)]
fn two_pods_live(w: &World, cmd: &mut std::process::Command) -> std::process::Child {
    let child = (cmd.stdout(Stdio::null()).stderr(Stdio::piped()))
        .spawn()
        .unwrap();
    let t = Instant::now();
    while w.sim.stats().live_pods < 2 {
        assert!(t.elapsed() < Duration::from_secs(20), "never converged");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

/// Starts `run` with `args` on `w` and waits until it has converged on 2 pods and rests.
#[cfg(unix)]
fn resting(w: &World, args: &[&str]) -> std::process::Child {
    let mut all = vec!["run", "--target", "2", "--idle-interval", "30s"];
    all.extend_from_slice(args);
    let child = two_pods_live(w, &mut w.cmd(&all));
    // The pods run 100 ms after their creation; the tick after that converges.
    std::thread::sleep(Duration::from_secs(1));
    child
}

/// SIGTERMs `child` and waits for it: exit 0 within `within`. Returns its standard error.
#[cfg(unix)]
fn term(child: std::process::Child, within: Duration) -> String {
    let started = Instant::now();
    // SAFETY: kill(2) on our own child.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let out = child.wait_with_output().unwrap();
    let (took, e) = (started.elapsed(), err(&out));
    eprintln!("exited {:?} in {took:.2?} after SIGTERM", out.status);
    assert_eq!(code(&out), 0, "{e}");
    assert!(took < within, "{took:?}: {e}");
    e
}

/// The first signal's line says what the process finishes: between ticks nothing (it stops
/// now); during a Lease renewal between ticks, that call (it said "finishing the current
/// tick" whatever the loop was doing).
#[cfg(unix)]
#[test]
fn the_first_signal_says_what_the_process_finishes() {
    let w = world(&[]);
    let e = term(resting(&w, &[]), Duration::from_secs(1));
    let line = (e.lines())
        .find(|l| l.contains("SIGTERM received: "))
        .expect(&e);
    assert!(
        line.ends_with("SIGTERM received: no tick or Lease call in progress: stopping now"),
        "{e}"
    );
    assert!(!e.contains("finishing"), "{e}");
    // A leader at rest whose renewal hangs: the signal comes during that call, which ends at
    // the renew deadline (2 s); then the loop stops.
    let leader = resting(&w, &crate::util::FAST_LEADER_ELECT);
    w.sim
        .set_faults(crate::util::rules(&["lease-update:delay:100000"]));
    let t = Instant::now();
    while !(w.sim.stats().faults_injected.keys()).any(|k| k.contains("lease-update")) {
        assert!(t.elapsed() < Duration::from_secs(5), "no renewal");
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = term(leader, Duration::from_secs(6));
    let ack = e
        .find("SIGTERM received: finishing the Lease call in progress, SIGINT or SIGTERM again to abort")
        .expect(&e);
    let stop = e.find("signal received: stopping after").expect(&e);
    assert!(ack < stop, "{e}");
}

#[test]
fn reconcile_against_a_trickling_body_ends_within_the_request_timeout() {
    let w = ends_in_time(
        &["list:trickle"],
        &["reconcile", "--target", "3", "--request-timeout", "3s"],
        1,
        "within the request timeout of 3s (--request-timeout)",
    );
    assert!(!w.state_file().exists(), "state untouched");
    assert_eq!(w.sim.stats().live_pods, 0);
}

#[test]
fn garbage_and_proxy_pages_for_creates_are_ambiguous_and_retried_by_name() {
    // 20 % of creates are made but answered with garbage; 10 % more never reach the
    // server (a proxy's HTML page). Either way the create is ambiguous, and the next tick
    // settles it by name: no waiting for the creation timeout, no duplicates.
    let w = world(&["create:garbage@p=0.2", "create:html@p=0.1"]);
    let started = Instant::now();
    w.converge(30);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let f = w.sim.stats().faults_injected;
    assert!(f.keys().any(|k| k.contains("garbage")), "{f:?}");
    assert!(f.keys().any(|k| k.contains("html")), "{f:?}");
}

#[test]
fn a_body_that_does_not_say_its_kind_is_an_error() {
    // Pod list: the snapshot requires kind PodList.
    let w = world(&["list:no-kind@1"]);
    let out = w.run(&["reconcile", "--target", "2"]);
    assert_eq!(code(&out), 1, "{}", err(&out));
    assert!(err(&out).contains("PodList"), "{}", err(&out));
    assert!(!w.state_file().exists());
    // A created pod answered without kind: ambiguous, settled by name.
    w.sim
        .set_faults(crate::util::rules(&["create:no-kind@p=0.5"]));
    w.converge(4);
    // The ConfigMap store's read names the server and quotes the body.
    w.sim.set_faults(vec![]);
    w.ok(&[
        "--state-store",
        "configmap:hostile-state",
        "reconcile",
        "--target",
        "4",
    ]);
    w.sim
        .set_faults(crate::util::rules(&["cm-get:no-kind@always"]));
    let out = w.run(&["--state-store", "configmap:hostile-state", "status"]);
    let e = err(&out);
    assert_ne!(code(&out), 0, "{e}");
    assert!(e.contains("a body without kind, not a ConfigMap"), "{e}");
    assert!(e.contains(&w.sim.url()), "{e}");
}

#[test]
fn a_redirect_is_reported_with_its_location() {
    let w = world(&["list:redirect"]);
    let out = w.run(&["reconcile", "--target", "1"]);
    assert_eq!(code(&out), 1, "{}", err(&out));
    let e = err(&out);
    assert!(
        e.contains(
            "307 Redirect: the API server redirected to https://login.example.com/oauth2/start"
        ),
        "{e}"
    );
    assert!(
        e.contains("podalloc does not follow redirects: check --server"),
        "{e}"
    );
}

#[test]
fn a_list_page_over_the_cap_says_to_use_a_smaller_page_size() {
    let w = world(&[]);
    w.converge(6);
    let out = w.run(&["reconcile", "--target", "6", "--max-page-bytes", "4096"]);
    assert_eq!(code(&out), 1, "{}", err(&out));
    let e = err(&out);
    assert!(e.contains("larger than the cap of 4096 bytes"), "{e}");
    assert!(e.contains("use a smaller --page-size"), "{e}");
    w.ok(&[
        "reconcile",
        "--target",
        "6",
        "--max-page-bytes",
        "4096",
        "--page-size",
        "1",
    ]);
}
