//! Differential fidelity: the requests podalloc makes, good and bad, sent in the same order to
//! the simulator and to a real kube-apiserver, comparing the status code and every field
//! podalloc reads from the answer (`Status` reason, code and details; list metadata; the
//! defaulted fields of a created pod; ConfigMap and Lease concurrency), then pod lists and
//! errors in Protobuf, read through podalloc's own decoders. A difference is a bug
//! in the simulator, unless [`DELIBERATE`] lists it with the reason it is kept.
//!
//! The second test does the same for the ExecutorSet custom resource (`deploy/crd.yaml`,
//! which the harness installs on kube-apiserver): the object, `/status`, `/scale`, the
//! schema's and CEL rules' 422s, the 409s, and each PATCH type on ExecutorSets and
//! ConfigMaps.
//!
//! Without a built control plane the test says so in one line (see `tests/real/`).

use crate::both::{Env, Pods};
use serde_json::{json, Value};

/// One request: `{ns}` in the path and body is the test's namespace; `fields` are the JSON
/// pointers of the answer to compare (beside the status code).
struct Case {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    body: Option<Value>,
    fields: &'static [&'static str],
    /// Sent as the admin: authorization comes before admission, so a request the `podalloc`
    /// user may not make at all would only compare two 403s.
    admin: bool,
}

/// Differences kept on purpose: (case, pointer, why). What the simulator's Protobuf leaves
/// out (fields no case reads), and what it does not serve of the ExecutorSet CRD (watch,
/// deletecollection, server-side apply), are listed in `tests/real/README.md`.
const DELIBERATE: &[(&str, &str, &str)] = &[];

fn pod(name: &str) -> Value {
    pod_id(name, 1)
}

/// Executor `id` of app `diff`, named `name`.
fn pod_id(name: &str, id: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"spark-app-selector": "diff", "spark-role": "executor", "spark-exec-id": id.to_string()}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "executor", "image": "img"}]}})
}

const STATUS: &[&str] = &[
    "/kind",
    "/status",
    "/reason",
    "/code",
    "/details/name",
    "/details/kind",
    "/details/group",
];

/// The requests, in the order they are sent: those on pods, then those on ConfigMaps,
/// Leases and Events.
fn cases() -> Vec<Case> {
    let mut cases = pod_cases();
    cases.extend(store_cases());
    cases
}

