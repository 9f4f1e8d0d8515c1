//! The `podalloc plan` conformance corpus, run by its own runner against the real binary:
//! the project's base corpus (tests/conformance/cases), our own cases under fixtures/ (the
//! Spark 3.0 policy, the opt-in policies, Spark 3.1+'s suite, real-pod rules), and an outside
//! corpus when `PODALLOC_CONFORMANCE_CASES` names one.

use crate::util::root;
use std::path::Path;
use std::process::Command;

fn run_corpus(dir: &Path) -> (u32, String) {
    let runner = root().join("tests/conformance/run.py");
    let out = Command::new("python3")
        .arg(&runner)
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_podalloc"))
        .arg(dir)
        .output()
        .expect("python3 runs (install python3 to run the conformance corpus)");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let last = stdout.lines().last().unwrap_or_default().to_string();
    assert!(
        out.status.success() && last.ends_with(" 0 failed"),
        "conformance corpus {} failed:\n{stdout}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let passed: u32 = last.split(' ').next().unwrap_or("0").parse().unwrap_or(0);
    (passed, stdout)
}

#[test]
fn base_corpus_passes() {
    let (passed, _) = run_corpus(&root().join("tests/conformance/cases"));
    assert_eq!(passed, 18, "the base corpus has 18 cases");
}

/// An outside corpus of `plan` cases, when `PODALLOC_CONFORMANCE_CASES` names its folder
/// (the product is also checked against scenarios that are not in this repository).
#[test]
fn outside_corpus_passes_when_given() {
    if let Some(dir) = std::env::var_os("PODALLOC_CONFORMANCE_CASES") {
        let (passed, _) = run_corpus(Path::new(&dir));
        assert!(passed >= 1);
    }
}

/// Every case of the corpus in `fixtures/DIR` passes, and there are at least `at_least`.
fn corpus_passes(dir: &str, at_least: u32) {
    let (passed, _) = run_corpus(&root().join("fixtures").join(dir));
    assert!(
        passed >= at_least,
        "{dir}: {passed} cases, expected {at_least} or more"
    );
}

#[test]
fn own_corpus_passes() {
    corpus_passes("conformance", 13);
}

#[test]
fn policy_corpus_passes() {
    corpus_passes("conformance-policies", 11);
}

/// Real-pod rules: why creation is blocked, --count-terminating, executor-container-aware
/// classification, stuck start-up in init containers and ContainerCreating, pod names unique
/// per app id (full pod JSON).
#[test]
fn real_pods_corpus_passes() {
    corpus_passes("conformance-real-pods", 21);
}

/// Spark 3.1+'s own `ExecutorPodsAllocatorSuite`, translated to `plan` cases, under
/// `--policy spark-3.x` (fixtures/conformance-spark3x/README.md lists what was translated).
#[test]
fn spark3x_corpus_passes() {
    corpus_passes("conformance-spark3x", 11);
}

/// Resource profiles (Spark 3.1+'s stage-level scheduling, SPARK-33288): a target per
/// profile, pods counted by their `spark-exec-resourceprofile-id` label, one id counter, the
/// batch and excess per profile, the pending cap across profiles, old states as profile 0.
#[test]
fn profiles_corpus_passes() {
    corpus_passes("conformance-profiles", 10);
}

#[test]
fn the_runner_catches_a_wrong_plan() {
    // A check that cannot fail proves nothing: feed the runner a case whose expectation is
    // wrong and make sure it reports a failure.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("wrong.json"),
        r#"{"app_id":"a","settings":{"batch_size":5},"steps":[{"now_ms":0,"target":10,"pods":[],"expect":{"create":[1,2,3]}}]}"#,
    )
    .unwrap();
    let out = Command::new("python3")
        .arg(root().join("tests/conformance/run.py"))
        .arg("--bin")
        .arg(env!("CARGO_BIN_EXE_podalloc"))
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 passed, 1 failed"));
}
