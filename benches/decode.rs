//! The list decode alone, side by side: `cargo bench --bench decode`.
//!
//! One 500-pod page of realistic Spark executor pods (`scripts/bench_pods.py --count 500
//! --no-managed-fields`, about 2.7 MB, the pages the tick benchmark serves) is decoded by:
//!
//! - `snapshot`: [`Snapshot::read_page`], podalloc's one decoder (here JSON through
//!   serde_json, each pod decoded once its bytes are in, everything else skipped as
//!   `IgnoredAny`), over the bytes in memory;
//! - `serde_json skip`: `serde_json::from_slice::<IgnoredAny>`, serde_json only validating
//!   and skipping the whole page, a lower bound of any serde_json-based decoder of it;
//! - `utf8 check`: `std::str::from_utf8` of the page, a floor of reading the bytes once.
//!
//! And, on the same 500 pods as kube-apiserver itself encodes them both ways
//! (`fixtures/bench/pods-500.{json,pb}.gz`, recorded by `scripts/record_bench_pages.py`:
//! spec, status and the server's managedFields):
//!
//! - `kube json`: [`Snapshot::read_page`] on the JSON page;
//! - `kube protobuf`: [`Snapshot::read_page`] on the Protobuf page (same pods, same
//!   snapshot: the envelope read field by field, each pod decoded once its bytes are in).
//!
//! All run interleaved, round after round; the medians (ms per 10,000 pods and MB/s of each
//! case's own bytes) and each one's ratio to `snapshot` are printed, and `kube protobuf`'s to
//! `kube json`. Set `PODALLOC_BENCH_PAGE=FILE` to decode
//! another page (its app id must be `spark-bench`),
//! `PODALLOC_BENCH_ROUNDS=N` for another number of rounds, `PODALLOC_BENCH_ONLY=NAME` to run the
//! cases whose name starts with NAME (for a profiler).

use std::time::{Duration, Instant};

use podalloc::snapshot::{For, ListSource, Snapshot};
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

/// A recorded page of `fixtures/bench/` (gzipped), unpacked.
fn recorded(name: &str) -> Vec<u8> {
    use std::io::Read;
    let path = format!("{}/fixtures/bench/{name}", env!("CARGO_MANIFEST_DIR"));
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    out
}

/// A page given offline (generated, or kubectl's), read whole.
fn offline(body: &[u8]) -> Snapshot {
    let mut s = Snapshot::default();
    s.read_page(body, For::app(APP).source(ListSource::Offline))
        .expect("the page decodes");
    s
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A case: its name, the bytes it reads, the pods they hold, and one run of it.
type Case<'a> = (&'static str, usize, usize, Box<dyn Fn() + 'a>);

/// The cases whose name starts with `PODALLOC_BENCH_ONLY` (all when it is not set).
fn chosen(cases: Vec<Case<'_>>) -> Vec<Case<'_>> {
    let only = std::env::var("PODALLOC_BENCH_ONLY").ok();
    (cases.into_iter())
        .filter(|(name, ..)| only.as_deref().is_none_or(|o| name.starts_with(o)))
        .collect()
}

/// The median time of each of `cases` over `rounds` interleaved rounds, after one round
/// not timed.
fn median_times(cases: &[Case<'_>], rounds: usize) -> Vec<Duration> {
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    for round in 0..=rounds {
        for (i, (_, _, _, run)) in cases.iter().enumerate() {
            let t = Instant::now();
            run();
            if round > 0 {
                times[i].push(t.elapsed());
            }
        }
    }
    times.iter_mut().map(|t| median(t)).collect()
}

fn main() {
    let page = page();
    let pods = offline(&page).executors.len();
    assert!(pods > 0, "no executor of app {APP} in the page");
    let (kube_json, kube_pb) = (recorded("pods-500.json.gz"), recorded("pods-500.pb.gz"));
    let kube_pods = offline(&kube_json);
    let from_pb = offline(&kube_pb);
    assert_eq!(
        from_pb, kube_pods,
        "the two encodings of one list read the same"
    );
    let kube_n = kube_pods.executors.len();
    let decode = |body: &[u8], n: usize| {
        let mut s = Snapshot::default();
        s.read_page(body, For::app(APP)).unwrap();
        assert_eq!(s.executors.len(), n);
    };
    let cases: Vec<Case<'_>> = vec![
        (
            "snapshot",
            page.len(),
            pods,
            Box::new(|| decode(&page, pods)),
        ),
        (
            "serde_json skip",
            page.len(),
            pods,
            Box::new(|| {
                serde_json::from_slice::<IgnoredAny>(&page).unwrap();
            }),
        ),
        (
            "utf8 check",
            page.len(),
            pods,
            Box::new(|| {
                std::str::from_utf8(&page).unwrap();
            }),
        ),
        (
            "kube json",
            kube_json.len(),
            kube_n,
            Box::new(|| decode(&kube_json, kube_n)),
        ),
        (
            "kube protobuf",
            kube_pb.len(),
            kube_n,
            Box::new(|| decode(&kube_pb, kube_n)),
        ),
    ];
    let cases = chosen(cases);
    let rounds: usize = std::env::var("PODALLOC_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(40);
    let medians = median_times(&cases, rounds);
    println!(
        "snapshot: podalloc's decoder (Snapshot::read_page, the JSON page in memory); \
         serde_json skip: serde_json only validating and skipping the page (no snapshot: a \
         lower bound of a serde_json-based decoder); utf8 check: reading the bytes once; kube \
         json / kube protobuf: read_page on one list of the same pods as kube-apiserver \
         encodes it in each (fixtures/bench/)."
    );
    println!(
        "{pods} pods, {:.2} MB per page ({kube_n} pods: {:.2} MB JSON, {:.2} MB Protobuf), \
         {rounds} interleaved rounds, medians:",
        page.len() as f64 / 1e6,
        kube_json.len() as f64 / 1e6,
        kube_pb.len() as f64 / 1e6
    );
    print_medians(&cases, &medians);
}

/// Prints each case's median per 10,000 pods, its MB/s and its ratio to the first case's
/// (`snapshot`), and `kube protobuf`'s to `kube json`.
fn print_medians(cases: &[Case<'_>], medians: &[Duration]) {
    let base = medians[0];
    for ((name, bytes, n, _), m) in cases.iter().zip(medians) {
        println!(
            "  {name:<16} {:>7.1} ms per 10,000 pods  {:>6.0} MB/s  {:>5.2}× snapshot",
            m.as_secs_f64() * 1e3 * 10_000.0 / *n as f64,
            *bytes as f64 / m.as_secs_f64() / 1e6,
            m.as_secs_f64() / base.as_secs_f64()
        );
    }
    let at = |name: &str| cases.iter().position(|c| c.0 == name).map(|i| medians[i]);
    if let (Some(j), Some(p)) = (at("kube json"), at("kube protobuf")) {
        println!(
            "  kube protobuf / kube json: {:.2}× the time",
            p.as_secs_f64() / j.as_secs_f64()
        );
    }
}