/// The requests on pods: lists, watches, creates, deletes, finalizers and evictions.
#[rustfmt::skip]
fn pod_cases() -> Vec<Case> {
    let mut invalid = pod("Bad_Name");
    invalid["metadata"]["name"] = json!("Bad_Name");
    let mut strict = pod("diff-strict");
    strict["spec"]["containers"][0]["resources"] = json!({"requets": {"cpu": "1"}});
    let list_meta: &[&str] = &["/kind", "/apiVersion", "/items"];
    let created: &[&str] = &[
        "/kind",
        "/apiVersion",
        "/metadata/name",
        "/metadata/namespace",
        "/status/phase",
        "/status/qosClass",
        "/spec/restartPolicy",
        "/spec/terminationGracePeriodSeconds",
        "/spec/dnsPolicy",
        "/spec/schedulerName",
        "/spec/priority",
        "/spec/enableServiceLinks",
        "/spec/preemptionPolicy",
        "/spec/tolerations",
        "/spec/securityContext",
        "/spec/containers/0/imagePullPolicy",
        "/spec/containers/0/terminationMessagePath",
        "/spec/containers/0/terminationMessagePolicy",
        "/spec/containers/0/resources",
    ];
    vec![
        Case { name: "list empty", method: "GET", path: "/api/v1/namespaces/{ns}/pods?labelSelector=spark-app-selector%3Ddiff,spark-role%3Dexecutor", body: None, fields: list_meta, admin: false },
        Case { name: "list bad selector", method: "GET", path: "/api/v1/namespaces/{ns}/pods?labelSelector=a%3D%3Db%3Dc", body: None, fields: STATUS, admin: false },
        Case { name: "list bad field selector", method: "GET", path: "/api/v1/namespaces/{ns}/pods?fieldSelector=spec.nope%3Dx", body: None, fields: STATUS, admin: false },
        Case { name: "create", method: "POST", path: "/api/v1/namespaces/{ns}/pods?fieldValidation=Strict", body: Some(pod("diff-1")), fields: created, admin: false },
        // A watch from the current state (synthetic ADDED, filtered by name), ended by its
        // timeout; one from resourceVersion 1, which a fresh cluster's watch cache still holds
        // the history after (it started at etcd's first revision): the namespace's changes.
        Case { name: "watch by name", method: "GET", path: "/api/v1/namespaces/{ns}/pods?watch=true&fieldSelector=metadata.name%3Ddiff-1&timeoutSeconds=1", body: None, fields: &["/type", "/object/kind", "/object/metadata/name"], admin: true },
        Case { name: "watch from resourceVersion 1", method: "GET", path: "/api/v1/namespaces/{ns}/pods?watch=true&resourceVersion=1&timeoutSeconds=1", body: None, fields: &["/type", "/object/kind", "/object/metadata/name"], admin: true },
        Case { name: "create again", method: "POST", path: "/api/v1/namespaces/{ns}/pods?fieldValidation=Strict", body: Some(pod("diff-1")), fields: STATUS, admin: false },
        Case { name: "create strict unknown field", method: "POST", path: "/api/v1/namespaces/{ns}/pods?fieldValidation=Strict", body: Some(strict), fields: &["/kind", "/reason", "/code", "/message"], admin: false },
        Case { name: "create invalid name", method: "POST", path: "/api/v1/namespaces/{ns}/pods", body: Some(invalid), fields: &["/kind", "/reason", "/code", "/details/name", "/details/kind", "/details/causes/0/field", "/details/causes/0/reason"], admin: false },
        Case { name: "create in a missing namespace", method: "POST", path: "/api/v1/namespaces/no-such-ns/pods", body: Some(pod("diff-9")), fields: STATUS, admin: true },
        Case { name: "create 2", method: "POST", path: "/api/v1/namespaces/{ns}/pods", body: Some(pod("diff-2")), fields: &["/metadata/name"], admin: false },
        Case { name: "create 3", method: "POST", path: "/api/v1/namespaces/{ns}/pods", body: Some(pod("diff-3")), fields: &["/metadata/name"], admin: false },
        Case { name: "list page 1", method: "GET", path: "/api/v1/namespaces/{ns}/pods?limit=1", body: None, fields: &["/kind", "/items/0/metadata/name", "/metadata/remainingItemCount"], admin: false },
        Case { name: "list garbage continue", method: "GET", path: "/api/v1/namespaces/{ns}/pods?limit=1&continue=garbage", body: None, fields: STATUS, admin: false },
        Case { name: "list continue with resourceVersion", method: "GET", path: "/api/v1/namespaces/{ns}/pods?limit=1&continue=garbage&resourceVersion=5", body: None, fields: &["/kind", "/reason", "/code"], admin: false },
        Case { name: "get missing", method: "GET", path: "/api/v1/namespaces/{ns}/pods/diff-404", body: None, fields: STATUS, admin: false },
        Case { name: "delete wrong uid", method: "DELETE", path: "/api/v1/namespaces/{ns}/pods/diff-2", body: Some(json!({"preconditions": {"uid": "00000000-0000-0000-0000-000000000000"}})), fields: &["/kind", "/reason", "/code", "/details/name", "/details/kind"], admin: false },
        Case { name: "delete unbound", method: "DELETE", path: "/api/v1/namespaces/{ns}/pods/diff-3", body: Some(json!({"gracePeriodSeconds": 30})), fields: &["/kind", "/metadata/name"], admin: false },
        Case { name: "get deleted", method: "GET", path: "/api/v1/namespaces/{ns}/pods/diff-3", body: None, fields: STATUS, admin: false },
        Case { name: "delete missing", method: "DELETE", path: "/api/v1/namespaces/{ns}/pods/diff-3", body: None, fields: STATUS, admin: false },
        // podalloc's delete of many executors: one deletecollection by app, role and ids,
        // only while Pending for excess pods; the answer lists the pods it matched.
        Case { name: "create 4", method: "POST", path: "/api/v1/namespaces/{ns}/pods", body: Some(pod_id("diff-4", 4)), fields: &["/metadata/name"], admin: false },
        Case { name: "create 5", method: "POST", path: "/api/v1/namespaces/{ns}/pods", body: Some(pod_id("diff-5", 5)), fields: &["/metadata/name"], admin: false },
        Case { name: "deletecollection of ids while Pending", method: "DELETE", path: "/api/v1/namespaces/{ns}/pods?labelSelector=spark-app-selector%3Ddiff%2Cspark-role%3Dexecutor%2Cspark-exec-id%20in%20%284%2C5%2C6%29&fieldSelector=status.phase%3DPending", body: None, fields: &["/kind", "/apiVersion", "/items/0/metadata/name", "/items/1/metadata/name", "/items/2"], admin: false },
        Case { name: "deletecollection matching nothing", method: "DELETE", path: "/api/v1/namespaces/{ns}/pods?labelSelector=spark-app-selector%3Ddiff%2Cspark-role%3Dexecutor%2Cspark-exec-id%20in%20%284%2C5%29", body: None, fields: &["/kind", "/items/0"], admin: false },
        Case { name: "get after deletecollection", method: "GET", path: "/api/v1/namespaces/{ns}/pods/diff-4", body: None, fields: STATUS, admin: false },
        // A finalizer keeps a deleted (here unbound) pod, deletionGracePeriodSeconds 0,
        // until a patch removes it; then it is gone.
        Case { name: "create held by a finalizer", method: "POST", path: "/api/v1/namespaces/{ns}/pods", body: Some({ let mut p = pod_id("diff-6", 6); p["metadata"]["finalizers"] = json!(["podalloc.test/hold"]); p }), fields: &["/metadata/name", "/metadata/finalizers/0"], admin: false },
        Case { name: "delete held by a finalizer", method: "DELETE", path: "/api/v1/namespaces/{ns}/pods/diff-6", body: None, fields: &["/kind", "/metadata/name", "/metadata/deletionGracePeriodSeconds", "/metadata/finalizers/0"], admin: false },
        // Not its phase: on the real side the kubelet emulator finishes every deleted pod, an
        // unbound one too (as PodGC would: Failed), at a moment of its own; the simulator's
        // kubelet leaves an unbound pod alone.
        Case { name: "get held by a finalizer", method: "GET", path: "/api/v1/namespaces/{ns}/pods/diff-6", body: None, fields: &["/kind", "/metadata/deletionGracePeriodSeconds", "/metadata/finalizers/0"], admin: false },
        Case { name: "patch a new finalizer onto a deleted pod", method: "PATCH", path: "/api/v1/namespaces/{ns}/pods/diff-6", body: Some(json!({"metadata": {"finalizers": ["podalloc.test/hold", "podalloc.test/other"]}})), fields: &["/kind", "/code", "/reason", "/message", "/details/causes/0/field", "/details/causes/0/reason"], admin: true },
        Case { name: "patch away the finalizer", method: "PATCH", path: "/api/v1/namespaces/{ns}/pods/diff-6", body: Some(json!({"metadata": {"finalizers": null}})), fields: &["/kind", "/metadata/name", "/metadata/finalizers"], admin: true },
        Case { name: "get after the finalizer", method: "GET", path: "/api/v1/namespaces/{ns}/pods/diff-6", body: None, fields: STATUS, admin: false },
        // An eviction (policy/v1) of a pod no PodDisruptionBudget covers deletes it: 201 and a
        // Success Status; a missing pod is 404, a body naming another pod 400.
        Case { name: "create 7", method: "POST", path: "/api/v1/namespaces/{ns}/pods", body: Some(pod_id("diff-7", 7)), fields: &["/metadata/name"], admin: false },
        Case { name: "evict", method: "POST", path: "/api/v1/namespaces/{ns}/pods/diff-7/eviction", body: Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "diff-7"}})), fields: &["/kind", "/apiVersion", "/status", "/code", "/details"], admin: false },
        Case { name: "get evicted", method: "GET", path: "/api/v1/namespaces/{ns}/pods/diff-7", body: None, fields: &["/kind", "/metadata/name"], admin: false },
        Case { name: "evict a missing pod", method: "POST", path: "/api/v1/namespaces/{ns}/pods/diff-404/eviction", body: Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "diff-404"}})), fields: STATUS, admin: false },
        Case { name: "evict under another name", method: "POST", path: "/api/v1/namespaces/{ns}/pods/diff-2/eviction", body: Some(json!({"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "other"}})), fields: &["/kind", "/reason", "/code", "/message"], admin: false },
    ]
}

/// The requests on ConfigMaps, Leases and Events, sent after those on pods.
#[rustfmt::skip]
fn store_cases() -> Vec<Case> {
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "diff-lease"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15,
                 "acquireTime": "2026-12-01T10:00:00.000000Z", "renewTime": "2026-12-01T10:00:00.000000Z",
                 "leaseTransitions": 0}});
    let mut bad_time = lease.clone();
    bad_time["metadata"]["name"] = json!("diff-lease-2");
    bad_time["spec"]["renewTime"] = json!("2026-12-01T10:00:00Z");
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "diff-cm"},
        "data": {"state": "{}"}});
    let event = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "diff-ev.1"},
        "involvedObject": {"kind": "Pod", "namespace": "{ns}", "name": "diff-1", "apiVersion": "v1"},
        "reason": "SuccessfulCreate", "message": "Created executor pod: diff-1", "type": "Normal",
        "source": {"component": "podalloc"}, "count": 1,
        "firstTimestamp": "2026-12-01T10:00:00Z", "lastTimestamp": "2026-12-01T10:00:00Z"});
    let mut dry_event = event.clone();
    dry_event["metadata"]["name"] = json!("diff-ev.3");
    let mut bad_event = event.clone();
    bad_event["metadata"]["name"] = json!("diff-ev.2");
    bad_event["involvedObject"]["namespace"] = json!("elsewhere");
    vec![
        Case { name: "configmap create", method: "POST", path: "/api/v1/namespaces/{ns}/configmaps", body: Some(cm.clone()), fields: &["/kind", "/metadata/name", "/data"], admin: false },
        Case { name: "configmap create again", method: "POST", path: "/api/v1/namespaces/{ns}/configmaps", body: Some(cm.clone()), fields: STATUS, admin: false },
        Case { name: "configmap stale update", method: "PUT", path: "/api/v1/namespaces/{ns}/configmaps/diff-cm", body: Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "diff-cm", "resourceVersion": "1"}, "data": {"state": "{\"x\":1}"}})), fields: STATUS, admin: false },
        Case { name: "configmap update without resourceVersion", method: "PUT", path: "/api/v1/namespaces/{ns}/configmaps/diff-cm", body: Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "diff-cm"}, "data": {"state": "{\"x\":2}"}})), fields: &["/kind", "/data"], admin: false },
        Case { name: "configmap update of another name", method: "PUT", path: "/api/v1/namespaces/{ns}/configmaps/diff-cm", body: Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}, "data": {}})), fields: &["/kind", "/reason", "/code"], admin: false },
        Case { name: "configmap get missing", method: "GET", path: "/api/v1/namespaces/{ns}/configmaps/diff-none", body: None, fields: STATUS, admin: false },
        Case { name: "lease create", method: "POST", path: "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", body: Some(lease.clone()), fields: &["/kind", "/apiVersion", "/spec/holderIdentity", "/spec/renewTime", "/spec/leaseDurationSeconds"], admin: false },
        Case { name: "lease update without resourceVersion", method: "PUT", path: "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/diff-lease", body: Some(lease.clone()), fields: &["/kind", "/reason", "/code", "/details/causes/0/field"], admin: false },
        Case { name: "lease stale update", method: "PUT", path: "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/diff-lease", body: Some({ let mut l = lease.clone(); l["metadata"]["resourceVersion"] = json!("1"); l }), fields: STATUS, admin: false },
        Case { name: "lease renewTime without microseconds", method: "POST", path: "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", body: Some(bad_time), fields: &["/kind", "/reason", "/code"], admin: false },
        Case { name: "lease get missing", method: "GET", path: "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/nope", body: None, fields: STATUS, admin: false },
        Case { name: "event create", method: "POST", path: "/api/v1/namespaces/{ns}/events", body: Some(event), fields: &["/kind", "/reason", "/count", "/involvedObject/name"], admin: false },
        Case { name: "event in another namespace", method: "POST", path: "/api/v1/namespaces/{ns}/events", body: Some(bad_event), fields: &["/kind", "/reason", "/code", "/details/kind"], admin: false },
        Case { name: "event patch", method: "PATCH", path: "/api/v1/namespaces/{ns}/events/diff-ev.1", body: Some(json!({"count": 2, "lastTimestamp": "2026-12-01T10:01:00Z"})), fields: &["/kind", "/count", "/lastTimestamp"], admin: false },
        // A dry run writes nothing to etcd, so its answer has no resourceVersion.
        Case { name: "event create dry run", method: "POST", path: "/api/v1/namespaces/{ns}/events?dryRun=All", body: Some(dry_event), fields: &["/kind", "/metadata/name", "/metadata/resourceVersion"], admin: false },
        Case { name: "event get after a dry run", method: "GET", path: "/api/v1/namespaces/{ns}/events/diff-ev.3", body: None, fields: STATUS, admin: false },
        // Items of a list carry no type meta; field selectors of every kind name metadata.
        Case { name: "event list", method: "GET", path: "/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3Ddiff-1", body: None, fields: &["/kind", "/apiVersion", "/items/0/kind", "/items/0/apiVersion", "/items/0/metadata/name", "/items/1"], admin: true },
        Case { name: "configmap list by name", method: "GET", path: "/api/v1/namespaces/{ns}/configmaps?fieldSelector=metadata.name%3Ddiff-cm", body: None, fields: &["/kind", "/apiVersion", "/items/0/kind", "/items/0/metadata/name", "/items/1"], admin: true },
        Case { name: "configmap delete stale resourceVersion", method: "DELETE", path: "/api/v1/namespaces/{ns}/configmaps/diff-cm", body: Some(json!({"preconditions": {"resourceVersion": "1"}})), fields: &["/kind", "/reason", "/code", "/details/name"], admin: true },
        Case { name: "lease delete", method: "DELETE", path: "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/diff-lease", body: None, fields: &["/kind", "/status", "/details/name", "/details/kind", "/details/group"], admin: true },
        // NamespaceLifecycle admits no create of any namespaced kind in a missing namespace.
        Case { name: "lease create in a missing namespace", method: "POST", path: "/apis/coordination.k8s.io/v1/namespaces/no-such-ns/leases", body: Some(lease.clone()), fields: STATUS, admin: true },
    ]
}

