//! Real clusters fail in real ways: the real binary against the simulator for
//! each condition Kubernetes produces — disruptions (`DisruptionTarget`), scheduling gates,
//! the kubelet's permanent start-up errors, pods on a lost node (phase Unknown, stuck
//! terminating) — and for inputs read from files (apps files, templates, kubeconfigs).

use crate::util::{args, code, stderr, write, SimWorld, World};
use serde_json::{json, Value};
use std::time::Duration;

const APP: &str = "rc-app";

fn world() -> World {
    SimWorld::quick(APP).pod_ms(50, 150).start()
}

/// Sets executor `id`'s phase through the simulator's side door, with `extra` fields
/// (`disruption`, `waiting`, `exitCode`, …).
fn set_phase(w: &World, id: u64, phase: &str, extra: Value) {
    let mut body = json!({"phase": phase});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let path = format!("/sim/pods/default/{APP}-exec-{id}/phase");
    let (status, out) = w.api("POST", &path, Some(&body));
    assert_eq!(status, 200, "{out}");
}

fn gone_or_terminating(w: &World, id: u64) -> bool {
    w.executor_pod(id)
        .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null())
}

/// KEP-3329: four pods ended by Kubernetes (eviction API, preemption, kubelet evictions) in
/// one minute are replaced and do not halt `--max-failures 3`; four exit-1 failures do.
#[test]
fn disruptions_are_replaced_and_never_halt_but_crashes_still_do() {
    let w = world();
    let flags = ["--max-failures", "3"];
    let run = |extra: &[&str]| w.run(&[&flags[..], extra].concat());
    assert_eq!(
        code(&run(&args(
            "run --target 4 --until-converged --timeout 30s"
        ))),
        0
    );
    let kinds = [
        "EvictionByEvictionAPI",
        "PreemptionByScheduler",
        "TerminationByKubelet",
        "DeletionByTaintManager",
    ];
    for (i, k) in kinds.iter().enumerate() {
        set_phase(
            &w,
            i as u64 + 1,
            "Failed",
            json!({"exitCode": 143, "disruption": k}),
        );
    }
    let out = run(&["reconcile"]);
    let log = stderr(&out);
    assert_eq!(code(&out), 0, "{log}");
    assert!(
        log.contains("EvictionByEvictionAPI") && log.contains("not counted as a failure"),
        "{log}"
    );
    assert!((1..=4).all(|i| gone_or_terminating(&w, i)), "{log}");
    assert!(
        w.state()["failures"].as_array().is_none_or(Vec::is_empty),
        "{}",
        w.state()
    );
    assert_eq!(code(&run(&args("run --until-converged --timeout 30s"))), 0);
    assert_eq!(w.live(), vec![5, 6, 7, 8]);
    for id in 5..=8 {
        set_phase(&w, id, "Failed", json!({"exitCode": 1}));
    }
    let out = run(&["reconcile"]);
    assert_eq!(code(&out), 6, "four real failures halt: {}", stderr(&out));
}

