//! The kubelet's container-level reports: sidecars, init containers, native sidecars, image
//! pulls, volumes that never mount, and the Rust API that ends a container.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{SimOptions, SimServer};

const NS: &str = "default";

fn server(missing: &[&str]) -> SimServer {
    SimServer::start(SimOptions {
        tls: false,
        schedule_latency: Duration::from_millis(20),
        startup_latency: Duration::from_millis(60),
        stop_latency: Duration::from_millis(50),
        missing_images: missing.iter().map(|s| s.to_string()).collect(),
        ..SimOptions::default()
    })
    .unwrap()
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .build()
        .new_agent()
}

fn create(s: &SimServer, name: &str, spec: Value) {
    let body = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec});
    let url = format!("{}/api/v1/namespaces/{NS}/pods", s.url());
    let r = (agent().post(&url))
        .header("content-type", "application/json")
        .send(body.to_string())
        .unwrap();
    assert_eq!(r.status(), 201);
}

/// A server ([`server`], every image there) with pod `p` of spec `spec` created.
fn with_pod_p(spec: Value) -> SimServer {
    let s = server(&[]);
    create(&s, "p", spec);
    s
}

fn get(s: &SimServer, name: &str) -> Value {
    let url = format!("{}/api/v1/namespaces/{NS}/pods/{name}", s.url());
    let text = (agent().get(&url).call().unwrap().body_mut())
        .read_to_string()
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Polls the pod until `ok` holds (at most 20 s: a loaded CI machine schedules threads late).
fn until(s: &SimServer, name: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let p = get(s, name);
        if ok(&p) {
            return p;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{p:#}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn status<'a>(p: &'a Value, list: &str, name: &str) -> &'a Value {
    (p["status"][list].as_array().unwrap().iter())
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {list} {name}: {p:#}"))
}

fn condition<'a>(p: &'a Value, ty: &str) -> &'a Value {
    (p["status"]["conditions"].as_array().unwrap().iter())
        .find(|c| c["type"] == ty)
        .unwrap()
}

#[test]
fn a_sidecar_keeps_the_pod_running_after_the_executor_exits() {
    let s = with_pod_p(json!({"restartPolicy": "Never", "containers": [
            {"name": "executor", "image": "spark:3.5"}, {"name": "istio-proxy", "image": "proxy:1"}]}));
    until(&s, "p", |p| p["status"]["phase"] == "Running");
    s.terminate_container(NS, "p", "executor", 52, None)
        .unwrap();
    let p = get(&s, "p");
    assert_eq!(p["status"]["phase"], "Running");
    let ex = status(&p, "containerStatuses", "executor");
    assert_eq!(ex["state"]["terminated"]["exitCode"], 52);
    assert_eq!(ex["state"]["terminated"]["reason"], "Error");
    assert_eq!(ex["ready"], false);
    assert!(status(&p, "containerStatuses", "istio-proxy")["state"]["running"].is_object());
    assert_eq!(condition(&p, "Ready")["status"], "False");
    assert_eq!(
        condition(&p, "Ready")["message"],
        "containers with unready status: [executor]"
    );
    // The kubelet leaves the pod alone: it stays so.
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(get(&s, "p")["status"]["phase"], "Running");
    // A container that is not running cannot end again; unknown ones are named.
    let e = s
        .terminate_container(NS, "p", "executor", 1, None)
        .unwrap_err();
    assert!(e.to_string().contains("not running"), "{e}");
    let e = s.terminate_container(NS, "p", "nope", 1, None).unwrap_err();
    assert!(e.to_string().contains("no container \"nope\""), "{e}");
    // The last container ends: Failed, since one exited non-zero.
    s.terminate_container(NS, "p", "istio-proxy", 0, None)
        .unwrap();
    let p = get(&s, "p");
    assert_eq!(p["status"]["phase"], "Failed");
    assert_eq!(condition(&p, "Ready")["reason"], "PodFailed");
}

#[test]
fn init_containers_then_native_sidecars_then_containers() {
    let s = with_pod_p(json!({"restartPolicy": "Never",
               "initContainers": [{"name": "setup", "image": "busybox:1"},
                                  {"name": "log-shipper", "image": "fluent:3", "restartPolicy": "Always"}],
               "containers": [{"name": "executor", "image": "spark:3.5"}]}));
    let p = until(&s, "p", |p| p["spec"]["nodeName"].is_string());
    if p["status"]["phase"] == "Pending" && p["status"]["initContainerStatuses"].is_array() {
        let w = &status(&p, "initContainerStatuses", "setup")["state"]["waiting"]["reason"];
        assert_eq!(w, "PodInitializing");
        let w = &status(&p, "containerStatuses", "executor")["state"]["waiting"]["reason"];
        assert_eq!(w, "PodInitializing");
        assert_eq!(condition(&p, "Initialized")["status"], "False");
    }
    let p = until(&s, "p", |p| p["status"]["phase"] == "Running");
    let setup = status(&p, "initContainerStatuses", "setup");
    assert_eq!(setup["state"]["terminated"]["reason"], "Completed");
    let shipper = status(&p, "initContainerStatuses", "log-shipper");
    assert!(shipper["state"]["running"].is_object(), "{p:#}");
    assert_eq!(shipper["started"], true);
    assert_eq!(condition(&p, "Initialized")["status"], "True");
    assert_eq!(condition(&p, "Ready")["status"], "True");
    // The executor exits 0: the kubelet stops the native sidecar; the pod succeeded.
    s.terminate_container(NS, "p", "executor", 0, None).unwrap();
    let p = get(&s, "p");
    assert_eq!(p["status"]["phase"], "Succeeded");
    let shipper = status(&p, "initContainerStatuses", "log-shipper");
    assert_eq!(shipper["state"]["terminated"]["exitCode"], 143);
    let ex = status(&p, "containerStatuses", "executor");
    assert_eq!(ex["state"]["terminated"]["reason"], "Completed");
}

#[test]
fn a_missing_image_waits_in_err_image_pull_then_back_off_naming_it() {
    let bad = "registry.example/fetch:does-not-exist";
    let s = server(&[bad]);
    create(
        &s,
        "p",
        json!({"restartPolicy": "Never",
               "initContainers": [{"name": "fetch", "image": bad}],
               "containers": [{"name": "executor", "image": "spark:3.5"}]}),
    );
    let p = until(&s, "p", |p| {
        p["status"]["initContainerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"
    });
    let w = &status(&p, "initContainerStatuses", "fetch")["state"]["waiting"];
    assert!(w["message"].as_str().unwrap().contains(bad), "{w}");
    assert_eq!(status(&p, "initContainerStatuses", "fetch")["imageID"], "");
    assert_eq!(p["status"]["phase"], "Pending");
    let ex = &status(&p, "containerStatuses", "executor")["state"]["waiting"]["reason"];
    assert_eq!(ex, "PodInitializing");
    let p = until(&s, "p", |p| {
        p["status"]["initContainerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
    });
    let w = &status(&p, "initContainerStatuses", "fetch")["state"]["waiting"];
    assert_eq!(w["message"], format!("Back-off pulling image \"{bad}\""));
    assert_eq!(p["status"]["phase"], "Pending");

    // A missing image in a container (no init containers): the same, phase Pending.
    create(
        &s,
        "q",
        json!({"restartPolicy": "Never", "containers": [{"name": "executor", "image": bad}]}),
    );
    let q = until(&s, "q", |p| {
        p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ImagePullBackOff"
    });
    assert_eq!(q["status"]["phase"], "Pending");
}

#[test]
fn a_volume_that_never_mounts_keeps_the_pod_in_container_creating() {
    let s = with_pod_p(json!({"restartPolicy": "Never",
               "volumes": [{"name": "creds", "secret": {"secretName": "spark-creds"}}],
               "containers": [{"name": "executor", "image": "spark:3.5"}]}));
    until(&s, "p", |p| p["spec"]["nodeName"].is_string());
    std::thread::sleep(Duration::from_millis(300));
    let p = get(&s, "p");
    assert_eq!(p["status"]["phase"], "Pending");
    let w = &status(&p, "containerStatuses", "executor")["state"]["waiting"]["reason"];
    assert_eq!(w, "ContainerCreating");
    // An optional secret does not block.
    create(
        &s,
        "q",
        json!({"restartPolicy": "Never",
               "volumes": [{"name": "creds", "secret": {"secretName": "x", "optional": true}}],
               "containers": [{"name": "executor", "image": "spark:3.5"}]}),
    );
    until(&s, "q", |p| p["status"]["phase"] == "Running");
}

#[test]
fn set_pod_phase_from_rust() {
    let s = with_pod_p(
        json!({"restartPolicy": "Never", "containers": [{"name": "executor", "image": "spark:3.5"}]}),
    );
    until(&s, "p", |p| p["status"]["phase"] == "Running");
    s.set_pod_phase(NS, "p", "Failed").unwrap();
    let p = get(&s, "p");
    assert_eq!(p["status"]["phase"], "Failed");
    assert_eq!(
        status(&p, "containerStatuses", "executor")["state"]["terminated"]["exitCode"],
        1
    );
    assert!(s.set_pod_phase(NS, "p", "Exploded").is_err());
    assert!(s.set_pod_phase(NS, "nope", "Failed").is_err());
}