/// A discovery request (sent as the admin), compared through `view`: what a client reads of
/// the document (the real one lists many more resources and groups than the simulator serves).
struct Discovery {
    path: &'static str,
    view: fn(&Value) -> Value,
}

/// The verbs podalloc and kubectl use on each kind the simulator serves: a discovery document
/// must list every one of them (kubectl refuses a verb discovery does not list).
const USED_VERBS: &[(&str, &[&str])] = &[
    (
        "pods",
        &[
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "watch",
        ],
    ),
    (
        "configmaps",
        &["create", "delete", "get", "list", "patch", "update"],
    ),
    ("events", &["create", "get", "list", "patch"]),
    ("namespaces", &["create", "get", "list"]),
    ("leases", &["create", "delete", "get", "update"]),
    (
        "executorsets",
        &["create", "delete", "get", "list", "patch", "update"],
    ),
    ("executorsets/status", &["get", "patch", "update"]),
    ("executorsets/scale", &["get", "patch", "update"]),
];

/// An `APIResourceList` as a client reads it: for each resource of [`USED_VERBS`] it lists,
/// its kind, scope, short names and which of the used verbs it lists.
fn resource_view(doc: &Value) -> Value {
    let mut out = serde_json::Map::new();
    for r in doc["resources"].as_array().into_iter().flatten() {
        let name = r["name"].as_str().unwrap_or("");
        let Some((_, used)) = USED_VERBS.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let listed: Vec<&&str> = (used.iter())
            .filter(|v| r["verbs"].as_array().is_some_and(|a| a.contains(&json!(v))))
            .collect();
        out.insert(
            name.into(),
            json!({"kind": r["kind"], "namespaced": r["namespaced"], "group": r["group"],
            "version": r["version"], "singularName": r["singularName"],
            "shortNames": r["shortNames"], "verbs": listed}),
        );
    }
    json!({"kind": doc["kind"], "groupVersion": doc["groupVersion"], "resources": out})
}

