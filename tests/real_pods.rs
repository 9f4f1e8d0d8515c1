//! Real clusters are messier than one container per pod: the real binary against the
//! simulator's kubelet with sidecars, init containers and images that cannot be pulled.

use crate::util::{args, stderr, SimWorld, World};
use podalloc_sim::SimOptions;
use serde_json::{json, Value};
use std::time::Duration;

const APP: &str = "real-app";
const BAD_IMAGE: &str = "registry.example/fetch:does-not-exist";

fn world(tweak: impl FnOnce(&mut SimOptions)) -> World {
    SimWorld::quick(APP).pod_ms(50, 200).options(tweak).start()
}

fn waiting_reason(p: &Value, list: &str) -> String {
    p["status"][list][0]["state"]["waiting"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A world and the path of a pod template of `containers` (name, image), in that order.
fn with_containers(containers: &[(&str, &str)]) -> (World, String) {
    let w = world(|_| {});
    let list: Vec<Value> = (containers.iter())
        .map(|(name, image)| json!({"name": name, "image": image}))
        .collect();
    let tpl = w.template(json!({ "containers": list }));
    (w, tpl)
}

/// The executor container exits 52 while the istio-proxy sidecar keeps the pod Running: the
/// executor failed, so its pod is deleted and replaced (the phase alone says Running).
#[test]
fn an_executor_whose_container_exits_while_a_sidecar_runs_is_replaced() {
    let (w, tpl) = with_containers(&[
        ("spark-kubernetes-executor", "placeholder"),
        ("istio-proxy", "docker.io/istio/proxyv2:1.20.0"),
    ]);
    let flags = ["--template", tpl.as_str(), "--max-failures", "10"];
    let run = |extra: &[&str]| w.ok(&[&flags[..], extra].concat());
    run(&args("run --target 2 --until-converged --timeout 30s"));
    assert_eq!(w.live(), vec![1, 2]);

    let name = format!("{APP}-exec-1");
    w.sim
        .terminate_container("default", &name, "spark-kubernetes-executor", 52, None)
        .unwrap();
    assert_eq!(w.executor_pod(1).unwrap()["status"]["phase"], "Running");

    let out = run(&["reconcile"]);
    let log = stderr(&out);
    assert!(
        w.executor_pod(1)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null()),
        "executor 1 must be deleted: {log}"
    );
    let failures = w.state()["failures"].clone();
    assert_eq!(failures[0]["executor_id"], 1, "{failures}");
    assert_eq!(failures[0]["reason"], "exit code 52", "{failures}");
    run(&["run", "--until-converged", "--timeout", "30s"]);
    assert_eq!(w.live(), vec![2, 3], "replaced by a new executor");
}

/// An init container whose image cannot be pulled keeps the executor in PodInitializing:
/// after --startup-grace the pod is deleted once (stuck), and the recorded reason names the
/// init container's image.
#[test]
fn a_stuck_init_container_is_deleted_after_the_grace_naming_the_image() {
    let w = world(|o| o.missing_images = vec![BAD_IMAGE.to_string()]);
    let tpl = w.template(
        json!({"initContainers": [{"name": "fetch-deps", "image": BAD_IMAGE}],
               "containers": [{"name": "executor", "image": "placeholder"}]}),
    );
    let flags = [
        "--template",
        tpl.as_str(),
        "--startup-grace",
        "1s",
        "--max-failures",
        "10",
    ];
    let run = |extra: &[&str]| w.ok(&[&flags[..], extra].concat());
    run(&["reconcile", "--target", "1"]);
    w.wait_for("the image pull to fail", |w| {
        w.executor_pod(1)
            .is_some_and(|p| waiting_reason(&p, "initContainerStatuses") == "ImagePullBackOff")
    });
    let p = w.executor_pod(1).unwrap();
    assert_eq!(p["status"]["phase"], "Pending");
    assert_eq!(waiting_reason(&p, "containerStatuses"), "PodInitializing");

    // Within the grace: remembered, not deleted.
    run(&["reconcile"]);
    let want = format!("ImagePullBackOff (init container fetch-deps, image {BAD_IMAGE})");
    let st = w.state();
    assert_eq!(st["stuck"][0]["reason"], want.as_str(), "{st}");
    assert!(w.executor_pod(1).unwrap()["metadata"]["deletionTimestamp"].is_null());

    std::thread::sleep(Duration::from_millis(1200));
    run(&["reconcile"]);
    assert!(
        w.executor_pod(1)
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null()),
        "the stuck pod is deleted"
    );
    let st = w.state();
    assert_eq!(st["failures"][0]["reason"], want.as_str(), "{st}");
    assert_eq!(st["last_executor_id"], 2, "and replaced: {st}");
}

/// `--executor-container` names the executor container when it is not the template's first:
/// its exit (OOMKilled) ends the executor, and the reason is its own, not the sidecar's.
#[test]
fn executor_container_flag_picks_the_container_that_decides() {
    let (w, tpl) = with_containers(&[
        ("log-shipper", "fluent/fluent-bit:3.0"),
        ("spark", "registry.example/spark:3.5.0"),
    ]);
    let flags = [
        "--template",
        tpl.as_str(),
        "--executor-container",
        "spark",
        "--max-failures",
        "10",
    ];
    let run = |extra: &[&str]| w.ok(&[&flags[..], extra].concat());
    run(&args("run --target 1 --until-converged --timeout 30s"));
    let name = format!("{APP}-exec-1");
    w.sim
        .terminate_container("default", &name, "spark", 137, Some("OOMKilled"))
        .unwrap();
    run(&["reconcile"]);
    let st = w.state();
    assert_eq!(st["failures"][0]["reason"], "OOMKilled", "{st}");
    assert_eq!(st["last_executor_id"], 2, "{st}");
}