/// Kueue's admission (kueue#4106): pods created with scheduling gates wait with
/// `SchedulingGated`. They count (no overshoot) but do not hold back the next batch, and the
/// blocked line says so; once the gates are removed, they run.
#[test]
fn scheduling_gated_pods_do_not_block_the_next_batch() {
    let w = world();
    let tpl = w.template(
        json!({"schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
               "containers": [{"name": "executor", "image": "placeholder"}]}),
    );
    let run = |extra: &[&str]| {
        w.ok(&[
            &["--template", tpl.as_str(), "--batch-size", "2"][..],
            extra,
        ]
        .concat())
    };
    run(&["reconcile", "--target", "4"]);
    // Pods `ids` all carry the scheduler's SchedulingGated condition.
    let gated = |ids: std::ops::RangeInclusive<u64>| {
        move |w: &World| {
            ids.clone().all(|i| {
                w.executor_pod(i).is_some_and(|p| {
                    p["status"]["conditions"]
                        .to_string()
                        .contains("SchedulingGated")
                })
            })
        }
    };
    w.wait_for("the first batch to be gated", gated(1..=2));
    run(&["reconcile"]);
    assert_eq!(
        w.executors().len(),
        4,
        "the gated first batch did not block the second"
    );
    w.wait_for("the second batch to be gated", gated(3..=4));
    let log = stderr(&run(&["reconcile"]));
    assert!(log.contains("waiting for 4 scheduling-gated pods"), "{log}");
    assert_eq!(w.executors().len(), 4, "gated pods count: no overshoot");
    // Kueue admits the group: the gates go, and the pods are scheduled and run.
    for i in 1..=4 {
        let path = format!("/api/v1/namespaces/default/pods/{APP}-exec-{i}");
        let (status, out) = w.api(
            "PATCH",
            &path,
            Some(&json!({"spec": {"schedulingGates": null}})),
        );
        assert_eq!(status, 200, "{out}");
    }
    run(&args("run --until-converged --timeout 30s"));
    assert_eq!(w.live(), vec![1, 2, 3, 4]);
    assert_eq!(w.max_live(), 4);
}