fn discoveries() -> Vec<Discovery> {
    let coordination = |doc: &Value| -> Value {
        let group = |name: &str, version: &str| {
            let g = (doc["groups"].as_array().into_iter().flatten())
                .find(|g| g["name"] == name)
                .cloned()
                .unwrap_or(Value::Null);
            json!({"preferred": g["preferredVersion"],
                "served": g["versions"].as_array().is_some_and(|v| v.iter().any(|v| v["version"] == version))})
        };
        json!({"kind": doc["kind"], "coordination.k8s.io": group("coordination.k8s.io", "v1"),
            "podalloc.io": group("podalloc.io", "v1alpha1")})
    };
    vec![
        Discovery {
            path: "/api",
            view: |d| json!({"kind": d["kind"], "versions": d["versions"]}),
        },
        Discovery {
            path: "/api/v1",
            view: resource_view,
        },
        Discovery {
            path: "/apis",
            view: coordination,
        },
        Discovery {
            path: "/apis/coordination.k8s.io",
            view: |d| json!({"kind": d["kind"], "name": d["name"], "preferred": d["preferredVersion"]}),
        },
        Discovery {
            path: "/apis/coordination.k8s.io/v1",
            view: resource_view,
        },
        Discovery {
            path: "/apis/podalloc.io",
            view: |d| json!({"kind": d["kind"], "name": d["name"], "preferred": d["preferredVersion"]}),
        },
        Discovery {
            path: "/apis/podalloc.io/v1alpha1",
            view: resource_view,
        },
        Discovery {
            path: "/openapi/v3",
            view: |d| {
                json!({
            "api/v1": d["paths"]["api/v1"]["serverRelativeURL"].is_string(),
            "apis/coordination.k8s.io/v1": d["paths"]["apis/coordination.k8s.io/v1"]["serverRelativeURL"].is_string()})
            },
        },
    ]
}

