//! The driver's lifecycle (`--driver-pod`) and Spark 3.1+'s policy (`--policy spark-3.x`),
//! end to end: the real binary against the simulated API server.

use crate::util::{args, code, stderr, SimWorld, World};
use serde_json::json;
use std::time::Duration;

fn world() -> World {
    SimWorld::new()
        .app("life")
        .schedule(Duration::from_millis(50))
        .startup(Duration::from_millis(100))
        .start()
}

/// Seeds a driver pod named `drv` in `phase` (the simulator keeps a seeded phase).
fn seed_driver(w: &World, phase: &str) {
    let driver = json!({"metadata": {"name": "drv", "labels": {"spark-role": "driver"}},
        "spec": {"containers": [{"name": "d", "image": "spark"}]}, "status": {"phase": phase}});
    let (status, body) = w.api("POST", "/sim/pods/default", Some(&driver));
    assert!(status == 200 || status == 201, "{status} {body}");
}

fn set_driver_phase(w: &World, phase: &str) {
    let (status, body) = w.api(
        "POST",
        "/sim/pods/default/drv/phase",
        Some(&json!({ "phase": phase })),
    );
    assert_eq!(status, 200, "{body}");
}

#[test]
fn no_executors_while_the_driver_is_pending() {
    let w = world();
    seed_driver(&w, "Pending");
    let out = w.ok(&["--driver-pod", "drv", "reconcile", "--target", "3"]);
    assert!(
        w.live().is_empty(),
        "created executors for a pending driver"
    );
    let err = stderr(&out);
    assert!(err.contains("driver pod is still pending"), "{err}");
    set_driver_phase(&w, "Running");
    w.ok(&["--driver-pod", "drv", "reconcile"]);
    assert_eq!(w.live().len(), 3);
}

#[test]
fn a_finished_driver_takes_its_executors_and_stops_run_with_exit_7() {
    let w = world();
    seed_driver(&w, "Running");
    w.ok(&args(
        "--driver-pod drv run --target 3 --until-converged --timeout 30s",
    ));
    assert_eq!(w.live().len(), 3);
    set_driver_phase(&w, "Succeeded");
    let err = w.run_exits(&["--driver-pod", "drv", "run", "--timeout", "30s"], 7);
    assert!(err.contains("\"drv\" has finished (Succeeded)"), "{err}");
    w.wait_for("executors gone", |w| w.live().is_empty());
    // A later cron tick repeats nothing harmful: nothing created, the same exit code.
    let again = w.run(&["--driver-pod", "drv", "reconcile"]);
    assert_eq!(code(&again), 7, "{}", stderr(&again));
    assert!(w.live().is_empty());
    assert_eq!(w.state()["unacknowledged"], json!([]));
}

/// Spark 3.1+ (SPARK-33099): a target that flaps 5 → 0 → 5 within the executor idle timeout
/// makes no deletes and no new creates.
#[test]
fn spark3x_target_flap_within_the_idle_timeout_churns_nothing() {
    let w = SimWorld::new()
        .app("flap")
        .schedule(Duration::from_millis(50))
        .startup(Duration::from_secs(30))
        .start();
    let policy = ["--policy", "spark-3.x", "--executor-idle-timeout", "60s"];
    let tick = |target: &str| {
        let mut args = policy.to_vec();
        args.extend(["reconcile", "--target", target]);
        w.ok(&args)
    };
    tick("5");
    assert_eq!(w.live().len(), 5);
    let before = w.live();
    let down = tick("0");
    assert!(
        !stderr(&down).contains("deleted executor"),
        "{}",
        stderr(&down)
    );
    tick("5");
    assert_eq!(
        w.live(),
        before,
        "the same five pods, none deleted or added"
    );
    assert_eq!(w.state()["last_executor_id"], 5);
}

