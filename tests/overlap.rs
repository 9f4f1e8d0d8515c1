//! Overlapping runs: ten `reconcile` processes started at once against one state file.
//! Exactly one acts; the other nine exit 3 quickly; no duplicate creates.

use crate::util::{root, SimWorld};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn ten_reconciles_at_once_exactly_one_acts() {
    let w = SimWorld::new()
        .app("overlap")
        .startup(Duration::from_secs(60))
        // Every API call takes 300 ms, so the acting tick holds its lock for ~2 s.
        .latency(300)
        .start();
    let started = Instant::now();
    let children: Vec<_> = (0..10)
        .map(|_| {
            w.cmd(&["--batch-size", "5", "reconcile", "--target", "50"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Each child is waited for on its own thread, so each exit time is its own.
    let waiters: Vec<_> = children
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let out = c.wait_with_output().unwrap();
                (
                    out.status.code().unwrap_or(-1),
                    started.elapsed(),
                    String::from_utf8_lossy(&out.stderr).to_string(),
                )
            })
        })
        .collect();
    let results: Vec<(i32, Duration, String)> =
        waiters.into_iter().map(|t| t.join().unwrap()).collect();
    let acted: Vec<_> = results.iter().filter(|r| r.0 == 0).collect();
    let locked: Vec<_> = results.iter().filter(|r| r.0 == 3).collect();
    assert_eq!(acted.len(), 1, "{results:#?}");
    assert_eq!(locked.len(), 9, "{results:#?}");
    let acting_took = acted[0].1;
    for (_, took, err) in &locked {
        assert!(
            *took < acting_took,
            "a locked-out run must not wait for the lock: {took:?}"
        );
        assert!(err.contains("holds the lock"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    let stats = w.sim.stats();
    assert_eq!(stats.creates, 5, "one batch, no duplicates");
    assert_eq!(stats.create_conflicts, 0);
    assert_eq!(stats.duplicate_executor_ids, 0);
    let report = format!(
        "overlap harness: 10 processes, 1 acted ({:.1}s), 9 exited 3 (slowest after {:.2}s), {} creates, 0 duplicates\n",
        acting_took.as_secs_f64(),
        locked.iter().map(|r| r.1).max().unwrap_or_default().as_secs_f64(),
        stats.creates,
    );
    eprint!("{report}");
    let _ = std::fs::write(root().join("target/overlap-report.txt"), &report);
}