/// The differences between the discovery documents of the two servers.
fn discovery_diffs(sim: &Env, real: &Env) -> Vec<String> {
    let mut diffs = Vec::new();
    for d in discoveries() {
        let (s, r) = (
            sim.admin("GET", d.path, None),
            real.admin("GET", d.path, None),
        );
        if s.0 != r.0 {
            diffs.push(format!(
                "{}: status {} on the simulator, {} on kube-apiserver",
                d.path, s.0, r.0
            ));
        }
        let (a, b) = ((d.view)(&s.1), (d.view)(&r.1));
        if a != b {
            diffs.push(format!(
                "{}: the simulator lists {a}, kube-apiserver {b}",
                d.path
            ));
        }
    }
    diffs
}

fn fill(v: &Value, ns: &str) -> Value {
    serde_json::from_str(&v.to_string().replace("{ns}", ns)).unwrap()
}

/// Sends every case to `env` (the `podalloc` user on the real server), in order.
fn answers(env: &Env) -> Vec<(u16, Value)> {
    cases()
        .iter()
        .map(|c| {
            let path = c.path.replace("{ns}", &env.ns);
            let body = c.body.as_ref().map(|b| fill(b, &env.ns));
            if c.admin {
                env.admin(c.method, &path, body.as_ref())
            } else {
                env.as_podalloc(c.method, &path, body.as_ref())
            }
        })
        .collect()
}

/// A pod list or get sent as podalloc sends its pod lists (Protobuf first, JSON the
/// fallback), once the JSON cases have run: `{ns}` is the namespace, `{continue}` the
/// previous answer's continue token.
const PROTOBUF_CASES: &[(&str, &str)] = &[
    ("protobuf list page 1", "/api/v1/namespaces/{ns}/pods?labelSelector=spark-app-selector%3Ddiff&limit=1"),
    ("protobuf list page 2", "/api/v1/namespaces/{ns}/pods?labelSelector=spark-app-selector%3Ddiff&limit=1&continue={continue}"),
    ("protobuf list bad selector", "/api/v1/namespaces/{ns}/pods?labelSelector=a%3D%3Db%3Dc"),
    ("protobuf list garbage continue", "/api/v1/namespaces/{ns}/pods?limit=1&continue=garbage"),
    ("protobuf get missing", "/api/v1/namespaces/{ns}/pods/diff-404"),
];

/// What podalloc reads of a Protobuf-era answer: its content type and, decoded by podalloc
/// itself, the page (whether a continue token came; per executor its classification and the
/// fields the steps read, not uids, resourceVersions and times) or the error `Status`.
fn protobuf_view(code: u16, ctype: &str, body: &[u8]) -> (Value, Option<String>) {
    if code >= 400 {
        let st = podalloc::kube::ApiStatus::from_body(code, body, None);
        let causes: Vec<_> = (st.causes.iter()).map(|c| (&c.reason, &c.field)).collect();
        let view = json!({"type": ctype, "code": st.code, "reason": st.reason, "causes": format!("{causes:?}")});
        return (view, None);
    }
    let mut snap = podalloc::snapshot::Snapshot::default();
    let cont = match snap.read_page(body, podalloc::snapshot::For::app("diff")) {
        Ok(c) => c,
        Err(e) => return (json!({"type": ctype, "error": e.to_string()}), None),
    };
    let pods: Vec<String> = (snap.executors.values())
        .map(|x| {
            format!(
                "{:?}",
                (
                    &x.name,
                    &x.state,
                    x.scheduled,
                    x.gated,
                    x.unschedulable,
                    &x.waiting
                ),
            ) + &format!(
                "{:?}",
                (
                    &x.reason,
                    x.restarts,
                    x.deletion_cost,
                    x.deletion_ms.is_some(),
                    x.deletion_grace_ms,
                    &x.disruption
                )
            )
        })
        .collect();
    let view = json!({"type": ctype, "continue": cont.is_some(), "executors": pods,
        "warnings": snap.warnings.len(), "foreign": snap.foreign});
    (view, cont)
}

/// Sends every [`PROTOBUF_CASES`] request to `env` as the `podalloc` user, in order: the views.
fn protobuf_answers(env: &Env) -> Vec<(u16, Value)> {
    let mut cont = String::new();
    let accept = "application/vnd.kubernetes.protobuf, application/json;q=0.9";
    (PROTOBUF_CASES.iter())
        .map(|(_, path)| {
            let path = path.replace("{ns}", &env.ns).replace("{continue}", &cont);
            let (code, ctype, body) = env.get_raw(false, &path, accept);
            let (view, next) = protobuf_view(code, &ctype, &body);
            cont = next.unwrap_or_default();
            (code, view)
        })
        .collect()
}

/// Case `name`'s differences in `fields` (JSON pointers) between the simulator's answer and
/// kube-apiserver's (the namespace taken out), but the [`DELIBERATE`] ones.
fn field_diffs(
    name: &str,
    fields: &[&str],
    (s, r): (&Value, &Value),
    (sim, real): (&Env, &Env),
    diffs: &mut Vec<String>,
) {
    for f in fields {
        let (a, b) = (norm(s.pointer(f), &sim.ns), norm(r.pointer(f), &real.ns));
        if a != b && !DELIBERATE.iter().any(|(n, p, _)| *n == name && p == f) {
            diffs.push(format!(
                "{name}: {f} is {a} on the simulator, {b} on kube-apiserver"
            ));
        }
    }
}

/// A value with the namespace (which differs between the two servers) taken out.
fn norm(v: Option<&Value>, ns: &str) -> Value {
    let v = v.cloned().unwrap_or(Value::Null);
    serde_json::from_str(&v.to_string().replace(ns, "{ns}")).unwrap()
}

