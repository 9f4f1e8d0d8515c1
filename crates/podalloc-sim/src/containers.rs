//! What the kubelet reports about a pod's containers beyond "all running": init containers
//! (run one after another, each to completion, before the containers start), native sidecars
//! (init containers with `restartPolicy: Always`, Kubernetes 1.29+, KEP-753: started in order
//! with the init containers and kept running next to the containers), images the registry
//! does not have, volumes that never mount, and one container ending while the others run.
//!
//! As the real kubelet (`kubelet_pods.go`, `convertToAPIContainerStatuses` and `getPhase`):
//! - a container not created yet waits in `ContainerCreating`, or in `PodInitializing` when
//!   the pod has init containers (init containers included);
//! - an image the registry does not have: `ErrImagePull` (the message names the image), then
//!   `ImagePullBackOff` (`Back-off pulling image "IMAGE"`), `imageID` empty;
//! - a volume that cannot be set up (a Secret — the simulator serves none — or a ConfigMap
//!   that does not exist, unless `optional: true`) keeps every container waiting: the pod
//!   stays Pending in `ContainerCreating` / `PodInitializing` for ever;
//! - the phase is Pending while a container has not started, Running while one runs, and —
//!   under `restartPolicy: Never` — Succeeded or Failed once every container has terminated
//!   (Failed when one exited non-zero); native sidecars do not count, and the kubelet stops
//!   them (SIGTERM, exit 143) once the containers have ended.

use serde_json::{json, Map, Value};

/// One container of the spec, as the kubelet walks them.
struct Ctr {
    name: String,
    image: String,
    /// An init container with `restartPolicy: Always`.
    sidecar: bool,
}

fn ctrs(pod: &Value, key: &str) -> Vec<Ctr> {
    let list = pod
        .pointer(&format!("/spec/{key}"))
        .and_then(Value::as_array);
    list.into_iter()
        .flatten()
        .map(|c| Ctr {
            name: c["name"].as_str().unwrap_or_default().to_string(),
            image: c["image"].as_str().unwrap_or_default().to_string(),
            sidecar: key == "initContainers" && c["restartPolicy"] == "Always",
        })
        .collect()
}

/// True when the pod has init containers (native sidecars included).
pub(crate) fn has_init(pod: &Value) -> bool {
    !ctrs(pod, "initContainers").is_empty()
}

/// The volume that keeps the pod's containers from being created, as the kubelet's
/// `FailedMount` event would name it: a non-optional Secret volume (the simulator serves no
/// Secrets) or a non-optional ConfigMap volume whose ConfigMap `cm_exists` does not know.
pub(crate) fn unmountable_volume(pod: &Value, cm_exists: impl Fn(&str) -> bool) -> Option<String> {
    let vols = pod.pointer("/spec/volumes").and_then(Value::as_array)?;
    vols.iter().find_map(|v| {
        let name = v["name"].as_str().unwrap_or_default();
        if let Some(s) = v.get("secret").filter(|s| s["optional"] != true) {
            let secret = s["secretName"].as_str().unwrap_or_default();
            return Some(format!(
                "MountVolume.SetUp failed for volume \"{name}\" : secret \"{secret}\" not found"
            ));
        }
        let cm = v.get("configMap").filter(|c| c["optional"] != true)?;
        let cm_name = cm["name"].as_str().unwrap_or_default();
        (!cm_exists(cm_name)).then(|| {
            format!(
                "MountVolume.SetUp failed for volume \"{name}\" : configmap \"{cm_name}\" not found"
            )
        })
    })
}

fn waiting(c: &Ctr, reason: &str, message: Option<String>) -> Value {
    let mut w = json!({"reason": reason});
    if let Some(m) = message {
        w["message"] = json!(m);
    }
    json!({"name": c.name, "state": {"waiting": w}, "lastState": {}, "ready": false,
           "restartCount": 0, "image": c.image, "imageID": "", "started": false})
}

fn running(c: &Ctr, uid: &str, now: &str) -> Value {
    json!({"name": c.name, "state": {"running": {"startedAt": now}}, "lastState": {},
           "ready": true, "restartCount": 0, "image": c.image,
           "imageID": crate::pod::image_id(&c.image),
           "containerID": crate::pod::container_id(uid, &c.name), "started": true})
}

fn completed(c: &Ctr, uid: &str, now: &str) -> Value {
    let id = crate::pod::container_id(uid, &c.name);
    json!({"name": c.name, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
               "startedAt": now, "finishedAt": now, "containerID": id}},
           "lastState": {}, "ready": false, "restartCount": 0, "image": c.image,
           "imageID": crate::pod::image_id(&c.image), "containerID": id, "started": false})
}