/// `--batch-size slow-start`: one tick creates the whole cap in groups of 1, 2, 4, … while every
/// create succeeds, and stops between two groups once the server throttles.
#[test]
fn slow_start_fills_the_cap_in_one_tick_and_stops_when_throttled() {
    let w = world();
    let fast = [
        "--batch-size",
        "slow-start",
        "--max-batch",
        "15",
        "--max-pending",
        "100",
    ];
    let mut args = fast.to_vec();
    args.extend(["reconcile", "--target", "15"]);
    w.ok(&args);
    assert_eq!(w.live().len(), 15, "the whole cap in one tick");

    // The fourth create of the next app meets a 429 (retried by the client): the group it is
    // in (4..=7) completes, the rest of the tick's batch is not sent.
    let t = SimWorld::new()
        .app("throttled")
        .faults(&["create:429-status@4"])
        .start();
    let mut args = fast.to_vec();
    args.extend(["reconcile", "--target", "15"]);
    let out = t.ok(&args);
    let err = stderr(&out);
    assert_eq!(t.live().len(), 7, "{err}");
    assert!(
        err.contains("slow-start stopped after 7 of 15 creates"),
        "{err}"
    );
    assert!(t.state()["unacknowledged"].as_array().unwrap().len() == 7);
}

/// `run` comes back when the plan says time alone changes something (here the end of a quota
/// back-off, 10 s after the first refusal), even when that is sooner than `--interval`.
#[test]
fn run_ticks_again_when_the_plan_is_due_before_the_interval() {
    let w = SimWorld::new()
        .app("requeue")
        .options(|o| o.pod_quota = Some(2))
        .start();
    let err = w.run_exits(&args("run --target 3 --interval 1h --timeout 14s"), 0);
    assert!(err.contains("tick 2:"), "one tick only in 14 s: {err}");
    assert!(
        !err.contains("tick 4:"),
        "ticked at a fixed fast rate: {err}"
    );
}

/// The metrics file says why nothing is created while the target is not reached.
#[test]
fn the_metrics_file_names_the_blocked_reason() {
    let w = SimWorld::pending_for("blocked", Duration::from_secs(60)).start();
    let metrics = w.path("podalloc.prom");
    let m = metrics.to_str().unwrap();
    w.ok(&["--metrics-file", m, "reconcile", "--target", "7"]);
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(text.contains("reason=\"none\"} 0"), "{text}");
    w.wait_for("5 pods seen", |w| w.executors().len() == 5);
    w.ok(&["--metrics-file", m, "reconcile"]);
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(
        text.contains(
            "podalloc_creation_blocked{app=\"blocked\",namespace=\"default\",reason=\"waiting\"} 1"
        ),
        "{text}"
    );
}

/// A driver pod deleted outright after its app had executors has ended the app (exit 7, its
/// executors deleted); a driver never seen is still a mistake in the flags (exit 2).
#[test]
fn a_driver_that_is_gone_ends_the_app_but_a_missing_one_is_a_usage_error() {
    let w = world();
    let first = w.run(&["--driver-pod", "drv", "reconcile", "--target", "2"]);
    assert_eq!(code(&first), 2, "{}", stderr(&first));
    seed_driver(&w, "Running");
    w.ok(&["--driver-pod", "drv", "reconcile", "--target", "2"]);
    assert_eq!(w.live().len(), 2);
    let (status, body) = w.api(
        "DELETE",
        "/api/v1/namespaces/default/pods/drv?gracePeriodSeconds=0",
        None,
    );
    assert_eq!(status, 200, "{body}");
    let err = w.run_exits(&["--driver-pod", "drv", "reconcile"], 7);
    assert!(err.contains("\"drv\" is gone"), "{err}");
    w.wait_for("executors gone", |w| w.live().is_empty());
}

/// `status` says what keeps pending pods from running (the waiting reason, naming the image).
#[test]
fn status_names_what_keeps_pending_pods_from_running() {
    let w = SimWorld::new()
        .app("stuck")
        .image("registry.example/spark:missing")
        .options(|o| o.missing_images = vec!["registry.example/spark:missing".into()])
        .start();
    w.ok(&["reconcile", "--target", "2"]);
    w.wait_for("image pull back-off", |w| {
        w.pods("default").iter().all(|p| {
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
        }) && w.pods("default").len() == 2
    });
    let out = w.ok(&["status"]);
    let text = crate::util::stdout(&out);
    assert!(
        text.contains("2 pending: ImagePullBackOff (image registry.example/spark:missing) ×2"),
        "{text}"
    );
}
