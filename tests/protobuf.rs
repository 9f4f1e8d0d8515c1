//! Pod lists in Protobuf (`Accept: application/vnd.kubernetes.protobuf`), on the simulator
//! and on kube-apiserver alike: the same pods read the same in both encodings, a tick gets
//! Protobuf, and a client told not to ask for it gets JSON. Each test runs on both servers
//! (`both!`); the real one says so in one line without a built control plane.

use crate::both::{both, Env, Pods};
use podalloc::kube::{
    ClientOptions, ClusterConfig, Credential, KubeClient, KubeError, PageSink, PemData,
};
use podalloc::snapshot::{For, Snapshot};
use serde_json::{json, Value};

/// The Protobuf media type.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Every page of `GET …/pods?limit=3` in `accept`'s encoding, added to one snapshot of app
/// `proto`; the pages' content types.
pub fn list_as(e: &Env, accept: &str) -> (Snapshot, Vec<String>) {
    let mut snap = Snapshot::default();
    let (mut cont, mut types) = (None::<String>, Vec::new());
    loop {
        let mut path = format!("/api/v1/namespaces/{}/pods?limit=3", e.ns);
        if let Some(c) = &cont {
            path.push_str(&format!("&continue={c}"));
        }
        let (code, ctype, body) = e.get_raw(true, &path, accept);
        assert_eq!(code, 200, "{}", String::from_utf8_lossy(&body));
        types.push(ctype);
        cont = snap
            .read_page(&body[..], For::app("proto"))
            .unwrap_or_else(|e| panic!("{accept}: {e}"));
        if cont.is_none() {
            return (snap, types);
        }
    }
}

/// Pods of app `proto` in every state the classification tells apart (running, OOMKilled,
/// a negative exit code, evicted, disrupted, unschedulable, gated, waiting on an image, a
/// native sidecar's init container, held by a finalizer, a bad id), each with the status to
/// give it, and another app's pod (no status).
fn proto_pods() -> Vec<(Value, Option<Value>)> {
    let running = json!({"running": {"startedAt": "2026-01-01T00:00:05Z"}});
    let term = |code: i64, reason: &str| json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": "2026-01-01T00:00:05Z", "finishedAt": "2026-01-01T00:01:00Z"}});
    let waiting = json!({"waiting": {"reason": "ImagePullBackOff", "message": "back-off"}});
    let scheduled = json!([{"type": "PodScheduled", "status": "True"}]);
    let cases: Vec<(&str, &str, Value, Value)> = vec![
        ("1", "Running", running.clone(), scheduled.clone()),
        ("2", "Failed", term(137, "OOMKilled"), json!([])),
        ("3", "Running", term(-1, "Error"), json!([])),
        (
            "4",
            "Failed",
            term(0, "Completed"),
            json!([{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]),
        ),
        (
            "5",
            "Pending",
            json!({}),
            json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]),
        ),
        ("6", "Pending", waiting, scheduled),
        ("7", "Running", running.clone(), json!([])),
        ("0", "Running", running.clone(), json!([])),
    ];
    let mut pods = Vec::new();
    for (id, phase, state, conditions) in cases {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("proto-exec-{id}"),
                "labels": {"spark-app-selector": "proto", "spark-role": "executor", "spark-exec-id": id},
                "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-3"}},
            "spec": {"containers": [{"name": "executor", "image": "img"}, {"name": "side", "image": "side"}],
                "initContainers": [{"name": "proxy", "image": "proxy", "restartPolicy": "Always"}]}});
        if id == "5" {
            pod["spec"]["schedulingGates"] = json!([{"name": "podalloc.test/gate"}]);
        }
        if id == "7" {
            // Held by a finalizer once deleted: terminating until the server goes.
            pod["metadata"]["finalizers"] = json!(["podalloc.test/hold"]);
        }
        // No `"reason": ""`: kube-apiserver's JSON leaves an empty reason out, where the
        // simulator stores a seeded status as given (and Protobuf reads "" as absent).
        let mut status = json!({"phase": phase, "conditions": conditions,
            "containerStatuses": [
                {"name": "executor", "image": "img", "imageID": "", "ready": false, "restartCount": 3, "state": state},
                {"name": "side", "image": "side", "imageID": "", "ready": true, "restartCount": 0, "state": running}],
            "initContainerStatuses": [{"name": "proxy", "image": "proxy", "imageID": "", "ready": true, "restartCount": 0, "state": running}]});
        if id == "2" {
            status["reason"] = json!("Evicted");
        }
        pods.push((pod, Some(status)));
    }
    let other = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "other", "labels": {"spark-app-selector": "another", "spark-role": "executor", "spark-exec-id": "1"}},
        "spec": {"containers": [{"name": "c", "image": "img"}]}});
    pods.push((other, None));
    pods
}