/// The kubelet's permanent start-up errors (werf/kubedog#211): a pod waiting in
/// ErrImageNeverPull is deleted once after `--startup-grace` and replaced, with the reason
/// recorded for the crash-loop guard.
#[test]
fn a_permanent_startup_error_is_stuck_after_the_grace() {
    let w = world();
    let flags = ["--startup-grace", "1s", "--max-failures", "10"];
    let run = |extra: &[&str]| w.ok(&[&flags[..], extra].concat());
    run(&["reconcile", "--target", "1"]);
    set_phase(
        &w,
        1,
        "Pending",
        json!({"waiting": "ErrImageNeverPull",
        "message": "Container image \"x\" is not present with pull policy of Never"}),
    );
    run(&["reconcile"]);
    assert_eq!(
        w.state()["stuck"][0]["reason"],
        "ErrImageNeverPull (image registry.example/spark:3.5.0)"
    );
    assert!(!gone_or_terminating(&w, 1), "within the grace");
    std::thread::sleep(Duration::from_millis(1200));
    run(&["reconcile"]);
    assert!(gone_or_terminating(&w, 1), "stuck: deleted");
    let st = w.state();
    assert!(
        st["failures"][0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("ErrImageNeverPull"),
        "{st}"
    );
    assert_eq!(st["last_executor_id"], 2, "and replaced: {st}");
}

/// A pod whose node stops reporting (phase Unknown) counts toward the target until
/// `--unknown-timeout`, then is lost: deleted and replaced at once (without
/// `--count-terminating`), not a failure.
#[test]
fn an_unknown_pod_counts_until_lost_then_is_replaced() {
    let w = world();
    let run = |extra: &[&str]| w.run(&[&["--unknown-timeout", "1s"][..], extra].concat());
    assert_eq!(
        code(&run(&args(
            "run --target 2 --until-converged --timeout 30s"
        ))),
        0
    );
    set_phase(&w, 1, "Unknown", json!({}));
    let log = stderr(&run(&["reconcile"]));
    assert!(log.contains("waiting for 1 pods in phase Unknown"), "{log}");
    assert_eq!(
        w.executors().len(),
        2,
        "not replaced while it may come back"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let log = stderr(&run(&["reconcile"]));
    assert!(log.contains("phase Unknown for more than 1s"), "{log}");
    assert!(gone_or_terminating(&w, 1));
    assert_eq!(w.state()["last_executor_id"], 3, "replaced");
    assert!(w.state()["failures"].as_array().is_none_or(Vec::is_empty));
}

/// `--count-terminating` on a lost node: the lost pod is deleted but never goes away (its
/// node cannot confirm). It counts as quota charges it, until deletionTimestamp +
/// deletionGracePeriodSeconds, and every tick's blocked line says so with the count and the
/// oldest delete's age; then it is replaced (kubernetes/kubernetes#52436).
#[test]
fn count_terminating_stops_counting_a_pod_stuck_on_a_lost_node() {
    let w = world();
    let tpl = w.template(json!({"terminationGracePeriodSeconds": 1,
               "containers": [{"name": "executor", "image": "placeholder"}]}));
    let flags = [
        "--template",
        tpl.as_str(),
        "--unknown-timeout",
        "500ms",
        "--count-terminating",
    ];
    let run = |extra: &[&str]| w.run(&[&flags[..], extra].concat());
    assert_eq!(
        code(&run(&args(
            "run --target 3 --until-converged --timeout 30s"
        ))),
        0
    );
    set_phase(&w, 1, "Unknown", json!({}));
    run(&["reconcile"]);
    std::thread::sleep(Duration::from_millis(600));
    run(&["reconcile"]);
    let p = w.executor_pod(1).expect("still there: its node is lost");
    assert!(!p["metadata"]["deletionTimestamp"].is_null());
    let log = stderr(&run(&["reconcile"]));
    assert!(
        log.contains(
            "waiting for 1 terminating pods to go (--count-terminating); the oldest was deleted"
        ),
        "{log}"
    );
    assert_eq!(w.state()["last_executor_id"], 3, "not replaced yet");
    let status = w.ok(&[&flags[..], &["status", "--output", "json"]].concat());
    let s: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(s["blocked"]["reason"], "terminating", "{s}");
    assert_eq!(s["blocked"]["pods"], 1, "{s}");
    // Past deletionTimestamp (delete + 1 s) + the grace (1 s), quota no longer charges it.
    std::thread::sleep(Duration::from_millis(2100));
    assert_eq!(code(&run(&args("run --until-converged --timeout 30s"))), 0);
    assert!(w.executor_pod(1).is_some(), "still stuck terminating");
    assert_eq!(w.live(), vec![2, 3, 4]);
}

// ---- inputs read from files: validated as the API would, bounded, never hanging ----------

/// Runs `c` for at most 20 s (a hang is a failure, not a stuck test run) and returns its exit
/// code and standard error.
fn finishes(c: &mut std::process::Command) -> (i32, String) {
    use std::process::Stdio;
    let mut child = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("hung: {c:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (code(&out), stderr(&out))
}

/// `podalloc apps` connected to the simulator, with no app flags.
fn apps(w: &World, file: &std::path::Path) -> std::process::Command {
    let mut c = crate::util::podalloc();
    c.args(["--server", &w.sim.url(), "--token", &w.token])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .args(["apps", "--once", "--state-dir"])
        .arg(w.path("states"))
        .arg("--file")
        .arg(file);
    c
}

/// One app spelt twice (no `namespace:`, then `namespace: default`), a namespace that is a
/// path, a driver pod that is not a name, a target above the limit: each refuses the apps
/// file with one line, exit 2, before any call or file is made.
#[test]
fn an_apps_file_is_validated_as_the_api_would() {
    let w = world();
    let file = w.path("apps.yaml");
    let entry = "- app-id: twice\n  image: spark:3.5\n  target: 4\n";
    for (extra, why) in [
        (
            "  namespace: default\n",
            "app \"twice\" is listed twice in namespace \"default\"",
        ),
        (
            "  namespace: ../../tmp/evil\n",
            "namespace \"../../tmp/evil\" is not a valid name (a DNS-1123 label",
        ),
        (
            "  driver-pod: ../x\n",
            "driver-pod \"../x\" is not a valid name",
        ),
        (
            "  target: 1000001\n",
            "target 1000001 is too large: at most 1000000",
        ),
    ] {
        let second = match extra.contains("namespace: default") {
            true => format!("{entry}{extra}"),
            false => format!("- app-id: other\n  image: spark:3.5\n{extra}"),
        };
        write(&file, &format!("apps:\n{entry}{second}"));
        let (code, err) = finishes(&mut apps(&w, &file));
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(why), "{why}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(w.executors().is_empty(), "nothing created: {err}");
        assert!(
            !w.path("tmp").exists() && !w.dir.path().parent().unwrap().join("tmp/evil").exists()
        );
    }
}

/// A FIFO (no writer) or `/dev/zero` given as apps file, pod template or kubeconfig is
/// refused at once with one line; nothing hangs or grows.
#[test]
fn fifos_and_devices_as_input_files_are_refused_at_once() {
    let w = world();
    let fifo = w.path("fifo");
    let mode = rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR;
    rustix::fs::mknodat(rustix::fs::CWD, &fifo, rustix::fs::FileType::Fifo, mode, 0).unwrap();
    for bad in [fifo.as_path(), std::path::Path::new("/dev/zero")] {
        let b = bad.to_str().unwrap();
        let mut kubeconfig = crate::util::podalloc();
        kubeconfig.args([
            "--kubeconfig",
            b,
            "--app-id",
            APP,
            "--image",
            "x",
            "reconcile",
            "--target",
            "1",
        ]);
        let template = w.cmd(&["reconcile", "--target", "1", "--template", b]);
        // The input, its command, the exit code (`None`: any failure), what the line says.
        let cases = [
            ("apps file", apps(&w, bad), Some(2), "is not a regular file"),
            (
                "template",
                template,
                Some(2),
                "cannot read the pod template",
            ),
            ("kubeconfig", kubeconfig, None, "cannot read kubeconfig"),
        ];
        for (input, mut c, exit, says) in cases {
            let (code, err) = finishes(&mut c);
            match exit {
                Some(exit) => assert_eq!(code, exit, "{input} {b}: {err}"),
                None => assert_ne!(code, 0, "{input} {b}: {err}"),
            }
            assert!(
                err.contains(says) && err.contains("not a regular file"),
                "{input} {b}: {err}"
            );
        }
    }
    assert!(w.executors().is_empty());
}

/// The documented limits hold for state files too (a target above 1,000,000 is refused,
/// naming it), and a state whose deleted id is above its counter never hands that id out.
#[test]
fn state_files_keep_the_limits_and_ids_are_never_handed_out_twice() {
    let w = world();
    write(
        &w.state_file(),
        r#"{"version":1,"target":1000001,"last_executor_id":0}"#,
    );
    let (code, err) = finishes(&mut w.cmd(&["reconcile"]));
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("target 1000001 is above the largest target 1000000"),
        "{err}"
    );
    write(
        &w.state_file(),
        r#"{"version":1,"target":2,"last_executor_id":5,"deleted":[7]}"#,
    );
    w.ok(&["reconcile"]);
    let ids: Vec<u64> = w.executors().iter().map(|e| e.0).collect();
    assert_eq!(ids, vec![8, 9], "above the deleted id 7");
}

/// `--executor-container` must name a container of the template: exit 2, one line naming it
/// and the containers the template has.
#[test]
fn an_executor_container_not_in_the_template_is_refused() {
    let w = world();
    let tpl = w.template(json!({"containers": [{"name": "executor", "image": "x"}, {"name": "istio-proxy", "image": "y"}]}));
    // One tick toward one executor, `--executor-container` naming `c`.
    let tick_with = |c| {
        let args = ["reconcile", "--target", "1", "--template", &tpl];
        let mut cmd = w.cmd(&args);
        cmd.args(["--executor-container", c]);
        cmd
    };
    let (code, err) = finishes(&mut tick_with("spark"));
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--executor-container \"spark\" is not a container of the executor pod template (it has: executor, istio-proxy)"),
        "{err}"
    );
    assert!(w.executors().is_empty());
    let out = tick_with("executor").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(w.executors().len(), 1);
}