/// The two servers for differential test `test`: a simulator (namespace `diff-sim`) and a
/// namespace on kube-apiserver (`None` when the control plane is not built here and not
/// required), app `diff` on both. Only the API: no kubelet touches their pods (an hour to
/// schedule), so a delete of a pod is the delete of an unbound pod on both, however busy
/// the machine.
fn idle_servers(test: &str) -> Option<(Env, Env)> {
    let idle = Pods {
        schedule_ms: 3_600_000,
        ..Pods::default()
    };
    let real = Env::real(test, "diff", &idle)?;
    Some((Env::sim_in("diff", &idle, "diff-sim"), real))
}

#[test]
fn the_simulator_answers_as_kube_apiserver_does() {
    let Some((sim, real)) = idle_servers("differential") else {
        return;
    };
    let (s, r) = (answers(&sim), answers(&real));
    let mut diffs = discovery_diffs(&sim, &real);
    for (i, c) in cases().iter().enumerate() {
        if s[i].0 != r[i].0 {
            diffs.push(format!(
                "{}: status {} on the simulator, {} on kube-apiserver ({})",
                c.name, s[i].0, r[i].0, r[i].1
            ));
        }
        field_diffs(
            c.name,
            c.fields,
            (&s[i].1, &r[i].1),
            (&sim, &real),
            &mut diffs,
        );
    }
    let (s, r) = (protobuf_answers(&sim), protobuf_answers(&real));
    for (i, (name, _)) in PROTOBUF_CASES.iter().enumerate() {
        let (a, b) = (norm(Some(&s[i].1), &sim.ns), norm(Some(&r[i].1), &real.ns));
        if s[i].0 != r[i].0 || a != b {
            diffs.push(format!(
                "{name}: {} {a} on the simulator, {} {b} on kube-apiserver",
                s[i].0, r[i].0
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// One request of [`es_cases`]: like [`Case`], with the body's `Content-Type` (`""`:
/// `application/json`) and the `Accept` header (`""`: `application/json`). `{ns}` in the
/// path and body is the test's namespace, `{rv}` the resourceVersion of the last answer that
/// carried one.
struct Req {
    name: &'static str,
    method: &'static str,
    path: &'static str,
    ctype: &'static str,
    accept: &'static str,
    body: Option<Value>,
    fields: &'static [&'static str],
    admin: bool,
}

const ES: &str = "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets";
const MERGE: &str = "application/merge-patch+json";
const JSONP: &str = "application/json-patch+json";
const SMP: &str = "application/strategic-merge-patch+json";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// What a client reads of a 4xx: the Status with its message and causes.
const ERROR: &[&str] = &[
    "/kind",
    "/status",
    "/reason",
    "/code",
    "/message",
    "/details/name",
    "/details/group",
    "/details/kind",
    "/details/causes",
];

fn es(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
        "metadata": {"name": name, "labels": {"spark-app-selector": "diff"}}, "spec": spec})
}

fn scale(name: &str, replicas: i64, rv: &str) -> Value {
    let mut s = json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
        "metadata": {"name": name}, "spec": {"replicas": replicas}});
    if !rv.is_empty() {
        s["metadata"]["resourceVersion"] = json!(rv);
    }
    s
}

/// A request as the `podalloc` user (the recipe's Role grants every ExecutorSet verb used).
fn req(
    name: &'static str,
    method: &'static str,
    path: &'static str,
    ctype: &'static str,
    body: Option<Value>,
    fields: &'static [&'static str],
) -> Req {
    Req {
        name,
        method,
        path,
        ctype,
        accept: "",
        body,
        fields,
        admin: false,
    }
}

