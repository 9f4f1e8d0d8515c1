//! Kubernetes Events end to end: the real binary posts them to the simulated API server,
//! which serves them back (`/api/v1/namespaces/NS/events`), as `kubectl describe pod` reads
//! them.

use crate::util::{args, stderr, SimWorld, World};
use serde_json::{json, Value};
use std::time::Duration;

const APP: &str = "ev-app";

fn world(tweak: impl FnOnce(&mut podalloc_sim::SimOptions)) -> World {
    SimWorld::quick(APP).options(tweak).start()
}

/// Seeds a running driver pod `drv`; returns its uid.
fn seed_driver(w: &World) -> String {
    let driver = json!({"metadata": {"name": "drv", "labels": {"spark-role": "driver"}},
        "spec": {"containers": [{"name": "d", "image": "spark"}]}, "status": {"phase": "Running"}});
    let (code, pod) = w.api("POST", "/sim/pods/default", Some(&driver));
    assert_eq!(code, 201);
    pod["metadata"]["uid"].as_str().unwrap().to_string()
}

/// The events about pod `name`, as `kubectl describe pod NAME` asks for them.
fn events_on(w: &World, name: &str) -> Vec<Value> {
    let (code, list) = w.api(
        "GET",
        &format!(
            "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{name},involvedObject.namespace%3Ddefault,involvedObject.kind%3DPod"
        ),
        None,
    );
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["kind"], "EventList");
    list["items"].as_array().unwrap().clone()
}

fn with_reason<'a>(evs: &'a [Value], reason: &str) -> Vec<&'a Value> {
    evs.iter().filter(|e| e["reason"] == reason).collect()
}

#[test]
fn creates_are_posted_on_the_driver_pod() {
    let w = world(|_| {});
    let uid = seed_driver(&w);
    w.ok(&["--driver-pod", "drv", "reconcile", "--target", "3"]);
    let evs = events_on(&w, "drv");
    let created = with_reason(&evs, "SuccessfulCreate");
    assert_eq!(created.len(), 3, "{evs:#?}");
    for (i, e) in created.iter().enumerate() {
        assert_eq!(e["type"], "Normal");
        assert_eq!(e["involvedObject"]["uid"], uid.as_str());
        assert_eq!(e["source"]["component"], "podalloc");
        assert_eq!(e["reportingComponent"], "podalloc");
        assert_eq!(e["count"], 1);
        let msg = e["message"].as_str().unwrap();
        assert!(
            msg.starts_with("Created executor pod: ev-app-exec-"),
            "{msg} ({i})"
        );
    }
}

#[test]
fn without_a_driver_events_go_on_the_executor_pod_with_its_uid() {
    let w = world(|_| {});
    w.ok(&["reconcile", "--target", "1"]);
    let name = format!("{APP}-exec-1");
    let (_, pod) = w.api(
        "GET",
        &format!("/api/v1/namespaces/default/pods/{name}"),
        None,
    );
    let evs = events_on(&w, &name);
    let created = with_reason(&evs, "SuccessfulCreate");
    assert_eq!(created.len(), 1, "{evs:#?}");
    assert_eq!(created[0]["involvedObject"]["uid"], pod["metadata"]["uid"]);
}