/// `ErrImagePull` for `image`, with the message containerd's resolver gives.
fn pull_error(c: &Ctr) -> Value {
    let msg = format!(
        "failed to pull and unpack image \"{}\": failed to resolve reference \"{}\": not found",
        c.image, c.image
    );
    waiting(c, "ErrImagePull", Some(msg))
}

/// Bound to a node: with init containers, every status waits in `PodInitializing` and
/// `Initialized` is False (`ContainersNotInitialized`). Call after `mark_scheduled`.
pub(crate) fn mark_initializing(pod: &mut Value, now: &str) {
    let init = ctrs(pod, "initContainers");
    if init.is_empty() {
        return;
    }
    let mains: Vec<Value> = (ctrs(pod, "containers").iter())
        .map(|c| waiting(c, "PodInitializing", None))
        .collect();
    let inits: Vec<Value> = (init.iter())
        .map(|c| waiting(c, "PodInitializing", None))
        .collect();
    let names: Vec<&str> = init.iter().map(|c| c.name.as_str()).collect();
    set_condition(
        pod,
        now,
        "Initialized",
        "False",
        Some("ContainersNotInitialized"),
        Some(format!(
            "containers with incomplete status: [{}]",
            names.join(" ")
        )),
    );
    let status = obj(pod, "status");
    status.insert("initContainerStatuses".into(), Value::Array(inits));
    status.insert("containerStatuses".into(), Value::Array(mains));
}

/// What [`start`] left the pod in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Started {
    /// Every container runs: phase Running.
    Running,
    /// An image could not be pulled (`ErrImagePull`): phase Pending.
    PullFailed,
}

/// The kubelet starts the pod: init containers in order (each runs to `Completed`; a native
/// sidecar starts and keeps running), then every container. A container whose image is in
/// `missing` waits in `ErrImagePull`, and nothing after a blocked init container starts.
/// Used for pods with init containers or a missing image; other pods take the plain path.
pub(crate) fn start(pod: &mut Value, uid: &str, now: &str, missing: &[String]) -> Started {
    let is_missing = |c: &Ctr| missing.contains(&c.image);
    let mut inits = Vec::new();
    let mut blocked = None;
    for c in &ctrs(pod, "initContainers") {
        inits.push(match blocked {
            Some(_) => waiting(c, "PodInitializing", None),
            None if is_missing(c) => {
                blocked = Some(c.name.clone());
                pull_error(c)
            }
            None if c.sidecar => running(c, uid, now),
            None => completed(c, uid, now),
        });
    }
    let mains: Vec<Value> = (ctrs(pod, "containers").iter())
        .map(|c| match (&blocked, is_missing(c)) {
            (Some(_), _) => waiting(c, "PodInitializing", None),
            (None, true) => pull_error(c),
            (None, false) => running(c, uid, now),
        })
        .collect();
    let pulled = mains.iter().all(|s| s["started"] == true);
    match &blocked {
        Some(name) => set_condition(
            pod,
            now,
            "Initialized",
            "False",
            Some("ContainersNotInitialized"),
            Some(format!("containers with incomplete status: [{name}]")),
        ),
        None => set_condition(pod, now, "Initialized", "True", None, None),
    }
    let unready: Vec<&str> = (mains.iter())
        .filter(|s| s["ready"] != true)
        .filter_map(|s| s["name"].as_str())
        .collect();
    let ready = unready.is_empty();
    let msg = (!ready).then(|| format!("containers with unready status: [{}]", unready.join(" ")));
    let (st, why) = if ready {
        ("True", None)
    } else {
        ("False", Some("ContainersNotReady"))
    };
    set_condition(pod, now, "Ready", st, why, msg.clone());
    set_condition(pod, now, "ContainersReady", st, why, msg);
    set_condition(pod, now, "PodReadyToStartContainers", "True", None, None);
    let status = obj(pod, "status");
    if !inits.is_empty() {
        status.insert("initContainerStatuses".into(), Value::Array(inits));
    }
    status.insert("containerStatuses".into(), Value::Array(mains));
    let phase = if blocked.is_none() && pulled {
        "Running"
    } else {
        "Pending"
    };
    status.insert("phase".into(), json!(phase));
    match phase {
        "Running" => Started::Running,
        _ => Started::PullFailed,
    }
}

