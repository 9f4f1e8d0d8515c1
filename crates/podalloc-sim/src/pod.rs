//! What the apiserver and the kubelet do to a Pod object: decoding checks, defaulting,
//! validation, and the status written at each step of its life.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use super::status::ApiError;
use super::util::hex64;
use super::validation::{self, FieldError};

/// The label that keys `SimStats::max_live_pods_by_app`.
pub(crate) const APP_LABEL: &str = "spark-app-selector";

/// The label carrying a Spark executor's id (`SimStats::executor_ids_created`).
pub(crate) const EXEC_ID_LABEL: &str = "spark-exec-id";

/// Default `spec.terminationGracePeriodSeconds`.
pub(crate) const DEFAULT_GRACE_SECONDS: i64 = 30;

/// Pod phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Phase {
    pub(crate) fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "Pending" => Phase::Pending,
            "Running" => Phase::Running,
            "Succeeded" => Phase::Succeeded,
            "Failed" => Phase::Failed,
            "Unknown" => Phase::Unknown,
            _ => return None,
        })
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Unknown => "Unknown",
        }
    }

    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// The values a pod field selector can test, extracted once per write.
#[derive(Clone, Debug, Default)]
pub(crate) struct PodFields {
    pub node_name: String,
    pub restart_policy: String,
    pub scheduler_name: String,
    pub service_account_name: String,
    pub host_network: &'static str,
    pub phase: String,
    pub pod_ip: String,
    pub pod_ips: String,
    pub nominated_node_name: String,
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(n) => cur = n,
            None => return "",
        }
    }
    cur.as_str().unwrap_or("")
}

/// Labels and selectable fields of a (valid) pod value.
pub(crate) fn extract(v: &Value) -> (BTreeMap<String, String>, PodFields) {
    let labels = v
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let host_network = v
        .pointer("/spec/hostNetwork")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let fields = PodFields {
        node_name: str_at(v, &["spec", "nodeName"]).to_string(),
        restart_policy: str_at(v, &["spec", "restartPolicy"]).to_string(),
        scheduler_name: str_at(v, &["spec", "schedulerName"]).to_string(),
        service_account_name: str_at(v, &["spec", "serviceAccountName"]).to_string(),
        host_network: if host_network { "true" } else { "false" },
        phase: str_at(v, &["status", "phase"]).to_string(),
        pod_ip: str_at(v, &["status", "podIP"]).to_string(),
        pod_ips: v
            .pointer("/status/podIPs/0/ip")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        nominated_node_name: str_at(v, &["status", "nominatedNodeName"]).to_string(),
    };
    (labels, fields)
}

pub(crate) fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The 400 that Go's JSON decoder makes of `v`, the value of struct field `go_field` of a
/// `kind` object (`Pod`, `ConfigMap`, `Lease`: version `v1`), when it is no `go_type`:
/// `KIND in version "v1" cannot be handled as a KIND: json: cannot unmarshal <v's JSON kind>
/// into Go struct field GO_FIELD of type GO_TYPE`.
pub(crate) fn unmarshal_error(kind: &str, v: &Value, go_field: &str, go_type: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{kind} in version \"v1\" cannot be handled as a {kind}: json: cannot unmarshal {} into Go struct field {go_field} of type {go_type}",
        json_kind(v)
    ))
}

/// Checks that `parent[key]` (struct field `go_field` of a `kind` object) is absent, null or
/// a string, as Go's decoder does; else [`unmarshal_error`].
fn check_str_of(kind: &str, parent: &Value, key: &str, go_field: &str) -> Result<(), ApiError> {
    match parent.get(key) {
        None | Some(Value::Null) | Some(Value::String(_)) => Ok(()),
        Some(other) => Err(unmarshal_error(kind, other, go_field, "string")),
    }
}

/// Checks the string fields of `meta`, the `metadata` of a `kind` object (name,
/// generateName, namespace, resourceVersion, uid), as Go's decoder does.
pub(crate) fn check_meta_strings(kind: &str, meta: &Value) -> Result<(), ApiError> {
    for k in [
        "name",
        "generateName",
        "namespace",
        "resourceVersion",
        "uid",
    ] {
        check_str_of(kind, meta, k, &format!("ObjectMeta.metadata.{k}"))?;
    }
    Ok(())
}

fn decode_error(v: &Value, go_field: &str, go_type: &str) -> ApiError {
    unmarshal_error("Pod", v, go_field, go_type)
}

fn check_str(parent: &Value, key: &str, go_field: &str) -> Result<(), ApiError> {
    check_str_of("Pod", parent, key, go_field)
}

fn check_obj(parent: &Value, key: &str, go_field: &str, go_type: &str) -> Result<(), ApiError> {
    match parent.get(key) {
        None | Some(Value::Null) | Some(Value::Object(_)) => Ok(()),
        Some(other) => Err(decode_error(other, go_field, go_type)),
    }
}

fn check_string_map(parent: &Value, key: &str, go_field: &str) -> Result<(), ApiError> {
    check_obj(parent, key, go_field, "map[string]string")?;
    if let Some(Value::Object(m)) = parent.get(key) {
        for v in m.values() {
            if !v.is_string() && !v.is_null() {
                return Err(decode_error(v, go_field, "string"));
            }
        }
    }
    Ok(())
}