#[test]
fn a_quota_rejection_is_failed_create_then_blocked() {
    let w = world(|o| o.pod_quota = Some(2));
    seed_driver(&w);
    let out = w.run(&["--driver-pod", "drv", "reconcile", "--target", "3"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let evs = events_on(&w, "drv");
    let failed = with_reason(&evs, "FailedCreate");
    assert_eq!(failed.len(), 1, "{evs:#?}");
    assert_eq!(failed[0]["type"], "Warning");
    let msg = failed[0]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("Error creating: ") && msg.contains("exceeded quota"),
        "{msg}"
    );
    assert_eq!(with_reason(&evs, "SuccessfulCreate").len(), 1);
    // The next tick backs off: AllocationBlocked, a warning naming the quota.
    w.ok(&["--driver-pod", "drv", "reconcile"]);
    let evs = events_on(&w, "drv");
    let blocked = with_reason(&evs, "AllocationBlocked");
    assert_eq!(blocked.len(), 1, "{evs:#?}");
    assert_eq!(blocked[0]["type"], "Warning");
    assert!(blocked[0]["message"]
        .as_str()
        .unwrap()
        .contains("backing off after refused creates"));
}

#[test]
fn a_repeated_event_raises_the_count_across_processes() {
    let w = world(|o| o.startup_latency = Duration::from_secs(60));
    seed_driver(&w);
    w.ok(&["--driver-pod", "drv", "reconcile", "--target", "8"]);
    w.wait_for("5 pods", |w| w.executors().len() == 5);
    // Five pending pods hold the next batch back, tick after tick: one Event, counted.
    for _ in 0..3 {
        w.ok(&["--driver-pod", "drv", "reconcile"]);
    }
    let evs = events_on(&w, "drv");
    let blocked = with_reason(&evs, "AllocationBlocked");
    assert_eq!(blocked.len(), 1, "{evs:#?}");
    assert_eq!(blocked[0]["count"], 3, "{:#?}", blocked[0]);
    assert_eq!(blocked[0]["type"], "Normal");
    assert!(blocked[0]["message"]
        .as_str()
        .unwrap()
        .contains("waiting for pending 5"));
    assert_ne!(blocked[0]["firstTimestamp"], Value::Null);
    assert_ne!(blocked[0]["lastTimestamp"], Value::Null);
}

#[test]
fn a_failed_executor_is_reported_then_deleted_with_the_reason() {
    let w = world(|_| {});
    seed_driver(&w);
    w.ok(&args(
        "--driver-pod drv run --target 2 --until-converged --timeout 30s",
    ));
    let (code, _) = w.api(
        "POST",
        &format!("/sim/pods/default/{APP}-exec-2/phase"),
        Some(&json!({"phase": "Failed", "exitCode": 137, "reason": "OOMKilled"})),
    );
    assert_eq!(code, 200);
    w.ok(&["--driver-pod", "drv", "reconcile"]);
    let evs = events_on(&w, "drv");
    let failed = with_reason(&evs, "ExecutorFailed");
    assert_eq!(failed.len(), 1, "{evs:#?}");
    let msg = failed[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("ev-app-exec-2") && msg.contains("OOMKilled") && msg.contains("137"),
        "{msg}"
    );
    let deleted = with_reason(&evs, "SuccessfulDelete");
    assert_eq!(deleted.len(), 1, "{evs:#?}");
    assert_eq!(
        deleted[0]["message"],
        "Deleted executor pod: ev-app-exec-2 (failed)"
    );
    // Scaling down deletes the excess, said so.
    w.ok(&args(
        "--driver-pod drv run --until-converged --timeout 30s",
    ));
    let w2 = world(|o| o.startup_latency = Duration::from_secs(60));
    seed_driver(&w2);
    w2.ok(&["--driver-pod", "drv", "reconcile", "--target", "2"]);
    w2.ok(&["--driver-pod", "drv", "scale", "0"]);
    let evs = events_on(&w2, "drv");
    let msgs: Vec<&str> = with_reason(&evs, "SuccessfulDelete")
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert!(!msgs.is_empty(), "{evs:#?}");
    assert!(
        msgs.iter()
            .all(|m| m.ends_with("(excess: above the target)")),
        "{msgs:?}"
    );
}

#[test]
fn no_events_posts_none() {
    let w = world(|_| {});
    seed_driver(&w);
    w.ok(&args("--driver-pod drv --no-events reconcile --target 2"));
    assert!(events_on(&w, "drv").is_empty());
    assert_eq!(w.executors().len(), 2);
}

#[test]
fn events_refused_by_rbac_never_fail_the_tick() {
    let w = world(|o| o.forbid = vec!["ev-create".into()]);
    seed_driver(&w);
    let out = w.ok(&["--driver-pod", "drv", "reconcile", "--target", "2"]);
    let err = stderr(&out);
    assert_eq!(w.executors().len(), 2);
    assert_eq!(
        err.matches("could not post event").count(),
        1,
        "warned once: {err}"
    );
    assert!(err.contains("events create, get and patch"), "{err}");
}

/// Writes a template file into the world's directory; returns its path as a string.
fn template(w: &World, name: &str, text: &str) -> String {
    let p = w.path(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

const MISSPELT_REQUESTS: &str = "apiVersion: v1
kind: Pod
spec:
  containers:
  - name: executor
    image: spark:3.5.0
    resources:
      requets:
        cpu: '1'
";

#[test]
fn a_misspelt_template_field_is_refused_by_strict_validation() {
    let w = world(|_| {});
    seed_driver(&w);
    let t = template(&w, "t.yaml", MISSPELT_REQUESTS);
    let out = w.run(&[
        "--driver-pod",
        "drv",
        "--template",
        &t,
        "reconcile",
        "--target",
        "2",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains(
            r#"Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: unknown field \"spec.containers[0].resources.requets\""#
        ) || err.contains(
            r#"Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.containers[0].resources.requets""#
        ),
        "{err}"
    );
    assert!(err.contains("fix the pod template"), "{err}");
    assert!(w.executors().is_empty());
    let evs = events_on(&w, "drv");
    let failed = with_reason(&evs, "FailedCreate");
    assert_eq!(failed.len(), 1, "{evs:#?}");
    assert!(failed[0]["message"]
        .as_str()
        .unwrap()
        .contains("strict decoding error"));
    // `metdata:` would drop the labels: refused the same way.
    let t = template(
        &w,
        "t2.yaml",
        "kind: Pod\nmetdata:\n  labels: {team: a}\nspec:\n  containers:\n  - {name: e, image: i}\n",
    );
    let out = w.run(&["--template", &t, "reconcile", "--target", "1"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("unknown field"), "{}", stderr(&out));
}

#[test]
fn a_template_that_is_not_a_pod_is_refused_before_any_call() {
    let w = world(|_| {});
    let t = template(
        &w,
        "d.yaml",
        "apiVersion: apps/v1\nkind: Deployment\nspec:\n  containers:\n  - {name: e, image: i}\n",
    );
    let out = w.run(&["--template", &t, "reconcile", "--target", "1"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(r#"kind is \"Deployment\""#) || err.contains(r#"kind is "Deployment""#),
        "{err}"
    );
    assert_eq!(w.sim.stats().requests, 0, "refused before any call");
    let t = template(
        &w,
        "v.yaml",
        "apiVersion: v2\nkind: Pod\nspec:\n  containers:\n  - {name: e, image: i}\n",
    );
    let out = w.run(&["--template", &t, "reconcile", "--target", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("apiVersion"), "{}", stderr(&out));
}

#[test]
fn field_validation_warn_sends_warning_headers() {
    let w = world(|_| {});
    let agent = crate::util::agent(w.sim.ca_pem().unwrap().as_bytes());
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"},
        "spec": {"containers": [{"name": "a", "image": "i", "resources": {"requets": {}}}]}});
    let url = format!(
        "{}/api/v1/namespaces/default/pods?fieldValidation=Warn",
        w.sim.url()
    );
    let resp = agent
        .post(&url)
        .header("Authorization", &format!("Bearer {}", w.token))
        .content_type("application/json")
        .send(pod.to_string())
        .unwrap();
    assert_eq!(resp.status().as_u16(), 201);
    let warnings: Vec<String> = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        warnings,
        vec![r#"299 - "unknown field \"spec.containers[0].resources.requets\"""#]
    );
    assert_eq!(
        podalloc::kube::warning_text(&warnings[0]).as_deref(),
        Some(r#"unknown field "spec.containers[0].resources.requets""#)
    );
    // Strict: the real 400.
    let url = url.replace("Warn", "Strict");
    let mut resp = agent
        .post(&url)
        .header("Authorization", &format!("Bearer {}", w.token))
        .content_type("application/json")
        .send(pod.to_string().replace("p1", "p2"))
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(body["reason"], "BadRequest");
    assert_eq!(
        body["message"],
        r#"Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "spec.containers[0].resources.requets""#
    );
}

#[test]
fn dry_run_prints_a_summary_and_the_pod_on_request() {
    let w = world(|_| {});
    let out = w.ok(&["reconcile", "--target", "2", "--dry-run"]);
    let plan: Value = serde_json::from_str(&crate::util::stdout(&out)).unwrap();
    assert_eq!(plan["create"].as_array().unwrap().len(), 2);
    let err = stderr(&out);
    assert!(
        err.contains("dry run: target 2 (running 0, pending 0, unacknowledged 0); would create 2: ev-app-exec-1, ev-app-exec-2"),
        "{err}"
    );
    let out = w.ok(&args("reconcile --target 2 --dry-run --output summary"));
    assert!(crate::util::stdout(&out).starts_with("dry run: target 2"));
    let out = w.ok(&["reconcile", "--target", "2", "--dry-run", "--output", "pod"]);
    let pod: Value = serde_json::from_str(&crate::util::stdout(&out)).unwrap();
    assert_eq!(pod["kind"], "Pod");
    assert_eq!(pod["metadata"]["name"], "ev-app-exec-1");
    assert_eq!(pod["metadata"]["labels"]["spark-exec-id"], "1");
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        "registry.example/spark:3.5.0"
    );
    assert_eq!(w.sim.stats().creates, 0);
    assert!(!w.state_file().exists());
    let out = w.run(&["reconcile", "--output", "pod"]);
    assert_eq!(out.status.code(), Some(2), "--output needs --dry-run");
}

/// A GET with an `Accept` header, as kubectl sends it: (status, Content-Type, body).
fn get_as(w: &World, path: &str, accept: &str) -> (u16, String, Value) {
    let agent = crate::util::agent(w.sim.ca_pem().unwrap().as_bytes());
    let url = format!("{}{path}", w.sim.url());
    let (mut resp, ct) = crate::util::get_accepting(&agent, &url, &w.token, accept);
    let body = resp.body_mut().read_to_string().unwrap();
    let v = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (resp.status().as_u16(), ct, v)
}

/// What kubectl 1.26+ asks `/api` and `/apis` for first: aggregated discovery, then JSON.
const AGGREGATED: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
/// What `kubectl get` asks a list for.
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

#[test]
fn discovery_answers_what_kubectl_asks() {
    let w = world(|_| {});
    // Plain JSON to the aggregated-discovery Accept: kubectl falls back to the legacy documents.
    let (code, ct, api) = get_as(&w, "/api", AGGREGATED);
    assert_eq!((code, ct.as_str()), (200, "application/json"));
    assert_eq!(api["kind"], "APIVersions");
    assert_eq!(api["versions"], json!(["v1"]));
    let (code, _, apis) = get_as(&w, "/apis", AGGREGATED);
    assert_eq!(code, 200);
    assert_eq!(apis["kind"], "APIGroupList");
    let (code, _, v1) = get_as(&w, "/api/v1", "application/json, */*");
    assert_eq!(code, 200);
    assert_eq!(v1["kind"], "APIResourceList");
    assert_eq!(v1["groupVersion"], "v1");
    let res = v1["resources"].as_array().unwrap();
    let pods = res.iter().find(|r| r["name"] == "pods").unwrap();
    assert_eq!(pods["kind"], "Pod");
    assert_eq!(pods["namespaced"], true);
    assert!(pods["verbs"].as_array().unwrap().contains(&json!("list")));
    assert_eq!(pods["shortNames"], json!(["po"]));
    for r in ["events", "configmaps", "namespaces"] {
        assert!(res.iter().any(|x| x["name"] == r), "{r}");
    }
    // OpenAPI v3: the fieldValidation parameter kubectl's --validate=strict looks for.
    let (code, _, root) = get_as(&w, "/openapi/v3", "application/json");
    assert_eq!(code, 200);
    let url = root["paths"]["api/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap();
    let (code, _, doc) = get_as(&w, url, "application/json");
    assert_eq!(code, 200);
    let op = &doc["paths"]["/api/v1/namespaces/{namespace}/pods/{name}"]["patch"];
    assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "Pod");
    assert_eq!(op["parameters"][0]["name"], "fieldValidation");
    // Discovery needs authentication, as on a real cluster.
    let agent = crate::util::agent(w.sim.ca_pem().unwrap().as_bytes());
    let resp = agent.get(&format!("{}/api", w.sim.url())).call().unwrap();
    assert_eq!(resp.status().as_u16(), 401);
}

#[test]
fn kubectl_get_pods_gets_a_table() {
    // No nodes: the pods stay Pending (unscheduled, no container status yet).
    let w = world(|o| o.nodes = 0);
    w.ok(&["reconcile", "--target", "2"]);
    let (code, _, t) = get_as(&w, "/api/v1/namespaces/default/pods", TABLE);
    assert_eq!(code, 200, "{t}");
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["priority"] == 0)
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Name", "Ready", "Status", "Restarts", "Age"]);
    let rows = t["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["cells"][0], "ev-app-exec-1");
    assert_eq!(rows[0]["cells"][1], "0/1");
    assert_eq!(rows[0]["cells"][2], "Pending");
    assert_eq!(rows[0]["cells"][3], "0");
    assert_eq!(rows[0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(rows[0]["object"]["metadata"]["name"], "ev-app-exec-1");
    // Events as `kubectl get events` shows them.
    let (_, _, t) = get_as(&w, "/api/v1/namespaces/default/events", TABLE);
    assert_eq!(t["kind"], "Table");
    let row = &t["rows"][0]["cells"];
    assert_eq!(row[1], "Normal");
    assert_eq!(row[2], "SuccessfulCreate");
    assert_eq!(row[3], "pod/ev-app-exec-1");
    // Without the Table Accept: the plain list.
    let (_, _, l) = get_as(&w, "/api/v1/namespaces/default/pods", "application/json");
    assert_eq!(l["kind"], "PodList");
}

#[test]
fn a_create_in_a_namespace_that_does_not_exist_is_404() {
    let w = SimWorld::new()
        .app(APP)
        .namespace("nosuch")
        .options(|o| o.namespaces = Some(vec!["default".into(), "kube-system".into()]))
        .start();
    let out = w.run(&["reconcile", "--target", "1"]);
    let err = stderr(&out);
    // A refusal another create would meet again (exit 4), named for what it is.
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("fix --namespace"), "{err}");
    assert!(
        err.contains(r#"namespaces \"nosuch\" not found"#)
            || err.contains(r#"namespaces "nosuch" not found"#),
        "{err}"
    );
    let (code, body) = w.api(
        "POST",
        "/api/v1/namespaces/nosuch/pods",
        Some(&json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "i"}]}})),
    );
    assert_eq!(code, 404);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "namespaces \"nosuch\" not found", "reason": "NotFound",
               "details": {"name": "nosuch", "kind": "namespaces"}, "code": 404})
    );
    let (code, _) = w.api("GET", "/api/v1/namespaces/nosuch", None);
    assert_eq!(code, 404);
    let (code, ns) = w.api("GET", "/api/v1/namespaces/default", None);
    assert_eq!(code, 200);
    assert_eq!(ns["status"]["phase"], "Active");
    // Made with `kubectl create -f ns.yaml`, it exists.
    let (code, _) = w.api(
        "POST",
        "/api/v1/namespaces",
        Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nosuch"}})),
    );
    assert_eq!(code, 201);
    // The refusal's back-off still holds a one-shot command (exit 4, saying for how long);
    // once it has passed, the create goes through.
    let err = w.run_exits(&["reconcile", "--target", "1"], 4);
    assert!(err.contains("creation backs off for"), "{err}");
    let until = w.state()["create_backoff"]["until_ms"].as_u64().unwrap();
    crate::util::sleep_past(until, 200);
    w.ok(&["reconcile", "--target", "1"]);
}

/// The real kubectl, when one is installed: `get pods`, `get events`, `describe pod` and a
/// strict create against the simulator.
#[test]
fn real_kubectl_reads_the_simulator() {
    if crate::util::kubectl_missing() {
        return;
    }
    let w = world(|_| {});
    seed_driver(&w);
    w.ok(&["--driver-pod", "drv", "reconcile", "--target", "2"]);
    let kc = w.path("kubeconfig");
    let config = json!({"apiVersion": "v1", "kind": "Config", "current-context": "sim",
        "clusters": [{"name": "sim", "cluster": {"server": w.sim.url(), "certificate-authority": w.ca}}],
        "users": [{"name": "sim", "user": {"token": w.token}}],
        "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": "default"}}]});
    std::fs::write(&kc, config.to_string()).unwrap();
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kc)
            .arg("--cache-dir")
            .arg(w.path("kcache"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            crate::util::stdout(&out),
            crate::util::stderr(&out),
        )
    };
    let (ok, out, err) = kubectl(&["get", "pods"]);
    assert!(ok, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{out}"
    );
    assert!(out.contains("ev-app-exec-2"), "{out}");
    let (ok, out, err) = kubectl(&["describe", "pod", "drv"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("SuccessfulCreate") && out.contains("podalloc"),
        "{out}"
    );
    let (ok, out, err) = kubectl(&["get", "events"]);
    assert!(ok, "{err}");
    assert!(out.contains("Created executor pod: ev-app-exec-1"), "{out}");
    std::fs::write(
        w.path("p.yaml"),
        MISSPELT_REQUESTS.replace("spec:", "metadata: {name: x}\nspec:"),
    )
    .unwrap();
    let p = w.path("p.yaml");
    let (ok, _, err) = kubectl(&["create", "-f", p.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains(
            "strict decoding error: unknown field \"spec.containers[0].resources.requets\""
        ),
        "{err}"
    );
}

#[test]
fn a_crash_loop_halt_is_posted_on_the_driver() {
    let w = world(|o| o.failure_rate = 1.0);
    seed_driver(&w);
    let mut halted = false;
    for _ in 0..30 {
        let out = w.run(&args(
            "--driver-pod drv --max-failures 2 reconcile --target 3",
        ));
        if out.status.code() == Some(6) {
            halted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(halted, "the guard never halted");
    let evs = events_on(&w, "drv");
    let halt = with_reason(&evs, "CrashLoopHalt");
    assert_eq!(halt.len(), 1, "{evs:#?}");
    assert_eq!(halt[0]["type"], "Warning");
    assert!(!with_reason(&evs, "ExecutorFailed").is_empty(), "{evs:#?}");
}

/// The simulator's request log (`GET /sim/log`) as (method, path, status) triples.
fn requests(w: &World) -> Vec<(String, String, Value)> {
    (w.sim.request_log().lines())
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("method"), s("path"), r["status"].clone())
        })
        .collect()
}

