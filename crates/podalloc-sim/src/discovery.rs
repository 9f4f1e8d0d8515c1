//! What kubectl needs besides the objects: API discovery, server-side printing (the `Table`
//! format) and namespaces.
//!
//! - Discovery, from the kind table (`resources.rs`): `GET /api` (`APIVersions`), `/apis`
//!   (`APIGroupList`: `coordination.k8s.io`, `podalloc.io`), `/apis/GROUP` (`APIGroup`),
//!   `/api/v1`, `/apis/coordination.k8s.io/v1` and `/apis/podalloc.io/v1alpha1`
//!   (`APIResourceList`: pods, configmaps, events, namespaces; leases; executorsets with
//!   `executorsets/status` and `executorsets/scale`, each with exactly the verbs the router
//!   serves). kubectl 1.26+ first asks for aggregated discovery
//!   (`Accept: application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,…,
//!   application/json`); a server answering with plain `application/json` gets the legacy
//!   documents read instead, which is what kube-apiserver did before 1.26.
//! - OpenAPI v3, only as far as kubectl's field-validation check reads it: `GET
//!   /openapi/v3` lists one document per served group version (`api/v1`,
//!   `apis/coordination.k8s.io/v1`), and each document has, for each of its kinds,
//!   a PATCH operation tagged `x-kubernetes-group-version-kind` with the `fieldValidation`
//!   query parameter. kubectl (`--validate=strict`, the default) looks for exactly that to
//!   decide the server validates fields itself; it then sends `fieldValidation=Strict`
//!   and does no client-side schema validation, which would need the full schemas (not
//!   served; `/openapi/v2` is a 404). The document declares no schemas and is no promise
//!   that PATCH is served.
//! - Tables: a list requested with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`
//!   is answered with a `meta.k8s.io/v1` `Table` whose columns and cells are those of
//!   kube-apiserver's printers (pods: NAME READY STATUS RESTARTS AGE, then IP and NODE at
//!   priority 1; events: LAST SEEN TYPE REASON OBJECT MESSAGE); each row's `object` is the
//!   item's `PartialObjectMetadata`.
//! - Namespaces: `GET /api/v1/namespaces[/NAME]`, `POST /api/v1/namespaces`. A create in a
//!   namespace that does not exist is refused by the NamespaceLifecycle admission plugin
//!   (404 `namespaces "x" not found`).

use std::time::SystemTime;

use serde_json::{json, Value};

use super::http::{Request, Response};
use super::resources::{group_versions, Resource, RESOURCES};