/// The type checks that Go's JSON decoder would make on the fields the simulator reads
/// (a mistyped field is a 400, as with the real server).
fn check_types(pod: &Value) -> Result<(), ApiError> {
    check_obj(pod, "metadata", "Pod.metadata", "v1.ObjectMeta")?;
    check_obj(pod, "spec", "Pod.spec", "v1.PodSpec")?;
    check_obj(pod, "status", "Pod.status", "v1.PodStatus")?;
    if let Some(meta) = pod.get("metadata") {
        check_meta_types(meta)?;
    }
    if let Some(spec) = pod.get("spec") {
        check_spec_types(spec)?;
    }
    if let Some(status) = pod.get("status") {
        check_str(status, "phase", "PodStatus.status.phase")?;
    }
    Ok(())
}

/// [`check_types`] of `metadata`: the string fields, labels, annotations, owner references.
fn check_meta_types(meta: &Value) -> Result<(), ApiError> {
    check_meta_strings("Pod", meta)?;
    check_string_map(meta, "labels", "ObjectMeta.metadata.labels")?;
    check_string_map(meta, "annotations", "ObjectMeta.metadata.annotations")?;
    match meta.get("ownerReferences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(refs)) => {
            for r in refs {
                if !r.is_object() {
                    return Err(decode_error(
                        r,
                        "ObjectMeta.metadata.ownerReferences",
                        "v1.OwnerReference",
                    ));
                }
                for k in ["apiVersion", "kind", "name", "uid"] {
                    check_str(
                        r,
                        k,
                        &format!("OwnerReference.metadata.ownerReferences.{k}"),
                    )?;
                }
            }
        }
        Some(other) => {
            return Err(decode_error(
                other,
                "ObjectMeta.metadata.ownerReferences",
                "[]v1.OwnerReference",
            ))
        }
    }
    Ok(())
}

/// [`check_types`] of `spec`: the string fields, the grace period, `hostNetwork`, and each
/// container's names, image and resources.
fn check_spec_types(spec: &Value) -> Result<(), ApiError> {
    for k in [
        "restartPolicy",
        "nodeName",
        "schedulerName",
        "serviceAccountName",
    ] {
        check_str(spec, k, &format!("PodSpec.spec.{k}"))?;
    }
    match spec.get("terminationGracePeriodSeconds") {
        None | Some(Value::Null) => {}
        Some(Value::Number(n)) if n.is_i64() => {}
        Some(other) => {
            return Err(decode_error(
                other,
                "PodSpec.spec.terminationGracePeriodSeconds",
                "int64",
            ))
        }
    }
    match spec.get("hostNetwork") {
        None | Some(Value::Null) | Some(Value::Bool(_)) => {}
        Some(other) => return Err(decode_error(other, "PodSpec.spec.hostNetwork", "bool")),
    }
    for list in ["containers", "initContainers"] {
        match spec.get(list) {
            None | Some(Value::Null) => {}
            Some(Value::Array(cs)) => {
                for c in cs {
                    if !c.is_object() {
                        return Err(decode_error(
                            c,
                            &format!("PodSpec.spec.{list}"),
                            "v1.Container",
                        ));
                    }
                    for k in ["name", "image", "imagePullPolicy"] {
                        check_str(c, k, &format!("Container.spec.{list}.{k}"))?;
                    }
                    check_obj(
                        c,
                        "resources",
                        &format!("Container.spec.{list}.resources"),
                        "v1.ResourceRequirements",
                    )?;
                    if let Some(r) = c.get("resources") {
                        for k in ["limits", "requests"] {
                            check_obj(
                                r,
                                k,
                                &format!("ResourceRequirements.spec.{list}.resources.{k}"),
                                "v1.ResourceList",
                            )?;
                            if let Some(Value::Object(m)) = r.get(k) {
                                m.values().try_for_each(check_quantity)?;
                            }
                        }
                    }
                }
            }
            Some(other) => {
                return Err(decode_error(
                    other,
                    &format!("PodSpec.spec.{list}"),
                    "[]v1.Container",
                ))
            }
        }
    }
    Ok(())
}