/// The GETs of single executor pods (`GET .../pods/NAME`) in the request log.
fn pod_reads(w: &World) -> Vec<String> {
    let prefix = format!("/api/v1/namespaces/default/pods/{APP}-exec-");
    (requests(w).into_iter())
        .filter(|(m, p, _)| m == "GET" && p.starts_with(&prefix))
        .map(|(_, p, _)| p)
        .collect()
}

/// Each SuccessfulCreate of executors 1..=n is on its pod, with the pod's uid.
fn assert_created_events(w: &World, n: u64) {
    for id in 1..=n {
        let name = format!("{APP}-exec-{id}");
        let (code, pod) = w.api(
            "GET",
            &format!("/api/v1/namespaces/default/pods/{name}"),
            None,
        );
        assert_eq!(code, 200, "{pod}");
        let evs = events_on(w, &name);
        let created = with_reason(&evs, "SuccessfulCreate");
        assert_eq!(created.len(), 1, "{evs:#?}");
        assert_eq!(created[0]["involvedObject"]["uid"], pod["metadata"]["uid"]);
    }
}

#[test]
fn the_uid_of_a_created_pod_comes_from_the_create_not_a_get() {
    let w = world(|_| {});
    w.ok(&["reconcile", "--target", "5"]);
    let log = requests(&w);
    let reads = pod_reads(&w);
    assert!(
        reads.is_empty(),
        "no GET per created pod: {reads:?}\n{log:#?}"
    );
    let count = |m: &str, p: &str| log.iter().filter(|r| r.0 == m && r.1.ends_with(p)).count();
    assert_eq!(count("POST", "/pods"), 5, "{log:#?}");
    assert_eq!(count("POST", "/events"), 5, "{log:#?}");
    // The home's lookup (the app's ExecutorSets, its state ConfigMaps, its Lease), one pod
    // list, five creates, five Events: nothing else.
    assert_eq!(w.sim.stats().requests, 14, "{log:#?}");
    assert_created_events(&w, 5);
}