/// The discovery documents, from the kind table ([`super::resources`]): `/api`
/// (`APIVersions`), `/apis` (`APIGroupList`), `/api/v1` and `/apis/GROUP/VERSION`
/// (`APIResourceList`), `/apis/GROUP` (`APIGroup`), as kube-apiserver's discovery handlers
/// write them; `None` for other paths.
pub(crate) fn discovery(req: &Request, segs: &[&str]) -> Option<Response> {
    if req.method != "GET" {
        return None;
    }
    let body = match segs {
        ["api"] => {
            let host = req.header("host").unwrap_or("");
            let versions: Vec<&str> = (group_versions().into_iter())
                .filter(|(g, _)| g.is_empty())
                .map(|(_, v)| v)
                .collect();
            json!({"kind": "APIVersions", "versions": versions,
                   "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]})
        }
        ["apis"] => {
            let groups: Vec<Value> = (group_versions().into_iter())
                .filter(|(g, _)| !g.is_empty())
                .map(|(g, _)| api_group(g))
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        ["apis", g] if group_versions().iter().any(|(have, _)| have == g) => {
            let mut doc = json!({"kind": "APIGroup", "apiVersion": "v1"});
            doc.as_object_mut()?
                .extend(api_group(g).as_object()?.clone());
            doc
        }
        ["api", v] => resource_list("", v)?,
        ["apis", g, v] if !g.is_empty() => resource_list(g, v)?,
        _ => return None,
    };
    Some(Response::json(200, body.to_string().into_bytes()))
}

/// An `APIGroup` entry (name, versions, preferred version) without type meta.
fn api_group(group: &str) -> Value {
    let versions: Vec<Value> = (group_versions().into_iter())
        .filter(|(g, _)| *g == group)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": group, "preferredVersion": versions[0], "versions": versions})
}

/// The `APIResourceList` of a served group version (`None` when none is served there):
/// each resource with its scope, kind, the verbs it serves (sorted, as the apiserver sorts
/// them), short names and categories. The core group's list has no `apiVersion`, as
/// kube-apiserver writes it.
fn resource_list(group: &str, version: &str) -> Option<Value> {
    let rows: Vec<&Resource> = (RESOURCES.iter())
        .filter(|r| r.group == group && r.version == version)
        .collect();
    let first = rows.first()?;
    let sorted = |vs: &[super::resources::Verb]| {
        let mut verbs: Vec<&str> = vs.iter().map(|v| v.as_str()).collect();
        verbs.sort_unstable();
        verbs
    };
    let resources: Vec<Value> = rows
        .iter()
        .flat_map(|r| {
            let mut doc = json!({"name": r.plural, "singularName": r.singular,
                "namespaced": r.namespaced, "kind": r.kind, "verbs": sorted(r.verbs)});
            if !r.short_names.is_empty() {
                doc["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                doc["categories"] = json!(r.categories);
            }
            // Each subresource after its resource, as the CRD discovery controller lists
            // them (`executorsets/scale` names its group, version and kind: Scale).
            let subs = r.subresources.iter().map(|s| {
                let mut sub = json!({"name": format!("{}/{}", r.plural, s.name),
                    "singularName": "", "namespaced": r.namespaced, "kind": r.kind,
                    "verbs": sorted(s.verbs)});
                if let Some((g, v, k)) = s.gvk {
                    sub["group"] = json!(g);
                    sub["version"] = json!(v);
                    sub["kind"] = json!(k);
                }
                sub
            });
            std::iter::once(doc).chain(subs).collect::<Vec<_>>()
        })
        .collect();
    let mut doc = json!({"kind": "APIResourceList", "groupVersion": first.group_version(),
                         "resources": resources});
    if !group.is_empty() {
        doc["apiVersion"] = json!("v1");
    }
    Some(doc)
}

/// The hash in each document's URL (kube-apiserver puts the document's hash there so that
/// clients can cache it).
const OPENAPI_HASH: &str = "5F1B0A2C8D9E4F6A7B3C1D2E0F9A8B7C6D5E4F3A2B1C0D9E8F7A6B5C4D3E2F1A";

/// The URL path of a group version's API (`api/v1`, `apis/coordination.k8s.io/v1`), as the
/// OpenAPI v3 index names its documents.
fn api_path(group: &str, version: &str) -> String {
    match group {
        "" => format!("api/{version}"),
        g => format!("apis/{g}/{version}"),
    }
}

/// `GET /openapi/v3` (one document per served group version) and each document (see the
/// module docs); `None` for other paths.
pub(crate) fn openapi(req: &Request, segs: &[&str]) -> Option<Response> {
    if req.method != "GET" {
        return None;
    }
    let body = match segs {
        ["openapi", "v3"] => {
            let mut paths = serde_json::Map::new();
            for (g, v) in group_versions() {
                let url = format!("/openapi/v3/{}?hash={OPENAPI_HASH}", api_path(g, v));
                paths.insert(api_path(g, v), json!({ "serverRelativeURL": url }));
            }
            json!({ "paths": paths })
        }
        ["openapi", "v3", rest @ ..] => {
            let (g, v) =
                (group_versions().into_iter()).find(|(g, v)| api_path(g, v) == rest.join("/"))?;
            openapi_document(g, v)
        }
        _ => return None,
    };
    Some(Response::json(200, body.to_string().into_bytes()))
}

/// The OpenAPI v3 document of one group version: for each of its kinds, the PATCH
/// operation of an object's path with its group-version-kind and the `fieldValidation`
/// parameter (what kubectl's `--validate=strict` looks for).
fn openapi_document(group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for r in RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let base = format!("/{}", api_path(group, version));
        let path = match r.namespaced {
            true => format!("{base}/namespaces/{{namespace}}/{}/{{name}}", r.plural),
            false => format!("{base}/{}/{{name}}", r.plural),
        };
        paths.insert(path, json!({"patch": {
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": r.kind},
            "parameters": [{"name": "fieldValidation", "in": "query",
                "description": "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields.",
                "schema": {"type": "string", "uniqueItems": true}}],
            "responses": {}}}));
    }
    json!({"openapi": "3.0.0",
           "info": {"title": "Kubernetes", "version": "v1.34.0-podalloc-sim"},
           "paths": paths})
}

/// True when the client asks for a `Table` (kubectl's `get`): an `Accept` entry with
/// `as=Table` and `g=meta.k8s.io`, version v1 (the first acceptable entry wins, as the
/// apiserver's negotiation picks the first type it can serve).
pub(crate) fn wants_table(req: &Request) -> bool {
    let accept = req.header("accept").unwrap_or("");
    for entry in accept.split(',') {
        let params: Vec<&str> = entry.split(';').map(str::trim).collect();
        let has = |p: &str| params.iter().any(|x| x.eq_ignore_ascii_case(p));
        if has("as=Table") && has("g=meta.k8s.io") {
            if has("v=v1") {
                return true;
            }
            continue;
        }
        let media = params.first().copied().unwrap_or("");
        if media == "application/json" || media == "*/*" {
            return false;
        }
    }
    false
}

/// kubectl's `HumanDuration` (k8s.io/apimachinery `util/duration`): `45s`, `3m20s`, `15m`,
/// `2h5m`, `3d4h`, …
pub(crate) fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    // `3m20s`, or `3m` when the smaller unit is 0.
    let two = |big: i64, unit: &str, small: i64, small_unit: &str| match small {
        0 => format!("{big}{unit}"),
        n => format!("{big}{unit}{n}{small_unit}"),
    };
    let minutes = secs / 60;
    if minutes < 10 {
        return two(minutes, "m", secs % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        return two(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return two(hours / 24, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return two(hours / 24 / 365, "y", (hours / 24) % 365, "d");
    }
    format!("{}y", hours / 24 / 365)
}

/// The age of an RFC 3339 timestamp at `now`, as kubectl prints it (`<unknown>` when
/// absent).
fn age(ts: Option<&str>, now: SystemTime) -> String {
    let Some(t) = ts.and_then(|t| humantime::parse_rfc3339_weak(t).ok()) else {
        return "<unknown>".into();
    };
    let secs = match now.duration_since(t) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    human_duration(secs)
}

fn column(name: &str, format: &str, description: &str, priority: u8) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": description,
           "priority": priority})
}

/// A row's `object`: the item's metadata as `PartialObjectMetadata` (the default
/// `includeObject=Metadata`).
fn partial(item: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
           "metadata": item.get("metadata").cloned().unwrap_or(json!({}))})
}