/// `resource.Quantity`'s `UnmarshalJSON` (`k8s.io/apimachinery/pkg/api/resource`): a JSON
/// string or number that `ParseQuantity` reads, else the 400 the decoder makes of its error:
/// `ErrFormatWrong` (`quantities must match the regular expression
/// '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'`) or `ErrSuffix` (`unable to parse
/// quantity's suffix`). So `cpu: "one"` is refused as kube-apiserver refuses it.
fn check_quantity(v: &Value) -> Result<(), ApiError> {
    let text = match v {
        Value::Null => return Ok(()),
        Value::String(s) => s.trim().to_string(),
        Value::Number(n) => n.to_string(),
        other => return Err(decode_error(other, "Quantity", "resource.Quantity")),
    };
    let refuse = |why: &str| {
        ApiError::bad_request(format!(
            "Pod in version \"v1\" cannot be handled as a Pod: {why}"
        ))
    };
    const FORMAT: &str = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(&text);
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let letters_end = suffix
        .find(|c: char| !"eEinumkKMGTP".contains(c))
        .unwrap_or(suffix.len());
    let exponent = &suffix[letters_end..];
    let exponent = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    let digits = number.chars().filter(char::is_ascii_digit).count();
    if digits == 0
        || number.matches('.').count() > 1
        || !exponent.chars().all(|c| c.is_ascii_digit())
    {
        return Err(refuse(FORMAT));
    }
    let known = [
        "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let is_exponent = (suffix.starts_with(['e', 'E']))
        && suffix[1..]
            .strip_prefix(['+', '-'])
            .unwrap_or(&suffix[1..])
            .chars()
            .all(|c| c.is_ascii_digit())
        && suffix.len() > 1;
    if !known.contains(&suffix) && !is_exponent {
        return Err(refuse("unable to parse quantity's suffix"));
    }
    Ok(())
}

/// The apiserver's decoding of a create/update body into kind `want` (core/v1): 400 for
/// non-JSON, a non-object, another kind or another apiVersion, with the real messages.
/// Returns the object without `kind` and `apiVersion` (stored objects carry them only on
/// the wire).
pub(crate) fn decode_object(
    body: &[u8],
    want: &str,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    object_of(parse_body(body)?, want, "v1")
}

/// A request body as JSON; 400 with the apiserver's message when it is not JSON.
pub(crate) fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

/// [`decode_object`] for a body already parsed as JSON, of kind `want` in `api_version`
/// (`v1`, `coordination.k8s.io/v1`).
pub(crate) fn object_of(
    v: Value,
    want: &str,
    api_version_want: &str,
) -> Result<serde_json::Map<String, Value>, ApiError> {
    let Value::Object(mut obj) = v else {
        return Err(ApiError::bad_request(format!(
            "couldn't get version/kind; json parse error: json: cannot unmarshal {} into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}",
            json_kind(&v)
        )));
    };
    let kind = obj.remove("kind");
    let api_version = obj.remove("apiVersion");
    let kind = kind.as_ref().and_then(Value::as_str).unwrap_or("");
    let api_version = api_version.as_ref().and_then(Value::as_str).unwrap_or("");
    if !kind.is_empty() && kind != want {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {want}): decoding kind {kind:?} ({api_version:?}) into {want}"
        )));
    }
    if !api_version.is_empty() && api_version != api_version_want {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({api_version_want})"
        )));
    }
    Ok(obj)
}

/// Decodes a request body into a pod value, as the apiserver's JSON decoder would:
/// 400 for non-JSON, a non-object, a foreign kind or a mistyped field. `kind` and
/// `apiVersion` are removed (stored objects carry them only on the wire).
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    decode_value(parse_body(body)?)
}

/// [`decode`] for a body already parsed as JSON (one item of a seeded `PodList`).
pub(crate) fn decode_value(v: Value) -> Result<Value, ApiError> {
    let obj = object_of(v, "Pod", "v1")?;
    let mut pod = Value::Object(obj);
    check_types(&pod)?;
    // Go decodes a JSON null map value as "".
    for map in ["labels", "annotations"] {
        if let Some(Value::Object(m)) = pod.pointer_mut(&format!("/metadata/{map}")) {
            for v in m.values_mut().filter(|v| v.is_null()) {
                *v = json!("");
            }
        }
    }
    Ok(pod)
}

fn obj_mut<'a>(v: &'a mut Value, key: &str) -> &'a mut Map<String, Value> {
    if !v.get(key).is_some_and(Value::is_object) {
        v[key] = Value::Object(Map::new());
    }
    match v.get_mut(key) {
        Some(Value::Object(m)) => m,
        // Unreachable: the entry was just made an object.
        _ => unreachable!("object entry"),
    }
}

fn default_image_pull_policy(image: &str) -> &'static str {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    if image.contains('@') {
        return "IfNotPresent";
    }
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

/// Applies the defaults that the apiserver's defaulting and admission plugins add
/// (restart policy, grace period, DNS policy, scheduler, service account, default
/// tolerations, container fields, requests copied from limits).
pub(crate) fn apply_defaults(pod: &mut Value) {
    let spec = obj_mut(pod, "spec");
    let defaults: [(&str, Value); 8] = [
        ("restartPolicy", json!("Always")),
        (
            "terminationGracePeriodSeconds",
            json!(DEFAULT_GRACE_SECONDS),
        ),
        ("dnsPolicy", json!("ClusterFirst")),
        ("securityContext", json!({})),
        ("schedulerName", json!("default-scheduler")),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
    ];
    for (k, v) in defaults {
        if spec.get(k).is_none_or(Value::is_null) {
            spec.insert(k.to_string(), v);
        }
    }
    if spec
        .get("serviceAccountName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        spec.insert("serviceAccountName".into(), json!("default"));
    }
    let sa = spec["serviceAccountName"].clone();
    spec.insert("serviceAccount".into(), sa);
    add_default_tolerations(spec);
    for list in ["initContainers", "containers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(list) {
            for c in cs.iter_mut() {
                default_container(c);
            }
        }
    }
}

