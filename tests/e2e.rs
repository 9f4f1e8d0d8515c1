//! End-to-end: the real binary against the simulated API server over HTTPS (bearer token,
//! generated CA), as a user would run it.

use crate::util::{args, podalloc, stderr, stdout, SimWorld, World};
use podalloc_sim::SimOptions;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const APP: &str = "e2e-app";

fn world(tweak: impl FnOnce(&mut SimOptions)) -> World {
    SimWorld::quick(APP)
        .token("e2e-secret-token-0123456789")
        .options(tweak)
        .start()
}

#[test]
fn run_until_converged_reaches_target_without_overshoot() {
    let w = world(|_| {});
    let out = w.run_to(12, "60s");
    let log = stderr(&out);
    assert!(
        log.contains("target=12 running=12 pending=0 unacknowledged=0"),
        "{log}"
    );
    assert_eq!(w.live(), (1..=12).collect::<Vec<_>>());
    assert_eq!(w.max_live(), 12, "never more executor pods than the target");
    // One summary line per tick, and batches of at most 5.
    assert!(
        log.lines().filter(|l| l.contains(" tick ")).count() >= 3,
        "{log}"
    );
    let st = w.state();
    assert_eq!(st["target"], 12);
    assert_eq!(st["last_executor_id"], 12);
    // Converged: another tick changes nothing.
    w.ok(&["reconcile"]);
    assert_eq!(w.sim.stats().creates, 12);
}

#[test]
fn one_tick_creates_one_batch_then_waits_for_pending() {
    let w = world(|o| o.startup_latency = Duration::from_secs(60));
    w.ok(&["reconcile", "--target", "8"]);
    assert_eq!(w.executors().len(), 5);
    let st = w.state();
    assert_eq!(st["unacknowledged"].as_array().unwrap().len(), 5);
    // Pods are pending: no new batch.
    w.ok(&["reconcile"]);
    assert_eq!(w.executors().len(), 5);
    assert_eq!(w.state()["unacknowledged"].as_array().unwrap().len(), 0);
}

#[test]
fn scale_down_deletes_excess_pending_never_running() {
    let w = world(|o| o.startup_latency = Duration::from_secs(60));
    w.ok(&["reconcile", "--target", "4"]);
    w.wait_for("4 pending pods", |w| w.executors().len() == 4);
    w.ok(&["scale", "1"]);
    // A pod the kubelet changed between the read and the delete (here: scheduled) is left to
    // the next tick by the delete's preconditions; a few ticks finish the job.
    for _ in 0..10 {
        if w.live().len() == 1 {
            break;
        }
        w.ok(&["reconcile"]);
    }
    w.wait_for("excess deleted", |w| w.live().len() == 1);
    assert_eq!(w.state()["target"], 1);
    // Running pods above the target stay (Spark's rule).
    let w = world(|_| {});
    w.run_to(3, "30s");
    w.ok(&["scale", "1"]);
    assert_eq!(w.live(), vec![1, 2, 3]);
}

#[test]
fn remove_deletes_named_executors_and_lowers_target() {
    let w = world(|_| {});
    w.run_to(4, "30s");
    w.ok(&["remove", "2", "3"]);
    assert_eq!(w.state()["target"], 2);
    w.wait_for("removed pods gone", |w| w.live() == vec![1, 4]);
    let out = w.ok(&["status", "--output", "json"]);
    let s: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(s["target"], 2);
    assert_eq!(s["running"], 2);
    let home = s["home"].as_str().unwrap_or_default();
    assert!(home.starts_with("file:/") && home.ends_with(".json"), "{s}");
    assert!(s.get("state_file").is_none(), "{s}");
    // Ids are never reused: scaling up again continues above 4.
    w.run_to(3, "30s");
    assert_eq!(w.live(), vec![1, 4, 5]);
}

#[test]
fn failed_executor_is_deleted_and_replaced() {
    let w = world(|_| {});
    w.run_to(3, "30s");
    let (code, _) = w.api(
        "POST",
        &format!("/sim/pods/default/{APP}-exec-2/phase"),
        Some(&serde_json::json!({"phase": "Failed", "exitCode": 137, "reason": "OOMKilled"})),
    );
    assert_eq!(code, 200);
    w.ok(&["run", "--until-converged", "--timeout", "30s"]);
    assert_eq!(w.live(), vec![1, 3, 4]);
    assert!(
        w.executors().iter().all(|(id, _, _)| *id != 2),
        "the failed pod is deleted"
    );
}