#[test]
fn a_create_answered_409_for_our_pod_reads_it_once() {
    // The first create happens but its answer is lost; the client's retry (or the next
    // tick) meets 409 AlreadyExists and reads the pod to see that it is ours. That read
    // gives the uid for the Event: no second one.
    let w = world(|o| o.faults = crate::util::rules(&["create:lost-response@1"]));
    let _ = w.run(&["reconcile", "--target", "1"]);
    w.ok(&["reconcile"]);
    let log = requests(&w);
    let reads = pod_reads(&w);
    assert_eq!(w.sim.stats().create_conflicts, 1, "{log:#?}");
    assert_eq!(reads.len(), 1, "{log:#?}");
    assert_created_events(&w, 1);
}

#[test]
fn one_process_for_many_apps_posts_each_apps_events_on_its_own_driver() {
    let w = SimWorld::quick(APP).start();
    let mut uids = Vec::new();
    for (i, n) in [(0, 2), (1, 3)] {
        let driver = json!({"metadata": {"name": format!("drv-{i}"),
            "labels": {"spark-role": "driver", "spark-app-selector": format!("app-{i}")},
            "annotations": {"podalloc.io/executors": n.to_string()}},
            "spec": {"containers": [{"name": "d", "image": "spark"}]},
            "status": {"phase": "Running"}});
        let (code, pod) = w.api("POST", "/sim/pods/default", Some(&driver));
        assert_eq!(code, 201, "{pod}");
        uids.push(pod["metadata"]["uid"].as_str().unwrap().to_string());
    }
    let mut c = crate::util::podalloc();
    c.args(["--server", &w.sim.url(), "--token", &w.token])
        .arg("--certificate-authority")
        .arg(&w.ca)
        .args(["--batch-delay", "100ms", "apps", "--state-dir"])
        .arg(w.path("states"))
        .args(args(
            "--discover spark-role=driver --image spark:3.5 --until-converged --timeout 20s",
        ));
    crate::util::exits(&mut c, 0);
    for (i, n) in [(0, 2), (1, 3)] {
        let evs = events_on(&w, &format!("drv-{i}"));
        let created = with_reason(&evs, "SuccessfulCreate");
        assert_eq!(created.len(), n, "drv-{i}: {evs:#?}");
        for e in created {
            assert_eq!(e["involvedObject"]["uid"], uids[i].as_str());
            let msg = e["message"].as_str().unwrap();
            assert!(msg.contains(&format!("app-{i}-exec-")), "{msg}");
        }
    }
    // No executor pod was read for its Event's uid.
    let log = requests(&w);
    let reads = (log.iter()).filter(|r| r.0 == "GET" && r.1.contains("/pods/app-"));
    assert_eq!(reads.count(), 0, "{log:#?}");
}