/// The DefaultTolerationSeconds admission plugin: tolerate `not-ready` and `unreachable`
/// for 300 s unless the pod already tolerates them.
fn add_default_tolerations(spec: &mut Map<String, Value>) {
    let tolerations = spec
        .entry("tolerations")
        .or_insert_with(|| Value::Array(Vec::new()));
    if !tolerations.is_array() {
        *tolerations = Value::Array(Vec::new());
    }
    if let Value::Array(ts) = tolerations {
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            if !ts
                .iter()
                .any(|t| t.get("key").and_then(Value::as_str) == Some(key))
            {
                ts.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
}

/// A container's defaults: termination message path and policy, image pull policy, and
/// requests copied from limits. A non-object is left alone.
fn default_container(c: &mut Value) {
    let image = c
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let Value::Object(cm) = c else { return };
    cm.entry("terminationMessagePath")
        .or_insert_with(|| json!("/dev/termination-log"));
    cm.entry("terminationMessagePolicy")
        .or_insert_with(|| json!("File"));
    if cm
        .get("imagePullPolicy")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        cm.insert(
            "imagePullPolicy".into(),
            json!(default_image_pull_policy(&image)),
        );
    }
    let res = cm.entry("resources").or_insert_with(|| json!({}));
    if let Value::Object(rm) = res {
        let limits = rm.get("limits").and_then(Value::as_object).cloned();
        if let Some(limits) = limits.filter(|l| !l.is_empty()) {
            let req = rm.entry("requests").or_insert_with(|| json!({}));
            if let Value::Object(req) = req {
                for (k, v) in limits {
                    req.entry(k).or_insert(v);
                }
            }
        }
    }
}

/// `qos.GetPodQOS`: BestEffort (no cpu/memory requests or limits anywhere), Guaranteed
/// (every container limits cpu and memory with requests equal to limits), else Burstable.
pub(crate) fn qos_class(pod: &Value) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for list in ["initContainers", "containers"] {
        let Some(cs) = pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
        else {
            continue;
        };
        for c in cs {
            let get = |kind: &str, r: &str| -> Option<String> {
                let q = c.pointer(&format!("/resources/{kind}/{r}"))?;
                let s = match q {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (!s.is_empty() && s != "0").then_some(s)
            };
            for r in ["cpu", "memory"] {
                let (req, lim) = (get("requests", r), get("limits", r));
                any |= req.is_some() || lim.is_some();
                match (req, lim) {
                    (Some(a), Some(b)) if a == b => {}
                    _ => guaranteed = false,
                }
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// `ValidateObjectMeta` for a namespaced object whose name is a DNS subdomain: name or
/// generateName, labels, annotation keys, owner references.
pub(crate) fn validate_meta(meta: &Value, errs: &mut Vec<FieldError>) {
    let name = str_at(meta, &["name"]);
    let generate = str_at(meta, &["generateName"]);
    if !generate.is_empty() {
        for m in validation::object_name(generate, true) {
            errs.push(FieldError::invalid("metadata.generateName", generate, m));
        }
    }
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        for m in validation::object_name(name, false) {
            errs.push(FieldError::invalid("metadata.name", name, m));
        }
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            for m in validation::qualified_name(k) {
                errs.push(FieldError::invalid("metadata.labels", k, m));
            }
            let v = v.as_str().unwrap_or("");
            for m in validation::label_value(v) {
                errs.push(FieldError::invalid("metadata.labels", v, m));
            }
        }
    }
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        for k in annotations.keys() {
            for m in validation::qualified_name(k) {
                errs.push(FieldError::invalid("metadata.annotations", k, m));
            }
        }
    }
    if let Some(refs) = meta.get("ownerReferences").and_then(Value::as_array) {
        let mut controllers = 0;
        for r in refs {
            for (k, what) in [
                ("apiVersion", "version"),
                ("kind", "kind"),
                ("name", "name"),
                ("uid", "uid"),
            ] {
                if str_at(r, &[k]).is_empty() {
                    errs.push(FieldError::invalid(
                        format!("metadata.ownerReferences.{k}"),
                        "",
                        format!("{what} must not be empty"),
                    ));
                }
            }
            if r.get("controller").and_then(Value::as_bool) == Some(true) {
                controllers += 1;
            }
        }
        if controllers > 1 {
            errs.push(FieldError::invalid(
                "metadata.ownerReferences",
                "",
                "Only one reference can have Controller set to true",
            ));
        }
    }
}

/// `ValidatePodCreate`, reduced to the rules that matter here: object name, labels,
/// owner references, containers (name, uniqueness, image) and restart policy.
pub(crate) fn validate(pod: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = pod.get("metadata").cloned().unwrap_or(Value::Null);
    validate_meta(&meta, &mut errs);
    let spec = pod.get("spec").cloned().unwrap_or(Value::Null);
    let containers = spec.get("containers").and_then(Value::as_array);
    if containers.is_none_or(Vec::is_empty) {
        errs.push(FieldError::required("spec.containers", ""));
    }
    let mut seen = BTreeSet::new();
    for list in ["initContainers", "containers"] {
        let Some(cs) = spec.get(list).and_then(Value::as_array) else {
            continue;
        };
        for (i, c) in cs.iter().enumerate() {
            let path = format!("spec.{list}[{i}]");
            let cname = str_at(c, &["name"]);
            if cname.is_empty() {
                errs.push(FieldError::required(format!("{path}.name"), ""));
            } else {
                for m in validation::dns1123_label(cname) {
                    errs.push(FieldError::invalid(format!("{path}.name"), cname, m));
                }
                if !seen.insert(cname.to_string()) {
                    errs.push(FieldError::duplicate(format!("{path}.name"), cname));
                }
            }
            let image = str_at(c, &["image"]);
            if image.is_empty() {
                errs.push(FieldError::required(format!("{path}.image"), ""));
            } else if image.trim() != image {
                errs.push(FieldError::invalid(
                    format!("{path}.image"),
                    image,
                    "must not have leading or trailing whitespace",
                ));
            }
        }
    }
    let policy = str_at(&spec, &["restartPolicy"]);
    if !["Always", "OnFailure", "Never"].contains(&policy) {
        errs.push(FieldError::not_supported(
            "spec.restartPolicy",
            policy,
            &["Always", "OnFailure", "Never"],
        ));
    }
    errs
}

/// The containers of a pod: (name, image).
fn containers(pod: &Value) -> Vec<(String, String)> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    (
                        str_at(c, &["name"]).to_string(),
                        str_at(c, &["image"]).to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

const CONDITION_ORDER: [&str; 5] = [
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
];

/// The objects of `list` (an array, else none) by their string field `key` (conditions by
/// `type`, container statuses by `name`); objects without it are left out.
fn keyed_by(list: Option<&Value>, key: &str) -> BTreeMap<String, Value> {
    (list.and_then(Value::as_array).into_iter().flatten())
        .filter_map(|c| Some((c.get(key)?.as_str()?.to_string(), c.clone())))
        .collect()
}

/// One condition to set: (type, status, reason, message).
pub(crate) type Cond<'a> = (&'a str, &'a str, Option<&'a str>, Option<String>);

/// Sets conditions, keeping `lastTransitionTime` of those whose status did not change and
/// the canonical order the kubelet writes them in.
pub(crate) fn set_conditions(pod: &mut Value, conds: &[Cond<'_>], now: &str) {
    let status = obj_mut(pod, "status");
    let mut existing = keyed_by(status.get("conditions"), "type");
    for (ty, st, reason, message) in conds {
        let since = existing
            .get(*ty)
            .filter(|old| old.get("status").and_then(Value::as_str) == Some(st))
            .and_then(|old| old.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(now));
        let mut c =
            json!({"type": ty, "status": st, "lastProbeTime": null, "lastTransitionTime": since});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        if let Some(m) = message {
            c["message"] = json!(m);
        }
        existing.insert(ty.to_string(), c);
    }
    let mut ordered: Vec<Value> = Vec::new();
    for ty in CONDITION_ORDER {
        if let Some(c) = existing.remove(ty) {
            ordered.push(c);
        }
    }
    ordered.extend(existing.into_values());
    status.insert("conditions".into(), Value::Array(ordered));
}

pub(crate) fn container_id(uid: &str, name: &str) -> String {
    format!("containerd://{}", hex64(&[uid, name]))
}

pub(crate) fn image_id(image: &str) -> String {
    format!("sha256:{}", hex64(&[image]))
}

fn not_ready_message(pod: &Value) -> String {
    let names: Vec<String> = containers(pod).into_iter().map(|(n, _)| n).collect();
    format!("containers with unready status: [{}]", names.join(" "))
}

/// Status of a pod the apiserver just created: `Pending` and its QoS class, nothing else.
pub(crate) fn initial_status(pod: &mut Value) {
    let qos = qos_class(pod);
    pod["status"] = json!({"phase": "Pending", "qosClass": qos});
}

/// The scheduler found no node: `PodScheduled=False`, reason `Unschedulable`.
pub(crate) fn mark_unschedulable(pod: &mut Value, now: &str, message: &str) {
    set_conditions(
        pod,
        &[(
            "PodScheduled",
            "False",
            Some("Unschedulable"),
            Some(message.to_string()),
        )],
        now,
    );
}

/// The conditions of a scheduled pod whose containers are not all ready (the kubelet's
/// `ContainersNotReady`, naming them); `sandbox`: its sandbox is up
/// (`PodReadyToStartContainers`).
fn set_not_ready_conditions(pod: &mut Value, sandbox: bool, now: &str) {
    let msg = not_ready_message(pod);
    let sandbox = if sandbox { "True" } else { "False" };
    set_conditions(
        pod,
        &[
            ("PodReadyToStartContainers", sandbox, None, None),
            ("Initialized", "True", None, None),
            (
                "Ready",
                "False",
                Some("ContainersNotReady"),
                Some(msg.clone()),
            ),
            (
                "ContainersReady",
                "False",
                Some("ContainersNotReady"),
                Some(msg),
            ),
            ("PodScheduled", "True", None, None),
        ],
        now,
    );
}

/// Bound to `node` and acknowledged by its kubelet: containers are being created.
pub(crate) fn mark_scheduled(pod: &mut Value, node: &str, host_ip: &str, now: &str) {
    obj_mut(pod, "spec").insert("nodeName".into(), json!(node));
    set_not_ready_conditions(pod, false, now);
    let statuses: Vec<Value> = containers(pod)
        .into_iter()
        .map(|(name, image)| {
            json!({"name": name, "state": {"waiting": {"reason": "ContainerCreating"}},
                   "lastState": {}, "ready": false, "restartCount": 0, "image": image,
                   "imageID": "", "started": false})
        })
        .collect();
    let status = obj_mut(pod, "status");
    status.insert("phase".into(), json!("Pending"));
    status.insert("hostIP".into(), json!(host_ip));
    status.insert("hostIPs".into(), json!([{"ip": host_ip}]));
    status.entry("startTime").or_insert_with(|| json!(now));
    status.insert("containerStatuses".into(), Value::Array(statuses));
}

pub(crate) fn set_pod_ip(pod: &mut Value, pod_ip: &str) {
    let status = obj_mut(pod, "status");
    status.insert("podIP".into(), json!(pod_ip));
    status.insert("podIPs".into(), json!([{"ip": pod_ip}]));
}

/// All containers running and ready.
pub(crate) fn mark_running(pod: &mut Value, uid: &str, pod_ip: &str, now: &str) {
    set_pod_ip(pod, pod_ip);
    set_conditions(
        pod,
        &[
            ("PodReadyToStartContainers", "True", None, None),
            ("Initialized", "True", None, None),
            ("Ready", "True", None, None),
            ("ContainersReady", "True", None, None),
            ("PodScheduled", "True", None, None),
        ],
        now,
    );
    let statuses: Vec<Value> = containers(pod)
        .into_iter()
        .map(|(name, image)| {
            json!({"name": name, "state": {"running": {"startedAt": now}}, "lastState": {},
                   "ready": true, "restartCount": 0, "image": image, "imageID": image_id(&image),
                   "containerID": container_id(uid, &name), "started": true})
        })
        .collect();
    set_running(pod, statuses, now);
}

/// Phase `Running` since `now` (a start time already set stays) with the container
/// statuses `statuses`.
fn set_running(pod: &mut Value, statuses: Vec<Value>, now: &str) {
    let status = obj_mut(pod, "status");
    status.insert("phase".into(), json!("Running"));
    status.entry("startTime").or_insert_with(|| json!(now));
    status.insert("containerStatuses".into(), Value::Array(statuses));
}

/// The main container exited 1 right after starting and the restart policy restarts it:
/// phase stays `Running`, the container is in `CrashLoopBackOff`.
pub(crate) fn mark_crash_loop(pod: &mut Value, uid: &str, pod_ip: &str, now: &str) {
    set_pod_ip(pod, pod_ip);
    set_not_ready_conditions(pod, true, now);
    let (name, ns) = (
        str_at(pod, &["metadata", "name"]).to_string(),
        str_at(pod, &["metadata", "namespace"]).to_string(),
    );
    let statuses: Vec<Value> = containers(pod)
        .into_iter()
        .map(|(cname, image)| {
            json!({"name": cname,
                   "state": {"waiting": {"reason": "CrashLoopBackOff",
                       "message": format!("back-off 10s restarting failed container={cname} pod={name}_{ns}({uid})")}},
                   "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now,
                       "finishedAt": now, "containerID": container_id(uid, &cname)}},
                   "ready": false, "restartCount": 1, "image": image, "imageID": image_id(&image),
                   "containerID": container_id(uid, &cname), "started": false})
        })
        .collect();
    set_running(pod, statuses, now);
}

/// How the containers of a pod ended.
#[derive(Clone, Debug)]
pub(crate) struct Termination {
    /// Succeeded or Failed.
    pub phase: Phase,
    pub exit_code: i64,
    pub reason: String,
    pub message: Option<String>,
    /// Give containers that never started this exit code and reason too (instead of the
    /// kubelet's `ContainerStatusUnknown`).
    pub force_reason: bool,
}

impl Termination {
    /// The containers exited on their own with `exit_code`.
    pub(crate) fn exited(phase: Phase, exit_code: i64, reason: &str) -> Self {
        Termination {
            phase,
            exit_code,
            reason: reason.to_string(),
            message: None,
            force_reason: true,
        }
    }

    /// The kubelet stopped the containers of a deleted pod (143: SIGTERM, 137: SIGKILL
    /// after the grace period); the pod ends `Failed` (Kubernetes 1.27+).
    pub(crate) fn killed(exit_code: i64) -> Self {
        Termination {
            phase: Phase::Failed,
            exit_code,
            reason: "Error".to_string(),
            message: None,
            force_reason: false,
        }
    }
}

/// Every container terminated as `term` says; the pod is in `term.phase`.
pub(crate) fn mark_terminated(pod: &mut Value, uid: &str, term: &Termination, now: &str) {
    let Termination {
        phase,
        exit_code,
        ref reason,
        ref message,
        force_reason,
    } = *term;
    let message = message.as_deref();
    let reason = reason.as_str();
    let cond_reason = if phase == Phase::Succeeded {
        "PodCompleted"
    } else {
        "PodFailed"
    };
    let scheduled = !str_at(pod, &["spec", "nodeName"]).is_empty();
    let mut conds: Vec<Cond<'_>> = vec![
        ("PodReadyToStartContainers", "False", None, None),
        ("Initialized", "True", None, None),
        ("Ready", "False", Some(cond_reason), None),
        ("ContainersReady", "False", Some(cond_reason), None),
    ];
    if scheduled {
        conds.push(("PodScheduled", "True", None, None));
    }
    set_conditions(pod, &conds, now);
    let old = keyed_by(pod.pointer("/status/containerStatuses"), "name");
    let statuses: Vec<Value> = containers(pod)
        .into_iter()
        .map(|(cname, image)| {
            let prev = old.get(&cname);
            let started_at = prev
                .and_then(|c| c.pointer("/state/running/startedAt"))
                .cloned();
            let restarts = prev
                .and_then(|c| c.get("restartCount"))
                .cloned()
                .unwrap_or(json!(0));
            let mut term = if started_at.is_some() || force_reason {
                json!({"exitCode": exit_code, "reason": reason, "startedAt": started_at.unwrap_or(json!(now)),
                       "finishedAt": now, "containerID": container_id(uid, &cname)})
            } else {
                json!({"exitCode": 137, "reason": "ContainerStatusUnknown",
                       "message": "The container could not be located when the pod was terminated",
                       "startedAt": null, "finishedAt": null})
            };
            if let (Some(m), Value::Object(t)) = (message, &mut term) {
                t.insert("message".into(), json!(m));
            }
            json!({"name": cname, "state": {"terminated": term}, "lastState": {}, "ready": false,
                   "restartCount": restarts, "image": image, "imageID": image_id(&image),
                   "containerID": container_id(uid, &cname), "started": false})
        })
        .collect();
    let status = obj_mut(pod, "status");
    status.insert("phase".into(), json!(phase.as_str()));
    status.insert("containerStatuses".into(), Value::Array(statuses));
}