/// The ExecutorSet cases: the object, its `/status` and `/scale`, each patch type, the
/// schema's and CEL rules' 422s, the optimistic lock's 409s, the Table.
#[rustfmt::skip]
fn es_cases() -> Vec<Req> {
    let admin = |r: Req| Req { admin: true, ..r };
    let obj: &[&str] = &["/kind", "/apiVersion", "/metadata/name", "/metadata/generation", "/metadata/labels", "/metadata/annotations", "/spec", "/status"];
    let scale_f: &[&str] = &["/kind", "/apiVersion", "/metadata/name", "/spec", "/status"];
    let full = json!({"appId": "diff", "replicas": 2, "minReplicas": 0, "maxReplicas": 10,
        "undeclared": 1, "template": {"spec": {"anything": true}}});
    let mut with_status = es("diff-es", full.clone());
    with_status["status"] = json!({"replicas": 7});
    let mut update = es("diff-es", json!({"appId": "diff", "replicas": 3}));
    update["metadata"]["resourceVersion"] = json!("{rv}");
    update["status"] = json!({"replicas": 9});
    let mut stale = update.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    let mut unconditional = update.clone();
    unconditional["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let mut labels_only = update.clone();
    labels_only["metadata"]["labels"]["extra"] = json!("y");
    let mut app_id = update.clone();
    app_id["spec"]["appId"] = json!("other");
    let mut status = update.clone();
    status["spec"]["replicas"] = json!(99);
    status["metadata"]["labels"] = json!({"changed": "by-status"});
    status["status"] = json!({"replicas": 2, "pending": 1, "readyReplicas": 2,
        "selector": "spark-app-selector=diff,spark-role=executor", "undeclared": 1,
        "allocator": {"nextId": 3}});
    let mut bad_status = status.clone();
    bad_status["status"]["replicas"] = json!(-1);
    let mut status_unconditional = status.clone();
    status_unconditional["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    vec![
        req("es create", "POST", ES, "", Some(with_status), obj),
        req("es create again", "POST", ES, "", Some(es("diff-es", full)), ERROR),
        req("es create without appId", "POST", ES, "", Some(es("diff-bad", json!({"replicas": 1}))), ERROR),
        req("es create with negative replicas", "POST", ES, "", Some(es("diff-bad", json!({"appId": "a", "replicas": -1}))), ERROR),
        req("es create with minReplicas above maxReplicas", "POST", ES, "", Some(es("diff-bad", json!({"appId": "a", "minReplicas": 5, "maxReplicas": 2}))), ERROR),
        req("es create with a string for replicas", "POST", ES, "", Some(es("diff-bad", json!({"appId": "a", "replicas": "3"}))), &["/kind", "/reason", "/code", "/details/causes/0"]),
        req("es create with an undeclared field, strict", "POST", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets?fieldValidation=Strict", "", Some(es("diff-strict", json!({"appId": "a", "undeclared": 1}))), &["/kind", "/reason", "/code", "/message"]),
        req("es get", "GET", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", "", None, obj),
        req("es update without resourceVersion", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", "", Some(unconditional), ERROR),
        req("es stale update", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", "", Some(stale), ERROR),
        req("es update ignores status", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", "", Some(update), obj),
        req("es update of labels only", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", "", Some(labels_only), obj),
        req("es update of appId", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", "", Some(app_id), ERROR),
        req("es status update ignores spec and metadata", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/status", "", Some(status), obj),
        req("es status update without resourceVersion", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/status", "", Some(status_unconditional), ERROR),
        req("es status update with negative replicas", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/status", "", Some(bad_status), ERROR),
        req("es status get", "GET", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/status", "", None, obj),
        req("es scale get", "GET", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/scale", "", None, scale_f),
        req("es scale update", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/scale", "", Some(scale("diff-es", 4, "")), scale_f),
        req("es scale stale update", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/scale", "", Some(scale("diff-es", 4, "1")), ERROR),
        req("es scale update of another name", "PUT", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/scale", "", Some(scale("other", 4, "")), ERROR),
        req("es scale merge patch", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/scale", MERGE, Some(json!({"spec": {"replicas": 5}})), scale_f),
        req("es scale json patch", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/scale", JSONP, Some(json!([{"op": "replace", "path": "/spec/replicas", "value": 6}])), scale_f),
        req("es scale strategic merge patch", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/scale", SMP, Some(json!({"spec": {"replicas": 1}})), ERROR),
        req("es scale to a negative count", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/scale", MERGE, Some(json!({"spec": {"replicas": -1}})), ERROR),
        req("es after scaling", "GET", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", "", None, obj),
        req("es merge patch of an annotation", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", MERGE, Some(json!({"metadata": {"annotations": {"podalloc.io/request": "r1"}}})), obj),
        req("es merge patch with a stale resourceVersion", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", MERGE, Some(json!({"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 1}})), ERROR),
        req("es merge patch with the current resourceVersion", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", MERGE, Some(json!({"metadata": {"resourceVersion": "{rv}"}, "spec": {"replicas": 7}})), obj),
        req("es json patch", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", JSONP, Some(json!([{"op": "test", "path": "/spec/replicas", "value": 7}, {"op": "add", "path": "/spec/removals", "value": [{"request": "r2", "executors": [1, 2]}]}, {"op": "replace", "path": "/spec/replicas", "value": 5}])), obj),
        req("es json patch whose test fails", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", JSONP, Some(json!([{"op": "test", "path": "/spec/replicas", "value": 99}])), ERROR),
        req("es json patch removing a missing key", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", JSONP, Some(json!([{"op": "remove", "path": "/spec/nope"}])), ERROR),
        req("es strategic merge patch", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", SMP, Some(json!({"spec": {"replicas": 1}})), ERROR),
        req("es merge patch of appId", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", MERGE, Some(json!({"spec": {"appId": "other"}})), ERROR),
        req("es merge patch of minReplicas above maxReplicas", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es", MERGE, Some(json!({"spec": {"minReplicas": 20}})), ERROR),
        req("es status merge patch ignores spec", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es/status", MERGE, Some(json!({"spec": {"replicas": 1}, "status": {"pending": 3}})), obj),
        req("es list", "GET", ES, "", None, &["/kind", "/apiVersion", "/items/0/kind", "/items/0/apiVersion", "/items/0/metadata/name", "/items/0/spec", "/items/1"]),
        Req { accept: TABLE, ..req("es table", "GET", ES, "", None, &["/kind", "/apiVersion", "/columnDefinitions", "/rows/0/cells/0", "/rows/0/cells/1", "/rows/0/cells/2", "/rows/0/cells/3", "/rows/0/object/kind", "/rows/0/object/metadata/name", "/rows/1"]) },
        req("es without replicas", "POST", ES, "", Some(es("diff-es2", json!({"appId": "diff2"}))), obj),
        req("es scale get without replicas", "GET", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es2/scale", "", None, ERROR),
        req("es scale patch leaving replicas unset", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es2/scale", MERGE, Some(json!({"metadata": {"labels": {"a": "b"}}})), ERROR),
        req("es scale patch setting replicas", "PATCH", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es2/scale", MERGE, Some(json!({"spec": {"replicas": 1}})), scale_f),
        // As the admin: the recipe's Role grants no delete of ExecutorSets.
        admin(req("es delete", "DELETE", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es2", "", None, &["/kind", "/status", "/details/name", "/details/group", "/details/kind"])),
        req("es get deleted", "GET", "/apis/podalloc.io/v1alpha1/namespaces/{ns}/executorsets/diff-es2", "", None, ERROR),
    ]
}

/// The ConfigMap PATCH cases (as the admin: the recipe's Role grants no patch of
/// ConfigMaps), each patch type as `kubectl annotate`, `kubectl label` and `kubectl patch`
/// send them.
#[rustfmt::skip]
fn cm_patch_cases() -> Vec<Req> {
    const CM: &str = "/api/v1/namespaces/{ns}/configmaps/diff-pcm";
    let cm_f: &[&str] = &["/kind", "/metadata/name", "/metadata/labels", "/metadata/annotations", "/metadata/finalizers", "/data"];
    let admin = |r: Req| Req { admin: true, ..r };
    vec![
        admin(req("cm create for patches", "POST", "/api/v1/namespaces/{ns}/configmaps", "", Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "diff-pcm"}, "data": {"a": "1"}})), cm_f)),
        admin(req("cm merge patch of an annotation", "PATCH", CM, MERGE, Some(json!({"metadata": {"annotations": {"podalloc.io/executors": "5"}}})), cm_f)),
        admin(req("cm strategic merge patch", "PATCH", CM, SMP, Some(json!({"metadata": {"labels": {"x": "y"}, "finalizers": ["podalloc.test/a"]}, "data": {"b": "2"}})), cm_f)),
        admin(req("cm strategic merge patch merges finalizers", "PATCH", CM, SMP, Some(json!({"metadata": {"finalizers": ["podalloc.test/b"]}})), cm_f)),
        admin(req("cm strategic merge patch deletes from finalizers", "PATCH", CM, SMP, Some(json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["podalloc.test/a", "podalloc.test/b"]}})), cm_f)),
        admin(req("cm strategic merge patch replacing data", "PATCH", CM, SMP, Some(json!({"data": {"$patch": "replace", "c": "3"}})), cm_f)),
        admin(req("cm json patch", "PATCH", CM, JSONP, Some(json!([{"op": "add", "path": "/data/d", "value": "4"}, {"op": "remove", "path": "/data/c"}])), cm_f)),
        admin(req("cm json patch whose test fails", "PATCH", CM, JSONP, Some(json!([{"op": "test", "path": "/data/d", "value": "5"}])), ERROR)),
        admin(req("cm json patch that is not a list", "PATCH", CM, JSONP, Some(json!({"op": "add"})), &["/kind", "/reason", "/code"])),
        admin(req("cm merge patch with a stale resourceVersion", "PATCH", CM, MERGE, Some(json!({"metadata": {"resourceVersion": "1"}, "data": {"e": "5"}})), ERROR)),
        admin(req("cm merge patch with the current resourceVersion", "PATCH", CM, MERGE, Some(json!({"metadata": {"resourceVersion": "{rv}"}, "data": {"e": "5"}})), cm_f)),
        admin(req("cm merge patch renaming it", "PATCH", CM, MERGE, Some(json!({"metadata": {"name": "other"}})), &["/kind", "/reason", "/code", "/message"])),
        admin(req("cm patch of another type", "PATCH", CM, "application/json", Some(json!({"data": {"f": "6"}})), &["/kind", "/reason", "/code"])),
        admin(req("cm patch of a missing one", "PATCH", "/api/v1/namespaces/{ns}/configmaps/diff-none", MERGE, Some(json!({"data": {"f": "6"}})), ERROR)),
    ]
}

/// Sends `r` to `env` (`rv`: the `{rv}` to fill in): its status and JSON body.
fn send(env: &Env, r: &Req, rv: &str) -> (u16, Value) {
    let fill = |s: &str| s.replace("{ns}", &env.ns).replace("{rv}", rv);
    let url = format!("{}{}", env.url(), fill(r.path));
    let token = if r.admin {
        env.admin_token()
    } else {
        env.token()
    };
    let auth = format!("Bearer {token}");
    let accept = if r.accept.is_empty() {
        "application/json"
    } else {
        r.accept
    };
    let agent = crate::util::agent(env.ca_pem().as_bytes());
    let body = r.body.as_ref().map(|b| fill(&b.to_string()));
    let ctype = if r.ctype.is_empty() {
        "application/json"
    } else {
        r.ctype
    };
    let resp = match (r.method, body) {
        ("GET", _) => agent
            .get(&url)
            .header("Authorization", &auth)
            .header("Accept", accept)
            .call(),
        ("DELETE", _) => agent.delete(&url).header("Authorization", &auth).call(),
        (m, body) => {
            let b = match m {
                "POST" => agent.post(&url),
                "PUT" => agent.put(&url),
                _ => agent.patch(&url),
            };
            b.header("Authorization", &auth)
                .content_type(ctype)
                .send(body.unwrap_or_default())
        }
    };
    let mut resp = resp.unwrap();
    let code = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap_or_default();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Sends `reqs` to `env` in order, `{rv}` following the answers.
fn req_answers(env: &Env, reqs: &[Req]) -> Vec<(u16, Value)> {
    let mut rv = String::new();
    (reqs.iter())
        .map(|r| {
            let a = send(env, r, &rv);
            if let Some(v) =
                a.1.pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
            {
                rv = v.to_string();
            }
            a
        })
        .collect()
}

/// The differences between the two servers' answers to `reqs`.
fn req_diffs(sim: &Env, real: &Env, reqs: &[Req]) -> Vec<String> {
    let (s, r) = (req_answers(sim, reqs), req_answers(real, reqs));
    let mut diffs = Vec::new();
    for (i, c) in reqs.iter().enumerate() {
        if s[i].0 != r[i].0 {
            diffs.push(format!(
                "{}: status {} on the simulator ({}), {} on kube-apiserver ({})",
                c.name, s[i].0, s[i].1, r[i].0, r[i].1
            ));
            continue;
        }
        field_diffs(
            c.name,
            c.fields,
            (&s[i].1, &r[i].1),
            (sim, real),
            &mut diffs,
        );
    }
    diffs
}

#[test]
fn executorsets_and_patches_answer_as_kube_apiserver_does() {
    let Some((sim, real)) = idle_servers("differential-es") else {
        return;
    };
    let mut diffs = req_diffs(&sim, &real, &es_cases());
    diffs.extend(req_diffs(&sim, &real, &cm_patch_cases()));
    assert!(
        diffs.is_empty(),
        "{} differences:\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}
