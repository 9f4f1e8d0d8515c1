//! The ExecutorSet custom resource (`deploy/crd.yaml`, contract `docs/executorset.md`): the
//! CRD says what the contract says, the simulator validates with the CRD's schema, and
//! kubectl drives it as it drives a Deployment (`kubectl scale es NAME --replicas N`,
//! `kubectl get es` with the printer columns, `kubectl patch`), as the `podalloc` user
//! under the recipe's Role, on both servers; `kubectl annotate configmap` works on both.

use crate::both::{both, Env, Pods};
use crate::util::{stderr, stdout};
use serde_json::{json, Value};

fn crd() -> Value {
    crate::deploy::docs("crd.yaml").remove(0)
}

/// The CRD's one version.
fn version(crd: &Value) -> &Value {
    let versions = crd["spec"]["versions"].as_array().unwrap();
    assert_eq!(versions.len(), 1);
    &versions[0]
}

/// The CRD names the ExecutorSet kind, its one version, its subresources and columns.
#[test]
fn the_crd_names_the_kind_its_version_subresources_and_columns() {
    let crd = crd();
    assert_eq!(crd["apiVersion"], "apiextensions.k8s.io/v1");
    assert_eq!(crd["kind"], "CustomResourceDefinition");
    assert_eq!(crd["metadata"]["name"], "executorsets.podalloc.io");
    let spec = &crd["spec"];
    assert_eq!(spec["group"], "podalloc.io");
    assert_eq!(spec["scope"], "Namespaced");
    assert_eq!(
        spec["names"],
        json!({"kind": "ExecutorSet", "listKind": "ExecutorSetList", "plural": "executorsets",
               "singular": "executorset", "shortNames": ["es"]})
    );
    let v = version(&crd);
    assert_eq!(
        (&v["name"], &v["served"], &v["storage"]),
        (&json!("v1alpha1"), &json!(true), &json!(true))
    );
    assert_eq!(
        v["subresources"],
        json!({"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}})
    );
    let cols: Vec<(&str, &str)> = (v["additionalPrinterColumns"].as_array().unwrap().iter())
        .map(|c| (c["name"].as_str().unwrap(), c["jsonPath"].as_str().unwrap()))
        .collect();
    assert_eq!(
        cols,
        [
            ("TARGET", ".spec.replicas"),
            ("RUNNING", ".status.replicas"),
            ("PENDING", ".status.pending"),
            ("AGE", ".metadata.creationTimestamp")
        ]
    );
}

/// The CRD's schema has the spec fields, rules and status fields of docs/executorset.md.
#[test]
fn the_crd_schema_is_the_contract_of_docs_executorset() {
    let crd = crd();
    let schema = &version(&crd)["schema"]["openAPIV3Schema"]["properties"];
    let es = &schema["spec"];
    assert_eq!(es["required"], json!(["appId"]));
    assert_eq!(
        es["properties"]["appId"]["x-kubernetes-validations"][0]["rule"],
        "self == oldSelf"
    );
    for f in ["resourceProfile", "replicas", "minReplicas", "maxReplicas"] {
        let p = &es["properties"][f];
        assert_eq!(
            (&p["type"], &p["format"], &p["minimum"]),
            (&json!("integer"), &json!("int32"), &json!(0)),
            "{f}"
        );
    }
    let rule = es["x-kubernetes-validations"][0]["rule"].as_str().unwrap();
    assert!(
        rule.contains("self.minReplicas <= self.maxReplicas"),
        "{rule}"
    );
    let rule = es["x-kubernetes-validations"][1]["rule"].as_str().unwrap();
    assert!(
        rule.contains("oldSelf.resourceProfile"),
        "resourceProfile is immutable: {rule}"
    );
    assert_eq!(
        es["properties"]["template"]["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(es["properties"]["removals"]["type"], "array");
    let status: Vec<&str> = (schema["status"]["properties"].as_object().unwrap().keys())
        .map(String::as_str)
        .collect();
    for f in [
        "observedGeneration",
        "target",
        "replicas",
        "readyReplicas",
        "pending",
        "unacknowledged",
        "selector",
        "conditions",
        "appliedRemovals",
        "allocator",
    ] {
        assert!(status.contains(&f), "status.{f} missing: {status:?}");
    }
}

/// The CRD's schema without its descriptions.
fn strip_descriptions(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            (m.iter())
                .filter(|(k, _)| *k != "description")
                .map(|(k, v)| (k.clone(), strip_descriptions(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[test]
fn the_simulator_validates_with_the_crds_schema_and_columns() {
    let crd = crd();
    let v = version(&crd);
    assert_eq!(
        strip_descriptions(&v["schema"]["openAPIV3Schema"]),
        podalloc_sim::executorset_schema()
    );
}

/// kubectl as the `podalloc` user ([`Env::kubectl`]): its standard output; panics with its
/// standard error when it fails.
fn kubectl(e: &Env, args: &[&str], input: Option<&str>) -> String {
    let (ok, out, err) = kubectl_as(e, false, args, input);
    assert!(ok, "kubectl {args:?}: {err}");
    out
}

/// kubectl as the `podalloc` user or (`admin`) the admin: whether it succeeded, its standard
/// output and its standard error.
fn kubectl_as(e: &Env, admin: bool, args: &[&str], input: Option<&str>) -> (bool, String, String) {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = (e.kubectl(admin).args(args))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.unwrap_or("").as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (out.status.success(), stdout(&out), stderr(&out))
}

fn es_path(e: &Env, name: &str) -> String {
    format!(
        "/apis/podalloc.io/v1alpha1/namespaces/{}/executorsets/{name}",
        e.ns
    )
}

both!(
    kubectl: kubectl_scales_an_executorset_and_gets_its_columns,
    "spark-etl",
    Pods::default(),
    |e| {
        let es = json!({"apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
        "metadata": {"name": "etl", "labels": {"spark-app-selector": "spark-etl"}},
        "spec": {"appId": "spark-etl", "replicas": 1}});
        let out = kubectl(e, &["create", "-f", "-"], Some(&es.to_string()));
        assert_eq!(out.trim(), "executorset.podalloc.io/etl created");
        let out = kubectl(e, &["scale", "es", "etl", "--replicas", "3"], None);
        assert_eq!(out.trim(), "executorset.podalloc.io/etl scaled");
        let (code, got) = e.as_podalloc("GET", &es_path(e, "etl"), None);
        assert_eq!(code, 200, "{got}");
        assert_eq!(got["spec"]["replicas"], 3);
        assert_eq!(
            got["metadata"]["generation"], 2,
            "the scale changed the spec"
        );
        // The controller's status, through /status.
        let mut with_status = got.clone();
        with_status["status"] = json!({"replicas": 2, "pending": 1,
        "selector": "spark-app-selector=spark-etl,spark-role=executor"});
        let (code, put) = e.as_podalloc(
            "PUT",
            &format!("{}/status", es_path(e, "etl")),
            Some(&with_status),
        );
        assert_eq!(code, 200, "{put}");
        assert_eq!(
            put["metadata"]["generation"], 2,
            "a status write is not a spec change"
        );
        let (code, scale) = e.as_podalloc("GET", &format!("{}/scale", es_path(e, "etl")), None);
        assert_eq!(code, 200, "{scale}");
        assert_eq!(
            (&scale["apiVersion"], &scale["kind"]),
            (&json!("autoscaling/v1"), &json!("Scale"))
        );
        assert_eq!(scale["spec"], json!({"replicas": 3}));
        assert_eq!(
            scale["status"],
            json!({"replicas": 2, "selector": "spark-app-selector=spark-etl,spark-role=executor"})
        );
        let out = kubectl(e, &["get", "es"], None);
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            ["NAME", "TARGET", "RUNNING", "PENDING", "AGE"],
            "{out}"
        );
        assert_eq!(lines[1][..4], ["etl", "3", "2", "1"], "{out}");
        assert_eq!(lines.len(), 2, "{out}");
        // `kubectl patch`: a merge patch works; a strategic merge patch (its default) is refused,
        // as for every custom resource.
        let out = kubectl(
            e,
            &[
                "patch",
                "es",
                "etl",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"maxReplicas":10}}"#,
            ],
            None,
        );
        assert_eq!(out.trim(), "executorset.podalloc.io/etl patched");
        let (ok, _, err) = kubectl_as(
            e,
            false,
            &["patch", "es", "etl", "-p", r#"{"spec":{"maxReplicas":9}}"#],
            None,
        );
        assert!(!ok);
        assert!(err.contains("application/merge-patch+json"), "{err}");
        let (_, got) = e.as_podalloc("GET", &es_path(e, "etl"), None);
        assert_eq!(got["spec"]["maxReplicas"], 10);
    }
);

both!(
    kubectl: kubectl_annotates_a_configmap,
    "spark-etl",
    Pods::default(),
    |e| {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "podalloc-spark-etl"}, "data": {"state": "{}"}});
        let path = format!("/api/v1/namespaces/{}/configmaps", e.ns);
        let (code, made) = e.admin("POST", &path, Some(&cm));
        assert_eq!(code, 201, "{made}");
        let args = [
            "annotate",
            "configmap",
            "podalloc-spark-etl",
            "podalloc.io/executors=5",
            "--overwrite",
        ];
        let (ok, out, err) = kubectl_as(e, true, &args, None);
        assert!(ok, "{err}");
        assert_eq!(out.trim(), "configmap/podalloc-spark-etl annotated");
        let (_, got) = e.admin("GET", &format!("{path}/podalloc-spark-etl"), None);
        assert_eq!(got["metadata"]["annotations"]["podalloc.io/executors"], "5");
        assert_eq!(got["data"]["state"], "{}");
        let args = ["label", "configmap", "podalloc-spark-etl", "team=batch"];
        let (ok, _, err) = kubectl_as(e, true, &args, None);
        assert!(ok, "{err}");
        let (_, got) = e.admin("GET", &format!("{path}/podalloc-spark-etl"), None);
        assert_eq!(got["metadata"]["labels"]["team"], "batch");
    }
);

both!(
    a_status_write_the_rbac_refuses_ends_run_and_reconcile_with_exit_4,
    "rbac-es",
    Pods::default(),
    |env| {
        let e = env.sibling_forbidding(
            "rbacstatus",
            "es-status-update",
            ("executorsets/status", "update"),
        );
        // The Role's change is in force once a status write as podalloc is refused by RBAC
        // (403 comes before the object's lookup; 404 means it is still allowed).
        let status = format!("{}/status", es_path(&e, "missing"));
        let body = json!({"apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
            "metadata": {"name": "missing"}, "spec": {"appId": "rbac-es"}});
        e.wait_for("the Role without executorsets/status update", |e| {
            e.as_podalloc("PUT", &status, Some(&body)).0 == 403
        });
        let store = ["--state-store", "executorset:rbac-es"];
        // A loop stops with exit 4 at its first status write (it warned every tick for ever).
        let err = e.exits(
            &[&["run", "--target", "1", "--timeout", "30s"][..], &store].concat(),
            4,
        );
        assert!(
            err.contains("executorsets/status") && err.contains("RBAC"),
            "{err}"
        );
        assert!(e.live().is_empty(), "nothing created without a saved state");
        // A one-shot reconcile: exit 4, not 1 (a retry would meet the same refusal).
        let err = e.exits(&[&["reconcile", "--target", "1"][..], &store].concat(), 4);
        assert!(err.contains("executorsets/status"), "{err}");
    }
);