/// Kubernetes ended the pod (KEP-3329): the `DisruptionTarget=True` condition with `reason`
/// (`PreemptionByScheduler`, `DeletionByTaintManager`, `EvictionByEvictionAPI`,
/// `DeletionByPodGC`, `TerminationByKubelet`); the kubelet also sets `status.reason`
/// `Evicted` for its own evictions.
pub(crate) fn mark_disrupted(pod: &mut Value, reason: &str, now: &str) {
    let message = match reason {
        "PreemptionByScheduler" => "Preempted in order to admit critical pod",
        "DeletionByTaintManager" => "Taint manager: deleting due to NoExecute taint",
        "EvictionByEvictionAPI" => "Eviction API: evicting",
        "DeletionByPodGC" => "PodGC: node no longer exists",
        _ => "The node was low on resource: memory.",
    };
    set_conditions(
        pod,
        &[(
            "DisruptionTarget",
            "True",
            Some(reason),
            Some(message.to_string()),
        )],
        now,
    );
    if reason == "TerminationByKubelet" {
        obj_mut(pod, "status").insert("reason".into(), json!("Evicted"));
    }
}

/// The scheduler's answer to a pod with scheduling gates (KEP-3521, Kubernetes 1.27+): it
/// does not look at the pod, which waits with `PodScheduled=False`, reason
/// `SchedulingGated`, until every gate is removed.
pub(crate) fn mark_gated(pod: &mut Value, now: &str) {
    let msg = "Scheduling is blocked due to non-empty scheduling gates";
    set_conditions(
        pod,
        &[(
            "PodScheduled",
            "False",
            Some("SchedulingGated"),
            Some(msg.to_string()),
        )],
        now,
    );
}