#[test]
fn driver_pod_missing_is_an_error_naming_it() {
    let w = world(|_| {});
    let out = w.run(&[
        "--driver-pod",
        "no-such-driver",
        "reconcile",
        "--target",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("no-such-driver") && err.contains("default"),
        "{err}"
    );
    assert!(w.executors().is_empty());
}

#[test]
fn executors_are_owned_by_the_driver_pod() {
    let w = world(|_| {});
    let driver = serde_json::json!({"metadata": {"name": "drv", "labels": {"spark-role": "driver"}},
        "spec": {"containers": [{"name": "d", "image": "spark"}]}, "status": {"phase": "Running"}});
    let (code, _) = w.api("POST", "/sim/pods/default", Some(&driver));
    assert!(code == 200 || code == 201, "{code}");
    w.ok(&["--driver-pod", "drv", "reconcile", "--target", "1"]);
    let (_, pod) = w.api(
        "GET",
        &format!("/api/v1/namespaces/default/pods/{APP}-exec-1"),
        None,
    );
    let (_, drv) = w.api("GET", "/api/v1/namespaces/default/pods/drv", None);
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["uid"],
        drv["metadata"]["uid"]
    );
    assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
}

#[test]
fn corrupt_state_file_is_refused_and_kept() {
    let w = world(|_| {});
    std::fs::write(w.state_file(), b"{\"version\": 1, \"target\": ").unwrap();
    let out = w.run(&["reconcile", "--target", "2"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("state.json"), "{err}");
    assert_eq!(
        std::fs::read(w.state_file()).unwrap(),
        b"{\"version\": 1, \"target\": "
    );
    assert!(w.executors().is_empty());
}

#[test]
fn a_held_lock_makes_reconcile_exit_3_without_acting() {
    let w = world(|_| {});
    let held = podalloc::state::LockedStore::lock(&w.state_file()).unwrap();
    let out = w.run(&["reconcile", "--target", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(stderr(&out).contains("lock"));
    assert!(w.executors().is_empty());
    drop(held);
    w.ok(&["reconcile", "--target", "2"]);
    assert_eq!(w.executors().len(), 2);
}

#[test]
fn overlapping_reconciles_one_acts() {
    let w = world(|o| o.startup_latency = Duration::from_secs(60));
    let children: Vec<_> = (0..6)
        .map(|_| {
            w.cmd(&["reconcile", "--target", "20"])
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let codes: Vec<i32> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap().status.code().unwrap())
        .collect();
    assert!(codes.iter().all(|c| *c == 0 || *c == 3), "{codes:?}");
    // Whatever overlapped, exactly one batch exists: the first acted, the rest saw it pending
    // or were locked out. No duplicate creates.
    assert_eq!(w.executors().len(), 5, "{codes:?}");
    assert_eq!(w.sim.stats().create_conflicts, 0);
}

#[test]
fn dry_run_prints_the_plan_and_changes_nothing() {
    let w = world(|_| {});
    let out = w.ok(&["reconcile", "--target", "3", "--dry-run"]);
    let plan: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(plan["create"].as_array().unwrap().len(), 3);
    assert!(!w.state_file().exists());
    assert_eq!(w.sim.stats().creates, 0);
    assert!(!stdout(&out).contains(&w.token));
}

#[test]
fn wrong_token_is_a_clear_error_without_the_secret() {
    let w = world(|_| {});
    let out = w
        .cmd_as(
            "wrong-token-value",
            &["--log-level", "trace", "reconcile", "--target", "1"],
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("401"), "{err}");
    assert!(
        !err.contains("wrong-token-value") && !err.contains(&w.token),
        "{err}"
    );
    assert!(!w.state_file().exists() || w.state()["unacknowledged"].as_array().unwrap().is_empty());
}

#[test]
fn untrusted_server_certificate_is_refused() {
    let w = world(|_| {});
    // Another simulator, with a CA of its own.
    let w2 = world(|_| {});
    let out = w
        .cmd(&["reconcile", "--target", "1"])
        .arg("--server")
        .arg(w2.sim.url())
        .output()
        .unwrap();
    // A TLS failure is permanent: exit 4, as a 403.
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).to_lowercase().contains("tls") || stderr(&out).contains("certificate"),
        "{}",
        stderr(&out)
    );
    assert_eq!(w2.sim.stats().creates, 0);
}

#[test]
fn sigterm_finishes_the_tick_saves_and_exits_0() {
    let w = world(|o| o.startup_latency = Duration::from_secs(60));
    let child = w
        .cmd(&["run", "--target", "3", "--interval", "100ms"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    w.wait_for("first batch", |w| w.executors().len() == 3);
    std::thread::sleep(Duration::from_millis(300));
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("signal received"), "{}", stderr(&out));
    let st = w.state();
    assert_eq!(st["target"], 3);
    assert_eq!(st["last_executor_id"], 3);
}

#[test]
fn timeout_without_convergence_exits_5() {
    let w = world(|o| o.startup_latency = Duration::from_secs(60));
    let out = w.run(&args(
        "run --target 2 --until-converged --timeout 1s --interval 200ms",
    ));
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(stderr(&out).contains("not converged"));
}

#[test]
fn trace_logs_never_show_the_token() {
    let w = world(|_| {});
    let out = w.ok(&["--log-level", "trace", "reconcile", "--target", "2"]);
    let err = stderr(&out);
    assert!(
        err.contains("TRACE") || err.contains("DEBUG"),
        "trace logging is on"
    );
    assert!(!err.contains(&w.token), "the token leaked into the logs");
    // Libraries that hex-dump requests split a token across lines: none of that either.
    assert!(
        !err.contains("ureq_proto"),
        "raw request dumps are in the logs"
    );
    let joined: String = err.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    let token: String = w
        .token
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    assert!(
        !joined.contains(&token),
        "the token leaked, split across lines"
    );
    assert!(
        !err.to_lowercase().contains("bearer "),
        "an Authorization header leaked"
    );
    let out = w.ok(&["--log-level", "trace", "reconcile", "--dry-run"]);
    assert!(!stdout(&out).contains(&w.token) && !stderr(&out).contains(&w.token));
}

#[test]
fn insecure_skip_tls_verify_works_and_warns_every_tick() {
    let w = world(|_| {});
    let out = podalloc()
        .args([
            "--server",
            &w.sim.url(),
            "--token",
            &w.token,
            "--insecure-skip-tls-verify",
        ])
        .args(["--app-id", APP, "--image", "img", "--batch-delay", "100ms"])
        .arg("--state-file")
        .arg(w.state_file())
        .args(args("run --target 1 --until-converged --timeout 20s"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    let ticks = err.lines().filter(|l| l.contains(" tick ")).count();
    let warnings = err
        .lines()
        .filter(|l| l.contains("verification is disabled"))
        .count();
    assert!(
        ticks >= 2 && warnings >= ticks,
        "ticks {ticks}, warnings {warnings}: {err}"
    );
}

#[test]
fn plain_http_is_refused_off_loopback() {
    let w = world(|_| {});
    let out = (w.bare())
        .args(["--server", "http://192.0.2.10:8080", "--token", "t"])
        .args(["reconcile", "--target", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("http"), "{}", stderr(&out));
}

#[cfg(feature = "sim")]
#[test]
fn the_readme_first_command_converges_on_its_own_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let out = podalloc()
        .args(["--simulate", "run", "--target", "10", "--until-converged"])
        .env("HOME", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let log = stderr(&out);
    assert!(
        log.contains("target=10 running=10 pending=0 unacknowledged=0"),
        "{log}"
    );
    assert!(log.contains("converged after"), "{log}");
}

#[cfg(not(feature = "sim"))]
#[test]
fn without_the_simulator_simulate_and_sim_are_one_line_usage_errors() {
    for args in [
        &["--simulate", "run", "--target", "1"][..],
        &["sim", "--http", "--nodes", "3"][..],
    ] {
        let out = podalloc().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("built without the simulator"), "{err}");
    }
}
