//! The ConfigMap state store: two podalloc processes on one ConfigMap at once — exactly one
//! acts per tick (optimistic concurrency), and the state survives in the cluster.

use crate::util::{stderr as err, SimWorld, World};
use std::process::{Command, Stdio};
use std::time::Duration;

fn world(latency_ms: u64, startup: Duration) -> World {
    SimWorld::new()
        .app("cm-app")
        .batch_delay("100ms")
        .no_state_file()
        .startup(startup)
        .latency(latency_ms)
        .start()
}

fn podalloc(w: &World, args: &[&str]) -> Command {
    let mut c = w.cmd(&["--state-store", "configmap:podalloc-cm-app"]);
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

#[test]
fn two_processes_one_configmap_exactly_one_acts() {
    let w = world(200, Duration::from_secs(60));
    for round in 0..3 {
        let a = podalloc(&w, &["reconcile", "--target", "20"])
            .spawn()
            .unwrap();
        let b = podalloc(&w, &["reconcile", "--target", "20"])
            .spawn()
            .unwrap();
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        let codes = [a.status.code().unwrap(), b.status.code().unwrap()];
        let mut sorted = codes;
        sorted.sort();
        if round == 0 {
            // Both read "no ConfigMap" and race to create it: one wins, one exits 3.
            assert_eq!(sorted, [0, 3], "{}\n{}", err(&a), err(&b));
            let loser = if codes[0] == 3 { &a } else { &b };
            assert!(
                err(loser).contains("another podalloc instance updated ConfigMap"),
                "{}",
                err(loser)
            );
        } else {
            // Pods pending: both may act (nothing to do) or one loses the race; never both create.
            assert!(sorted == [0, 3] || sorted == [0, 0], "{codes:?}");
        }
        assert_eq!(w.sim.stats().creates, 5, "round {round}: one batch only");
    }
    assert_eq!(w.sim.stats().duplicate_executor_ids, 0);
}

#[test]
fn configmap_store_converges_and_keeps_state_in_the_cluster() {
    let w = world(0, Duration::from_millis(200));
    let out = podalloc(
        &w,
        &[
            "run",
            "--target",
            "7",
            "--until-converged",
            "--timeout",
            "30s",
        ],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", err(&out));
    let out = podalloc(&w, &["status", "--output", "json"])
        .output()
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["target"], 7);
    assert_eq!(s["running"], 7);
    assert_eq!(s["home"], "configmap:podalloc-cm-app");
    assert_eq!(s["counters"]["created"], 7);
}