/// Creates [`proto_pods`] in `e`'s namespace with their statuses (the status subresource on
/// kube-apiserver; the simulator's side door seeds a pod with its status), then deletes
/// `proto-exec-7` with a 45 s grace period.
fn create_proto_pods(e: &Env) {
    let pods = format!("/api/v1/namespaces/{}/pods", e.ns);
    for (pod, status) in proto_pods() {
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        if e.control_plane().is_none() {
            let mut seeded = pod.clone();
            seeded["status"] = status.unwrap_or(json!({"phase": "Running"}));
            let (code, body) = e.admin("POST", &format!("/sim/pods/{}", e.ns), Some(&seeded));
            assert_eq!(code, 201, "{body}");
            continue;
        }
        let (code, created) = e.admin("POST", &pods, Some(&pod));
        assert_eq!(code, 201, "{created}");
        if let Some(status) = status {
            let mut st = created.clone();
            st["status"] = status;
            let (code, body) = e.admin("PUT", &format!("{pods}/{name}/status"), Some(&st));
            assert_eq!(code, 200, "{body}");
        }
    }
    let (code, body) = e.admin(
        "DELETE",
        &format!("{pods}/proto-exec-7?gracePeriodSeconds=45"),
        None,
    );
    assert_eq!(code, 200, "{body}");
    // On kube-apiserver the emulator ends the containers of the deleted pod at once (grace 0)
    // and the finalizer then holds it as it is; the simulator's kubelet takes an hour to stop
    // a container ([`idle`]), longer than the grace period, so both lists see the same pod.
    if e.control_plane().is_some() {
        e.wait_for("proto-exec-7's containers to end", |e| {
            e.pod("proto-exec-7").is_some_and(|p| {
                (p["status"]["containerStatuses"]
                    .as_array()
                    .into_iter()
                    .flatten())
                .all(|c| c["state"]["terminated"].is_object())
            })
        });
    }
}

/// Pods no kubelet schedules or stops for an hour: they stay as [`create_proto_pods`] made
/// them.
fn idle() -> Pods {
    Pods {
        schedule_ms: 3_600_000,
        stop_ms: 3_600_000,
        ..Pods::default()
    }
}

// The Protobuf decoder is held to the JSON decoder on what each server encodes: the pods of
// `proto_pods`, listed in pages of 3 both ways, give equal snapshots.
both!(
    protobuf_and_json_lists_of_the_same_pods_read_the_same,
    "proto",
    idle(),
    |e| {
        create_proto_pods(e);
        let (json_snap, json_types) = list_as(e, "application/json");
        let (pb_snap, pb_types) = list_as(e, PROTOBUF);
        assert!(
            json_types.iter().all(|t| t.starts_with("application/json")),
            "{json_types:?}"
        );
        assert!(pb_types.iter().all(|t| t == PROTOBUF), "{pb_types:?}");
        assert_eq!(pb_types.len(), 3, "9 pods in pages of 3");
        assert_eq!(pb_snap, json_snap);
        assert_eq!(pb_snap.executors.len(), 7, "{:?}", pb_snap.executors.keys());
        assert_eq!((pb_snap.foreign, pb_snap.warnings.len()), (1, 1));
        // The data flowed (equal snapshots could also be equally empty):
        let x = &pb_snap.executors;
        assert!(x[&7].deletion_ms.is_some());
        // kube-apiserver deletes a pod never bound to a node with grace 0 whatever was asked
        // (the pod strategy's CheckGracefulDelete); the finalizer holds it. The simulator's
        // seeded pods are bound, so the grace asked for holds.
        let grace = if e.control_plane().is_some() {
            0
        } else {
            45_000
        };
        assert_eq!(x[&7].deletion_grace_ms, Some(grace));
        assert_eq!(x[&2].disruption.as_deref(), Some("Evicted"));
        assert_eq!(x[&4].disruption.as_deref(), Some("PreemptionByScheduler"));
        assert!(x[&5].gated && x[&5].unschedulable);
        assert!(x[&6]
            .waiting
            .as_deref()
            .is_some_and(|w| w.contains("ImagePullBackOff (image img)")));
        assert_eq!(x[&3].reason.as_deref(), Some("exit code -1"));
        assert_eq!((x[&1].restarts, x[&1].deletion_cost), (3, -3));
    }
);

