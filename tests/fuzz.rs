//! Fuzzing the parsers of untrusted input with proptest: arbitrary bytes and mutations of the
//! corpus in fixtures/fuzz/<target>/ (PodList, state, pod template, kubeconfig, Status body).
//! Each must return a value or a one-line error — never panic.
//!
//! `cargo test --test integration fuzz::` runs a bounded number of cases per target (PROPTEST_CASES,
//! default 1000). For a long run: `scripts/fuzz.sh [CASES]` (README, "Fuzzing").

use crate::util::root;
use proptest::prelude::*;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = root().join("fixtures/fuzz").join(target);
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    v.sort();
    assert!(!v.is_empty(), "empty corpus {}", dir.display());
    v
}

/// Arbitrary bytes, or a corpus entry with a few bytes flipped, cut or spliced.
fn input(target: &'static str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = corpus(target);
    let n = seeds.len();
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        (
            0..n,
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
            any::<usize>()
        )
            .prop_map(move |(i, flips, cut)| {
                let mut b = seeds[i].clone();
                for (pos, byte) in flips {
                    if !b.is_empty() {
                        let p = pos % b.len();
                        b[p] = byte;
                    }
                }
                if cut % 3 == 0 && !b.is_empty() {
                    b.truncate(cut % b.len());
                }
                b
            }),
    ]
}

fn one_line(e: &dyn std::fmt::Display) -> Result<(), TestCaseError> {
    let s = e.to_string();
    prop_assert!(!s.trim().is_empty(), "empty error message");
    prop_assert!(!s.contains('\n'), "multi-line error: {s}");
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// A pod list given offline (as `plan --pods` reads one), for app `spark-rec-1`.
fn offline_list(
    bytes: &[u8],
) -> Result<podalloc::snapshot::Snapshot, podalloc::snapshot::SnapshotError> {
    use podalloc::snapshot::{For, ListSource, Snapshot};
    let mut s = Snapshot::default();
    s.read_page(bytes, For::app("spark-rec-1").source(ListSource::Offline))?;
    Ok(s)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn podlist(bytes in input("podlist")) {
        match offline_list(&bytes) {
            Ok(s) => prop_assert!(s.executors.keys().all(|&id| id >= 1)),
            Err(e) => one_line(&e)?,
        }
    }

    #[test]
    fn state(bytes in input("state")) {
        match podalloc::state::parse(&bytes) {
            Ok(st) => prop_assert_eq!(st.version, podalloc::alloc::STATE_VERSION),
            Err(e) => one_line(&e)?,
        }
    }

    #[test]
    fn template(bytes in input("template")) {
        let text = String::from_utf8_lossy(&bytes);
        match podalloc::commands::parse_template_text(&text) {
            Ok(v) => match podalloc::podspec::PodTemplate::from_value(v, Some("img")) {
                Ok(t) => {
                    let pod = t.build("app", 1, "app-exec-1", None);
                    prop_assert_eq!(&pod["metadata"]["name"], "app-exec-1");
                }
                Err(e) => one_line(&e)?,
            },
            Err(e) => one_line(&e)?,
        }
    }

    #[test]
    fn status_body(code in 400u16..600, bytes in input("status")) {
        let s = podalloc::kube::ApiStatus::from_body(code, &bytes, None);
        prop_assert!(s.code >= 400);
        one_line(&s.message.replace('\n', " "))?;
    }
}

proptest! {
    // Each kubeconfig case writes a file: fewer cases.
    #![proptest_config(ProptestConfig { cases: cases() / 10 + 1, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn kubeconfig(bytes in input("kubeconfig")) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, &bytes).unwrap();
        let flags = podalloc::kube::ConnectionFlags { kubeconfig: Some(path), ..Default::default() };
        match podalloc::kube::resolve_with(&flags, &|_| None, dir.path()) {
            Ok(cfg) => prop_assert!(!cfg.server.is_empty()),
            Err(e) => one_line(&e)?,
        }
    }
}

#[test]
fn corpus_entries_parse_or_fail_cleanly() {
    for b in corpus("podlist") {
        if let Err(e) = offline_list(&b) {
            assert!(!e.to_string().contains('\n'));
        }
    }
    assert!(
        podalloc::state::parse(&corpus("state")[0]).is_ok()
            || corpus("state")
                .iter()
                .any(|b| podalloc::state::parse(b).is_ok())
    );
}