/// Events are best effort and off the tick's path: with every Event create hanging for a
/// minute, `run` converges as fast as with `--no-events` (it exited 5 after 90 s at 5 of 8
/// before), and exits at most one event deadline (2 s) after it is done.
#[test]
fn hanging_event_creates_never_hold_the_tick() {
    let w = SimWorld::quick(APP)
        .faults(&["ev-create:delay:60000@always"])
        .start();
    seed_driver(&w);
    let t = std::time::Instant::now();
    let out = w.run(&[
        "--driver-pod",
        "drv",
        "--batch-size",
        "2",
        "run",
        "--target",
        "8",
        "--until-converged",
        "--timeout",
        "40s",
    ]);
    let took = t.elapsed();
    eprintln!(
        "events: converged to 8 with Event creates hanging in {:.1}s",
        took.as_secs_f64()
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(w.live().len(), 8);
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// A leader that loses its Lease while an Event request waits (its renewals refused; in a
/// new user's trial, a SIGSTOP of the leader) says that the event was not posted because it
/// no longer leads, not that the request timed out (which is only how the wait ended).
#[test]
fn an_event_cut_off_by_a_lost_lease_says_so() {
    let w = SimWorld::quick(APP)
        .faults(&["ev-create:delay:60000@always", "lease-update:503@always"])
        .start();
    seed_driver(&w);
    // It takes the Lease with its create, cannot renew it, and stops leading 1 s later,
    // while the first tick's Event create waits (up to the events' 2 s).
    let elect = "--leader-elect --leader-elect-lease-duration 2s \
                 --leader-elect-renew-deadline 1s --leader-elect-retry-period 200ms";
    let line =
        format!("--driver-pod drv --state-store configmap:cut run --target 2 --timeout 6s {elect}");
    let err = stderr(&w.run(&args(&line)));
    assert!(err.contains("became the leader"), "{err}");
    assert!(
        err.contains(" not posted: this replica is no longer the leader"),
        "{err}"
    );
    assert!(!err.contains("could not post event"), "{err}");
}