/// Whether the pod has scheduling gates (`spec.schedulingGates` not empty).
pub(crate) fn is_gated(pod: &Value) -> bool {
    pod["spec"]["schedulingGates"]
        .as_array()
        .is_some_and(|g| !g.is_empty())
}

/// The node stopped reporting: phase `Unknown`, readiness unknown.
pub(crate) fn mark_unknown(pod: &mut Value, now: &str) {
    set_conditions(
        pod,
        &[
            ("Ready", "Unknown", Some("NodeLost"), None),
            ("ContainersReady", "Unknown", Some("NodeLost"), None),
        ],
        now,
    );
    obj_mut(pod, "status").insert("phase".into(), json!("Unknown"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(v: Value) -> Value {
        let mut p = decode(v.to_string().as_bytes()).unwrap();
        apply_defaults(&mut p);
        p
    }

    #[test]
    fn decode_rejects_what_go_would_not_decode() {
        assert_eq!(decode(b"nope").unwrap_err().code, 400);
        assert!(decode(b"[1]")
            .unwrap_err()
            .message
            .contains("cannot unmarshal array"));
        let e = decode(br#"{"metadata":{"labels":{"a":1}}}"#).unwrap_err();
        assert!(
            e.message
                .contains("ObjectMeta.metadata.labels of type string"),
            "{}",
            e.message
        );
        assert_eq!(decode(br#"{"kind":"Service"}"#).unwrap_err().code, 400);
        for (q, ok) in [
            ("1", true),
            ("500m", true),
            ("1.5Gi", true),
            ("2e3", true),
            ("-1", true),
            ("one", false),
            ("1.2.3", false),
            ("1Qi", false),
            ("", false),
        ] {
            let r = check_quantity(&json!(q));
            assert_eq!(r.is_ok(), ok, "{q}: {r:?}");
        }
        let e = check_quantity(&json!("one")).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e
            .message
            .contains("quantities must match the regular expression"));
        assert!(check_quantity(&json!(2)).is_ok());
        assert_eq!(
            decode(br#"{"spec":{"containers":{}}}"#).unwrap_err().code,
            400
        );
        let ok = decode(br#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a"}}"#).unwrap();
        assert!(ok.get("kind").is_none() && ok.get("apiVersion").is_none());
        let nulls = decode(br#"{"metadata":{"labels":{"a":null}}}"#).unwrap();
        assert_eq!(nulls["metadata"]["labels"]["a"], "");
    }

    #[test]
    fn defaults_and_qos() {
        let p = pod(
            json!({"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}),
        );
        assert_eq!(p["spec"]["restartPolicy"], "Always");
        assert_eq!(p["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(p["spec"]["containers"][0]["imagePullPolicy"], "Always");
        assert_eq!(p["spec"]["tolerations"].as_array().unwrap().len(), 2);
        assert_eq!(qos_class(&p), "BestEffort");
        let g = pod(
            json!({"spec":{"containers":[{"name":"c","image":"x:1","resources":{"limits":{"cpu":"1","memory":"1Gi"}}}]}}),
        );
        assert_eq!(
            g["spec"]["containers"][0]["resources"]["requests"]["cpu"],
            "1"
        );
        assert_eq!(
            g["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        assert_eq!(qos_class(&g), "Guaranteed");
        let b = pod(
            json!({"spec":{"containers":[{"name":"c","image":"x","resources":{"requests":{"cpu":"1"}}}]}}),
        );
        assert_eq!(qos_class(&b), "Burstable");
    }

    #[test]
    fn validation_reports_each_field() {
        let p = pod(
            json!({"metadata":{"name":"Bad_Name","labels":{"app":"no good"}},
                           "spec":{"restartPolicy":"Sometimes","containers":[{"name":"c"},{"name":"c","image":"x"}]}}),
        );
        let errs: Vec<String> = validate(&p).iter().map(|e| e.to_string()).collect();
        assert!(
            errs.iter()
                .any(|e| e.starts_with("metadata.name: Invalid value: \"Bad_Name\"")),
            "{errs:?}"
        );
        assert!(errs
            .iter()
            .any(|e| e.starts_with("metadata.labels: Invalid value: \"no good\"")));
        assert!(errs.contains(&"spec.containers[0].image: Required value".to_string()));
        assert!(errs.contains(&"spec.containers[1].name: Duplicate value: \"c\"".to_string()));
        assert!(errs
            .iter()
            .any(|e| e.starts_with("spec.restartPolicy: Unsupported value: \"Sometimes\"")));
        let none = pod(json!({"metadata":{}}));
        let errs: Vec<String> = validate(&none).iter().map(|e| e.to_string()).collect();
        assert_eq!(
            errs,
            vec![
                "metadata.name: Required value: name or generateName is required".to_string(),
                "spec.containers: Required value".to_string(),
            ]
        );
    }

    #[test]
    fn lifecycle_statuses() {
        let mut p = pod(
            json!({"metadata":{"name":"a","namespace":"ns"},"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"x"}]}}),
        );
        initial_status(&mut p);
        assert_eq!(
            p["status"],
            json!({"phase":"Pending","qosClass":"BestEffort"})
        );
        mark_scheduled(&mut p, "n1", "10.0.0.1", "T1");
        assert_eq!(p["spec"]["nodeName"], "n1");
        assert_eq!(
            p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        mark_running(&mut p, "u", "10.244.0.2", "T2");
        assert_eq!(p["status"]["phase"], "Running");
        let conds = keyed_by(p.pointer("/status/conditions"), "type");
        assert_eq!(conds["Ready"]["status"], "True");
        assert_eq!(conds["PodScheduled"]["lastTransitionTime"], "T1");
        mark_terminated(&mut p, "u", &Termination::killed(143), "T3");
        assert_eq!(p["status"]["phase"], "Failed");
        let term = &p["status"]["containerStatuses"][0]["state"]["terminated"];
        assert_eq!(term["exitCode"], 143);
        assert_eq!(term["startedAt"], "T2");
        let (_, fields) = extract(&p);
        assert_eq!(fields.phase, "Failed");
        assert_eq!(fields.node_name, "n1");
        assert_eq!(fields.pod_ip, "10.244.0.2");
    }
}
