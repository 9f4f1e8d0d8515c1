//! The ConfigMap state store: two podalloc processes on one ConfigMap at once — exactly one
//! acts per tick (optimistic concurrency), and the state survives in the cluster.

use podalloc::sim::{SimOptions, SimServer};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn podalloc(sim: &SimServer, dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_podalloc"));
    c.args(["--server", &sim.url(), "--token", "cm-token"])
        .arg("--certificate-authority")
        .arg(dir.join("ca.crt"))
        .args([
            "--app-id",
            "cm-app",
            "--image",
            "img",
            "--batch-delay",
            "100ms",
        ])
        .args(["--state-store", "configmap:podalloc-cm-app"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn sim(dir: &Path, latency_ms: u64, startup: Duration) -> SimServer {
    SimServer::start(SimOptions {
        ca_out: Some(dir.join("ca.crt")),
        token: Some("cm-token".into()),
        startup_latency: startup,
        latency: Duration::from_millis(latency_ms),
        ..SimOptions::default()
    })
    .unwrap()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

#[test]
fn two_processes_one_configmap_exactly_one_acts() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim(dir.path(), 200, Duration::from_secs(60));
    for round in 0..3 {
        let a = podalloc(&sim, dir.path(), &["reconcile", "--target", "20"])
            .spawn()
            .unwrap();
        let b = podalloc(&sim, dir.path(), &["reconcile", "--target", "20"])
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
        assert_eq!(sim.stats().creates, 5, "round {round}: one batch only");
    }
    assert_eq!(sim.stats().duplicate_executor_ids, 0);
}

#[test]
fn configmap_store_converges_and_keeps_state_in_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let sim = sim(dir.path(), 0, Duration::from_millis(200));
    let out = podalloc(
        &sim,
        dir.path(),
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
    let out = podalloc(&sim, dir.path(), &["status", "--output", "json"])
        .output()
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["target"], 7);
    assert_eq!(s["running"], 7);
    assert_eq!(s["state_file"], "configmap:podalloc-cm-app");
    assert_eq!(s["counters"]["created"], 7);
}