/// The kubelet's image pull back-off: every `ErrImagePull` becomes `ImagePullBackOff`.
/// Every container of the pod waits with `reason` (and `message`), as the kubelet reports a
/// start-up error it keeps retrying (`ErrImageNeverPull`, `CreateContainerError`, …).
pub(crate) fn mark_waiting(pod: &mut Value, reason: &str, message: Option<&str>) {
    let specs = pod["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let statuses: Vec<Value> = specs
        .iter()
        .map(|c| {
            let mut waiting = json!({"reason": reason});
            if let Some(m) = message {
                waiting["message"] = json!(m);
            }
            json!({"name": c["name"], "image": c["image"], "imageID": "", "ready": false,
                   "restartCount": 0, "started": false, "state": {"waiting": waiting}})
        })
        .collect();
    pod["status"]["containerStatuses"] = Value::Array(statuses);
}

pub(crate) fn back_off(pod: &mut Value) {
    for key in ["initContainerStatuses", "containerStatuses"] {
        let Some(list) = pod["status"][key].as_array_mut() else {
            continue;
        };
        for s in list {
            if s["state"]["waiting"]["reason"] == "ErrImagePull" {
                let image = s["image"].as_str().unwrap_or_default().to_string();
                s["state"]["waiting"] = json!({"reason": "ImagePullBackOff",
                    "message": format!("Back-off pulling image \"{image}\"")});
            }
        }
    }
}

/// One container of a running pod ended with `exit_code` (`reason`: `Completed` for 0,
/// else `Error`, unless given, e.g. `OOMKilled`). While another container runs the pod
/// stays Running (not Ready); once none does, the kubelet stops the native sidecars (143)
/// and the pod ends Succeeded, or Failed when a container exited non-zero. Returns whether
/// the pod is now terminal; `Err` when the pod has no such container or it is not running.
pub(crate) fn terminate(
    pod: &mut Value,
    container: &str,
    exit_code: i64,
    reason: Option<&str>,
    now: &str,
) -> Result<bool, String> {
    let reason = reason.unwrap_or(if exit_code == 0 { "Completed" } else { "Error" });
    let statuses = pod["status"]["containerStatuses"]
        .as_array_mut()
        .ok_or_else(|| "the pod has no container statuses yet".to_string())?;
    let s = (statuses.iter_mut())
        .find(|s| s["name"] == container)
        .ok_or_else(|| format!("the pod has no container {container:?}"))?;
    end(s, exit_code, reason, now)?;
    let all_ended = statuses
        .iter()
        .all(|s| s["state"].get("terminated").is_some());
    let failed = (statuses.iter()).any(|s| s["state"]["terminated"]["exitCode"] != 0);
    let unready: Vec<String> = (statuses.iter())
        .filter(|s| s["ready"] != true)
        .filter_map(|s| s["name"].as_str().map(str::to_string))
        .collect();
    if !all_ended {
        let msg = Some(format!(
            "containers with unready status: [{}]",
            unready.join(" ")
        ));
        set_condition(
            pod,
            now,
            "Ready",
            "False",
            Some("ContainersNotReady"),
            msg.clone(),
        );
        set_condition(
            pod,
            now,
            "ContainersReady",
            "False",
            Some("ContainersNotReady"),
            msg,
        );
        return Ok(false);
    }
    let sidecars: Vec<String> = (ctrs(pod, "initContainers").into_iter())
        .filter(|c| c.sidecar)
        .map(|c| c.name)
        .collect();
    if let Some(inits) = pod["status"]["initContainerStatuses"].as_array_mut() {
        for s in inits.iter_mut() {
            let name = s["name"].as_str().unwrap_or_default().to_string();
            if sidecars.contains(&name) && s["state"].get("running").is_some() {
                end(s, 143, "Error", now)?;
            }
        }
    }
    let (phase, why) = if failed {
        ("Failed", "PodFailed")
    } else {
        ("Succeeded", "PodCompleted")
    };
    set_condition(pod, now, "Ready", "False", Some(why), None);
    set_condition(pod, now, "ContainersReady", "False", Some(why), None);
    set_condition(pod, now, "PodReadyToStartContainers", "False", None, None);
    obj(pod, "status").insert("phase".into(), json!(phase));
    Ok(true)
}

/// A running container's status turned `terminated`.
fn end(s: &mut Value, exit_code: i64, reason: &str, now: &str) -> Result<(), String> {
    let Some(started) = s["state"]["running"]["startedAt"]
        .as_str()
        .map(str::to_string)
    else {
        let name = s["name"].as_str().unwrap_or_default();
        return Err(format!("container {name:?} is not running"));
    };
    let id = s["containerID"].clone();
    s["state"] = json!({"terminated": {"exitCode": exit_code, "reason": reason,
        "startedAt": started, "finishedAt": now, "containerID": id}});
    s["ready"] = json!(false);
    s["started"] = json!(false);
    Ok(())
}

fn obj<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !v[key].is_object() {
        v[key] = json!({});
    }
    v[key].as_object_mut().expect("just made an object")
}

/// Sets one condition as the kubelet writes it (see `pod::set_conditions`).
fn set_condition(
    pod: &mut Value,
    now: &str,
    ty: &str,
    st: &str,
    reason: Option<&str>,
    msg: Option<String>,
) {
    crate::pod::set_conditions(pod, &[(ty, st, reason, msg)], now);
}