fn table(rv: u64, cont: Option<&str>, columns: Vec<Value>, rows: Vec<Value>) -> Response {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    let body = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta,
                      "columnDefinitions": columns, "rows": rows});
    Response::json(200, body.to_string().into_bytes())
}

/// The STATUS column of a pod, as kube-apiserver's pod printer derives it: the phase, else
/// the pod's reason, a container's waiting or terminated reason (`CrashLoopBackOff`,
/// `OOMKilled`, `Completed`, `ExitCode:N`), `Terminating` when being deleted.
fn pod_status(pod: &Value) -> String {
    let status = &pod["status"];
    let mut reason = status["phase"].as_str().unwrap_or("").to_string();
    if let Some(r) = status["reason"].as_str().filter(|r| !r.is_empty()) {
        reason = r.to_string();
    }
    for c in status["containerStatuses"].as_array().into_iter().flatten() {
        let state = &c["state"];
        if let Some(w) = state["waiting"]["reason"]
            .as_str()
            .filter(|r| !r.is_empty())
        {
            reason = w.to_string();
        } else if state["terminated"].is_object() {
            let t = &state["terminated"];
            reason = match (t["reason"].as_str(), t["signal"].as_i64()) {
                (Some(r), _) if !r.is_empty() => r.to_string(),
                (_, Some(s)) if s != 0 => format!("Signal:{s}"),
                _ => format!("ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
            };
        }
    }
    if pod["metadata"]["deletionTimestamp"].is_string() {
        reason = if status["reason"] == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

/// The `Table` of a pod list (see the module docs).
pub(crate) fn pod_table(rv: u64, cont: Option<&str>, pods: &[Value], now: SystemTime) -> Response {
    let columns = vec![
        column("Name", "name", "Name must be unique within a namespace.", 0),
        column("Ready", "", "The aggregate readiness state of this pod for accepting traffic.", 0),
        column("Status", "", "The aggregate status of the containers in this pod.", 0),
        column("Restarts", "", "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.", 0),
        column("Age", "", "CreationTimestamp is a timestamp representing the server time when this object was created.", 0),
        column("IP", "", "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.", 1),
        column("Node", "", "NodeName is a request to schedule this pod onto a specific node.", 1),
        column("Nominated Node", "", "nominatedNodeName is set when this pod preempts other pods on the node.", 1),
        column("Readiness Gates", "", "If specified, all readiness gates will be evaluated for pod readiness.", 1),
    ];
    let rows = pods
        .iter()
        .map(|p| {
            let statuses = p["status"]["containerStatuses"].as_array();
            let ready = statuses
                .into_iter()
                .flatten()
                .filter(|c| c["ready"] == true)
                .count();
            let total = p["spec"]["containers"].as_array().map_or(0, Vec::len);
            let restarts: i64 = statuses
                .into_iter()
                .flatten()
                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                .sum();
            let text = |v: &Value| {
                v.as_str()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("<none>")
                    .to_string()
            };
            json!({"cells": [
                p["metadata"]["name"], format!("{ready}/{total}"), pod_status(p),
                restarts.to_string(),
                age(p["metadata"]["creationTimestamp"].as_str(), now),
                text(&p["status"]["podIP"]), text(&p["spec"]["nodeName"]),
                text(&p["status"]["nominatedNodeName"]), "<none>",
            ], "object": partial(p)})
        })
        .collect();
    table(rv, cont, columns, rows)
}

/// The `Table` of an event list (see the module docs).
pub(crate) fn event_table(rv: u64, events: &[Value], now: SystemTime) -> Response {
    let columns = vec![
        column("Last Seen", "", "The time of the most recent occurrence of this event.", 0),
        column("Type", "", "Type of this event (Normal, Warning), new types could be added in the future.", 0),
        column("Reason", "", "This should be a short, machine understandable string that gives the reason for the transition into the object's current status.", 0),
        column("Object", "", "The object that this event is about.", 0),
        column("Subobject", "", "The subobject of the involved object the event is about.", 1),
        column("Source", "", "The component reporting this event.", 1),
        column("Message", "", "A human-readable description of the status of this operation.", 0),
        column("First Seen", "", "The time at which the event was first recorded.", 1),
        column("Count", "", "The number of times this event has occurred.", 1),
        column("Name", "name", "Name must be unique within a namespace.", 1),
    ];
    let rows = events
        .iter()
        .map(|e| {
            let o = &e["involvedObject"];
            let object = format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("").to_ascii_lowercase(),
                o["name"].as_str().unwrap_or("")
            );
            let last = e["lastTimestamp"].as_str().or(e["eventTime"].as_str());
            json!({"cells": [
                age(last, now), e["type"], e["reason"], object,
                o["fieldPath"].as_str().unwrap_or(""),
                e["source"]["component"].as_str().unwrap_or(""),
                e["message"], age(e["firstTimestamp"].as_str(), now),
                e["count"].as_i64().unwrap_or(1), e["metadata"]["name"],
            ], "object": partial(e)})
        })
        .collect();
    table(rv, None, columns, rows)
}

/// The `Table` of ExecutorSets (a list's, or one object's): the Name column, then the CRD's
/// printer columns (`kinds/executorset.rs`), as apiextensions' table convertor makes them:
/// integers as numbers, a missing value as `null`, a date as its age.
pub(crate) fn executorset_table(rv: u64, items: &[Value], now: SystemTime) -> Response {
    use super::kinds::executorset::PRINTER_COLUMNS;
    let mut columns = vec![column("Name", "name", NAME_DOC, 0)];
    for (name, kind, _, description) in PRINTER_COLUMNS {
        let mut c = column(name, "", description, 0);
        c["type"] = json!(kind);
        columns.push(c);
    }
    let rows = items
        .iter()
        .map(|es| {
            let mut cells = vec![es["metadata"]["name"].clone()];
            for (_, kind, ptr, _) in PRINTER_COLUMNS {
                let v = es.pointer(ptr);
                cells.push(match (kind, v) {
                    ("date", Some(Value::String(t))) => json!(age(Some(t), now)),
                    ("integer", Some(n)) => n.as_i64().map_or(Value::Null, |n| json!(n)),
                    _ => Value::Null,
                });
            }
            json!({"cells": cells, "object": partial(es)})
        })
        .collect();
    table(rv, None, columns, rows)
}

/// The description of `metadata.name` (ObjectMeta's swagger doc), the Name column's.
const NAME_DOC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

/// A Namespace object (always `Active`).
pub(crate) fn namespace_json(name: &str) -> Value {
    json!({"kind": "Namespace", "apiVersion": "v1",
           "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
           "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
}

/// The `Table` of a namespace list: NAME STATUS AGE.
pub(crate) fn namespace_table(rv: u64, names: &[String]) -> Response {
    let columns = vec![
        column("Name", "name", "Name must be unique within a namespace.", 0),
        column("Status", "", "The status of the namespace", 0),
        column("Age", "", "CreationTimestamp is a timestamp representing the server time when this object was created.", 0),
    ];
    let rows = names
        .iter()
        .map(
            |n| json!({"cells": [n, "Active", "<unknown>"], "object": partial(&namespace_json(n))}),
        )
        .collect();
    table(rv, None, columns, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_print_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (200, "3m20s"),
            (600, "10m"),
            (3 * 3600 + 300, "3h5m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (20 * 86400, "20d"),
        ];
        for (s, want) in cases {
            assert_eq!(human_duration(s), want, "{s}");
        }
    }

    #[test]
    fn pod_status_follows_the_printer() {
        let p = json!({"status": {"phase": "Running", "containerStatuses": [
            {"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert_eq!(pod_status(&p), "CrashLoopBackOff");
        let p = json!({"status": {"phase": "Failed", "containerStatuses": [
            {"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}});
        assert_eq!(pod_status(&p), "OOMKilled");
        let p = json!({"status": {"phase": "Failed", "containerStatuses": [
            {"state": {"terminated": {"exitCode": 3}}}]}});
        assert_eq!(pod_status(&p), "ExitCode:3");
        let p = json!({"metadata": {"deletionTimestamp": "x"}, "status": {"phase": "Running"}});
        assert_eq!(pod_status(&p), "Terminating");
    }

    /// Discovery lists every served resource with exactly its served verbs, pods' patch
    /// included, and the coordination.k8s.io group beside the core one.
    #[test]
    fn discovery_lists_what_the_router_serves() {
        for (g, v) in group_versions() {
            let doc = resource_list(g, v).unwrap();
            for r in doc["resources"].as_array().unwrap() {
                let name = r["name"].as_str().unwrap();
                let (plural, sub) = name.split_once('/').unwrap_or((name, ""));
                let row = crate::resources::find(g, v, plural).unwrap();
                let verbs = match sub {
                    "" => row.verbs,
                    s => row.subresource(s).unwrap().verbs,
                };
                let mut want: Vec<&str> = verbs.iter().map(|v| v.as_str()).collect();
                want.sort_unstable();
                assert_eq!(r["verbs"], json!(want), "{name}");
            }
        }
        let core = resource_list("", "v1").unwrap();
        let pods = (core["resources"].as_array().unwrap().iter())
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert!(pods["verbs"].as_array().unwrap().contains(&json!("patch")));
        assert!(core.get("apiVersion").is_none());
        let leases = resource_list("coordination.k8s.io", "v1").unwrap();
        assert_eq!(leases["resources"][0]["name"], "leases");
        assert_eq!(leases["apiVersion"], "v1");
        let group = api_group("coordination.k8s.io");
        assert_eq!(
            group["preferredVersion"]["groupVersion"],
            "coordination.k8s.io/v1"
        );
        assert!(resource_list("", "v2").is_none());
        let es = resource_list("podalloc.io", "v1alpha1").unwrap();
        let names: Vec<&str> = (es["resources"].as_array().unwrap().iter())
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["executorsets", "executorsets/status", "executorsets/scale"]
        );
        assert_eq!(es["resources"][0]["shortNames"], json!(["es"]));
        assert_eq!(es["resources"][2]["kind"], "Scale");
        assert_eq!(es["resources"][2]["group"], "autoscaling");
    }
}
