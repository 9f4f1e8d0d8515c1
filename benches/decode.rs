//! The list decode alone, side by side: `cargo bench --bench decode`.
//!
//! One 500-pod page of realistic Spark executor pods (`scripts/bench_pods.py --count 500
//! --no-managed-fields`, about 2.7 MB, the pages the tick benchmark serves) is decoded by:
//!
//! - `snapshot`: [`Snapshot::add_page`], podalloc's decoder (the fields the snapshot keeps,
//!   everything else skipped by structure);
//! - `streamed`: [`Snapshot::add_page_reader`] over the same bytes in memory;
//! - `serde_json skip`: `serde_json::from_slice::<IgnoredAny>`, serde_json only validating
//!   and skipping the whole page, a lower bound of any serde_json-based decoder of it;
//! - `utf8 check`: `std::str::from_utf8` of the page, a floor of reading the bytes once.
//!
//! The four run interleaved, round after round; the medians (ms per 10,000 pods and MB/s)
//! and each one's ratio to `snapshot` are printed. Set `PODALLOC_BENCH_PAGE=FILE` to decode
//! another page (its app id must be `spark-bench`),
//! `PODALLOC_BENCH_ROUNDS=N` for another number of rounds, `PODALLOC_BENCH_ONLY=NAME` to run the
//! cases whose name starts with NAME (for a profiler).

use std::time::{Duration, Instant};

use podalloc::snapshot::{ListSource, Snapshot};
use serde::de::IgnoredAny;

const APP: &str = "spark-bench";

fn page() -> Vec<u8> {
    if let Ok(path) = std::env::var("PODALLOC_BENCH_PAGE") {
        return std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench_pods.py");
    let out = std::process::Command::new("python3")
        .args([
            script,
            "--count",
            "500",
            "--no-managed-fields",
            "--app",
            APP,
        ])
        .output()
        .expect("python3 runs scripts/bench_pods.py");
    assert!(out.status.success(), "bench_pods.py failed");
    out.stdout
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let page = page();
    let pods = Snapshot::from_pod_list(&page, APP)
        .expect("the page decodes")
        .executors
        .len();
    assert!(pods > 0, "no executor of app {APP} in the page");
    type Case<'a> = (&'static str, Box<dyn Fn() + 'a>);
    let cases: Vec<Case<'_>> = vec![
        (
            "snapshot",
            Box::new(|| {
                let mut s = Snapshot::default();
                s.add_page(&page, APP).unwrap();
                assert_eq!(s.executors.len(), pods);
            }),
        ),
        (
            "streamed",
            Box::new(|| {
                let mut s = Snapshot::default();
                s.add_page_reader(&page[..], APP, None, ListSource::ApiServer)
                    .unwrap();
                assert_eq!(s.executors.len(), pods);
            }),
        ),
        (
            "serde_json skip",
            Box::new(|| {
                serde_json::from_slice::<IgnoredAny>(&page).unwrap();
            }),
        ),
        (
            "utf8 check",
            Box::new(|| {
                std::str::from_utf8(&page).unwrap();
            }),
        ),
    ];
    let only = std::env::var("PODALLOC_BENCH_ONLY").ok();
    let cases: Vec<Case<'_>> = (cases.into_iter())
        .filter(|(name, _)| only.as_deref().is_none_or(|o| name.starts_with(o)))
        .collect();
    let rounds: usize = std::env::var("PODALLOC_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(40);
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    for round in 0..=rounds {
        for (i, (_, run)) in cases.iter().enumerate() {
            let t = Instant::now();
            run();
            if round > 0 {
                times[i].push(t.elapsed());
            }
        }
    }
    println!(
        "snapshot: podalloc's decoder (Snapshot::add_page); streamed: the same read while the \
         body arrives (add_page_reader); serde_json skip: serde_json only validating and \
         skipping the page (no snapshot: a lower bound of a serde_json-based decoder); utf8 \
         check: reading the bytes once."
    );
    println!(
        "{} pods, {:.2} MB per page, {rounds} interleaved rounds, medians:",
        pods,
        page.len() as f64 / 1e6
    );
    let base = median(&mut times[0].clone());
    for ((name, _), t) in cases.iter().zip(&mut times) {
        let m = median(t);
        println!(
            "  {name:<16} {:>7.1} ms per 10,000 pods  {:>6.0} MB/s  {:>5.2}× snapshot",
            m.as_secs_f64() * 1e3 * 10_000.0 / pods as f64,
            page.len() as f64 / m.as_secs_f64() / 1e6,
            m.as_secs_f64() / base.as_secs_f64()
        );
    }
}