// A tick asks for its pod list in Protobuf (JSON the fallback) and gets it: the debug line of
// the list names the content type; the tick converges as in JSON.
both!(
    a_tick_lists_pods_in_protobuf,
    "protobuf-tick",
    Pods::default(),
    |e| {
        let err = e.ok(&["--log-level", "debug", "reconcile", "--target", "2"]);
        let list = err
            .lines()
            .find(|l| l.contains("/pods?") && l.contains("GET"))
            .unwrap_or_else(|| panic!("no list logged: {err}"));
        assert!(list.contains(&format!("bytes of {PROTOBUF}")), "{list}");
        e.converge(2, &[]);
    }
);

/// A sink that reads either encoding, recording which one each page came in.
struct Recorder {
    snap: Snapshot,
    protobuf_pages: Vec<bool>,
}

impl PageSink for Recorder {
    type Error = KubeError;
    fn restart(&mut self) {
        (self.snap, self.protobuf_pages) = (Snapshot::default(), Vec::new());
    }
    fn accepts_protobuf(&self) -> bool {
        true
    }
    fn page(&mut self, body: &[u8]) -> Result<Option<String>, KubeError> {
        self.protobuf_pages.push(body.starts_with(b"k8s\0"));
        (self.snap.read_page(body, For::app("proto"))).map_err(|e| KubeError::Decode {
            what: "pod list page".into(),
            message: e.to_string(),
        })
    }
}

/// The pods of app `proto` listed by podalloc's client in pages of 2, with `protobuf_lists`
/// as given: the snapshot and, per page, whether it came in Protobuf.
fn client_list(e: &Env, protobuf_lists: bool) -> (Snapshot, Vec<bool>) {
    let mut cfg = ClusterConfig::for_server(e.url(), &e.ns);
    cfg.credential = Credential::Token {
        token: podalloc::kube::Secret::new(e.admin_token().to_string()),
        source: "test".into(),
    };
    cfg.tls.ca = Some(PemData {
        source: "test CA".into(),
        pem: e.ca_pem().as_bytes().to_vec(),
    });
    let opts = ClientOptions {
        protobuf_lists,
        ..ClientOptions::default()
    };
    let client = KubeClient::with_options(cfg, opts).unwrap();
    let mut sink = Recorder {
        snap: Snapshot::default(),
        protobuf_pages: Vec::new(),
    };
    let lp = podalloc::kube::ListParams {
        label_selector: "spark-app-selector=proto",
        field_selector: None,
        limit: Some(2),
    };
    client
        .api(&podalloc::kube::PODS)
        .list(&lp, &mut sink)
        .unwrap();
    (sink.snap, sink.protobuf_pages)
}

// `ClientOptions::protobuf_lists = false` asks for JSON and gets it; `true` gets Protobuf,
// the same pods, the same pages.
both!(
    a_client_without_protobuf_lists_gets_json,
    "proto",
    idle(),
    |e| {
        create_proto_pods(e);
        let (json_snap, json_pages) = client_list(e, false);
        let (pb_snap, pb_pages) = client_list(e, true);
        assert_eq!(
            json_pages,
            vec![false; 4],
            "8 pods of app proto in pages of 2"
        );
        assert_eq!(pb_pages, vec![true; 4]);
        assert_eq!(json_snap, pb_snap);
        assert_eq!(pb_snap.executors.len(), 7);
    }
);
