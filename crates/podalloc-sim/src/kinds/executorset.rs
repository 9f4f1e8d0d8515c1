//! The ExecutorSet custom resource (`podalloc.io/v1alpha1`, `deploy/crd.yaml`; the contract
//! is `docs/executorset.md`), served as kube-apiserver serves a CRD once installed
//! (k8s.io/apiextensions-apiserver `pkg/registry/customresource`):
//!
//! - decoding prunes every field the schema does not declare (`template`,
//!   `status.allocator` and `status.holder` keep theirs:
//!   `x-kubernetes-preserve-unknown-fields`);
//! - validation is the structural schema's (types, `required`, `minimum`), the scale
//!   subresource's checks of `.spec.replicas` and `.status.replicas` (`ValidateScaleSpec`,
//!   `ValidateScaleStatus`), then the CRD's three CEL rules (`minReplicas <= maxReplicas`,
//!   the transition rules `self == oldSelf` of `spec.appId` and of `spec.resourceProfile`,
//!   absent read as 0), skipped when an error before them
//!   blocks them, with the apiserver's messages;
//! - `customResourceStrategy`: a create drops `status` and sets `metadata.generation` 1; an
//!   update keeps the stored `status` and bumps the generation when anything but metadata
//!   changed; an update needs a `resourceVersion` (`AllowUnconditionalUpdate` false);
//! - `statusStrategy`: a `/status` update keeps everything of the stored object but the
//!   body's `status` (spec, labels, annotations and the generation included);
//! - `/scale` (`pkg/registry/customresource/etcd.go`): an `autoscaling/v1` `Scale` read from
//!   `.spec.replicas`, `.status.replicas` and `.status.selector`, whose `spec.replicas` a
//!   write puts into `.spec.replicas`.

use serde_json::{json, Map, Value};

use super::{StatusStrategy, Strategy};
use crate::pod::validate_meta;
use crate::status::ApiError;
use crate::validation::{ErrorType, FieldError};

/// The `openAPIV3Schema` of `deploy/crd.yaml`, descriptions left out (a test holds the two
/// to each other).
pub(crate) fn schema() -> Value {
    let int32 = json!({"type": "integer", "format": "int32"});
    let replicas = json!({"type": "integer", "format": "int32", "minimum": 0});
    let condition = json!({"type": "object", "required": ["type", "status"], "properties": {
        "type": {"type": "string"}, "status": {"type": "string"},
        "reason": {"type": "string"}, "message": {"type": "string"},
        "lastTransitionTime": {"type": "string", "format": "date-time"},
        "observedGeneration": {"type": "integer", "format": "int64"}}});
    json!({"type": "object", "required": ["spec"], "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "required": ["appId"],
            "x-kubernetes-validations": [
                {"rule": MIN_MAX_RULE, "message": MIN_MAX_MESSAGE},
                {"rule": PROFILE_RULE, "message": PROFILE_MESSAGE}],
            "properties": {
                "appId": {"type": "string", "x-kubernetes-validations": [
                    {"rule": "self == oldSelf", "message": "appId is immutable"}]},
                "resourceProfile": replicas.clone(),
                "replicas": replicas, "minReplicas": replicas, "maxReplicas": replicas,
                "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "removals": {"type": "array", "items": {"type": "object",
                    "required": ["request", "executors"], "properties": {
                        "request": {"type": "string"},
                        "executors": {"type": "array",
                            "items": {"type": "integer", "format": "int64"}},
                        "evict": {"type": "boolean"}}}}}},
        "status": {"type": "object", "properties": {
            "observedGeneration": {"type": "integer", "format": "int64"},
            "target": int32, "replicas": int32, "readyReplicas": int32, "pending": int32,
            "unacknowledged": int32, "selector": {"type": "string"},
            "conditions": {"type": "array", "items": condition},
            "appliedRemovals": {"type": "array", "items": {"type": "string"}},
            "allocator": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "holder": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "ping": {"type": "object", "properties": {
                "nonce": {"type": "string"}, "by": {"type": "string"}}},
            "pong": {"type": "string"}}}}})
}

/// The CRD's `additionalPrinterColumns` as the table convertor serves them: name, type,
/// the JSON pointer of the value, description (the CRD's, else the convertor's default).
pub(crate) const PRINTER_COLUMNS: [(&str, &str, &str, &str); 4] = [
    (
        "TARGET",
        "integer",
        "/spec/replicas",
        "The target number of executors (spec.replicas).",
    ),
    (
        "RUNNING",
        "integer",
        "/status/replicas",
        "Running executors (status.replicas).",
    ),
    (
        "PENDING",
        "integer",
        "/status/pending",
        "Executors created and not running yet (status.pending).",
    ),
    (
        "AGE",
        "date",
        "/metadata/creationTimestamp",
        "Custom resource definition column (in JSONPath format): .metadata.creationTimestamp",
    ),
];

const MIN_MAX_RULE: &str =
    "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas";
const MIN_MAX_MESSAGE: &str = "minReplicas must be less than or equal to maxReplicas";
/// The transition rule keeping `spec.resourceProfile` (absent reads as 0) as created.
const PROFILE_RULE: &str = "(has(self.resourceProfile) ? self.resourceProfile : 0) == \
     (has(oldSelf.resourceProfile) ? oldSelf.resourceProfile : 0)";
const PROFILE_MESSAGE: &str = "resourceProfile is immutable";

/// Decodes a request body into an ExecutorSet, as the CRD's decoder does: 400 for non-JSON,
/// a non-object or a foreign kind; fields the schema does not declare are pruned. `kind` and
/// `apiVersion` are removed.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let v = crate::pod::parse_body(body)?;
    let obj = crate::pod::object_of(v, "ExecutorSet", "podalloc.io/v1alpha1")?;
    let mut es = Value::Object(obj);
    prune(&schema(), &mut es);
    Ok(es)
}

/// Drops, at every level, the fields of an object its schema does not declare (structural
/// pruning); `metadata` is ObjectMeta's own.
fn prune(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            if schema["x-kubernetes-preserve-unknown-fields"] == true {
                return;
            }
            let Some(props) = schema["properties"].as_object() else {
                return;
            };
            m.retain(|k, _| props.contains_key(k));
            for (k, child) in m.iter_mut() {
                if k != "metadata" {
                    prune(&props[k], child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| prune(&schema["items"], i)),
        _ => {}
    }
}

/// The fields of a body that pruning drops, as `fieldValidation` names them
/// (`spec.undeclared`, `spec.removals[0].x`), in the body's order.
pub(crate) fn unknown_fields(body: &Value) -> Vec<String> {
    fn walk(schema: &Value, v: &Value, at: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) if schema["x-kubernetes-preserve-unknown-fields"] != true => {
                let Some(props) = schema["properties"].as_object() else {
                    return;
                };
                for (k, child) in m {
                    match props.get(k) {
                        None => out.push(join(at, k)),
                        Some(_) if k == "metadata" && at.is_empty() => {}
                        Some(s) => walk(s, child, &join(at, k), out),
                    }
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(&schema["items"], item, &format!("{at}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&schema(), body, "", &mut out);
    out
}

/// The JSON type name the OpenAPI validator reports for `v`.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Where an error is: `field` is the path the error names (prefixed), `name` the path the
/// validator's message names (relative to the validated value, as for `/status`).
fn join(base: &str, key: &str) -> String {
    match base {
        "" => key.to_string(),
        b => format!("{b}.{key}"),
    }
}

/// The structural schema's checks of `v` (types, `required`, `minimum`), as
/// `ValidateCustomResource` reports them: `prefix` is the field path of the value
/// validated (`status` for a status update), `name` the path relative to it.
fn check(schema: &Value, v: &Value, prefix: &str, name: &str, errs: &mut Vec<FieldError>) {
    let field = match (prefix, name) {
        (p, "") => p.to_string(),
        (p, n) => join(p, n),
    };
    let want = schema["type"].as_str().unwrap_or("");
    let have = type_name(v);
    if !want.is_empty() && want != have {
        let shown = if name.is_empty() { "." } else { name };
        errs.push(FieldError {
            kind: ErrorType::TypeInvalid,
            field,
            value: crate::validation::go_quote(have),
            detail: format!("{shown} in body must be of type {want}: \"{have}\""),
        });
        return;
    }
    if let (Some(min), Some(n)) = (schema["minimum"].as_i64(), v.as_i64()) {
        if n < min {
            let detail = format!("{name} in body should be greater than or equal to {min}");
            errs.push(FieldError::invalid_json(field.clone(), v, detail));
        }
    }
    match v {
        Value::Object(m) => {
            for r in schema["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap_or("");
                if !m.contains_key(r) {
                    errs.push(FieldError::required(join(&field, r), ""));
                }
            }
            let Some(props) = schema["properties"].as_object() else {
                return;
            };
            for (k, child) in m {
                if let (Some(s), true) = (props.get(k), k != "metadata") {
                    check(s, child, prefix, &join(name, k), errs);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check(
                    &schema["items"],
                    item,
                    prefix,
                    &format!("{name}[{i}]"),
                    errs,
                );
            }
        }
        _ => {}
    }
}

/// `ValidateScaleSpec` / `ValidateScaleStatus`: a replicas field that is an integer must not
/// be negative (the path keeps its leading dot, as the CRD writes it).
fn scale_checks(obj: &Value, spec: bool, errs: &mut Vec<FieldError>) {
    let paths: &[(&str, &str)] = match spec {
        true => &[("/spec/replicas", ".spec.replicas")],
        false => &[],
    };
    let status = [("/status/replicas", ".status.replicas")];
    for (ptr, path) in paths.iter().chain(status.iter()) {
        if let Some(n) = obj.pointer(ptr).and_then(Value::as_i64) {
            if n < 0 {
                errs.push(FieldError::invalid_json(
                    *path,
                    &json!(n),
                    "should be a non-negative integer",
                ));
            } else if n > i64::from(i32::MAX) {
                let detail = format!("should be less than or equal to {}", i32::MAX);
                errs.push(FieldError::invalid_json(*path, &json!(n), detail));
            }
        }
    }
}

/// `hasBlockingErr`: an error of these types stops the CEL rules, which are replaced by one
/// error saying so.
fn blocked(errs: &mut Vec<FieldError>) -> bool {
    let blocking = errs.iter().any(|e| {
        matches!(
            e.kind,
            ErrorType::NotSupported
                | ErrorType::Required
                | ErrorType::TooLong
                | ErrorType::TypeInvalid
        )
    });
    if blocking {
        errs.push(FieldError {
            kind: ErrorType::Invalid,
            field: "<nil>".into(),
            value: "null".into(),
            detail: "some validation rules were not checked because the object was invalid; \
                     correct the existing errors to complete validation"
                .into(),
        });
    }
    blocking
}

/// The CRD's CEL rules on `new` (and, on an update, the transition rule against `old`).
fn cel(new: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = &new["spec"];
    if let (Some(min), Some(max)) = (spec["minReplicas"].as_i64(), spec["maxReplicas"].as_i64()) {
        if min > max {
            errs.push(FieldError::invalid_json("spec", spec, MIN_MAX_MESSAGE));
        }
    }
    if let Some(old) = old {
        let profile = |s: &Value| s["resourceProfile"].as_i64().unwrap_or(0);
        if profile(spec) != profile(&old["spec"]) {
            errs.push(FieldError::invalid_json("spec", spec, PROFILE_MESSAGE));
        }
    }
    let was = old.and_then(|o| o["spec"]["appId"].as_str());
    if let (Some(was), Some(now)) = (was, spec["appId"].as_str()) {
        if was != now {
            errs.push(FieldError::invalid("spec.appId", now, "appId is immutable"));
        }
    }
}

/// Everything a create or an update of the object itself checks.
fn validate(obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(obj.get("metadata").unwrap_or(&Value::Null), &mut errs);
    let mut body = obj.clone();
    if let Some(m) = body.as_object_mut() {
        m.remove("metadata");
    }
    check(&schema(), &body, "", "", &mut errs);
    scale_checks(obj, true, &mut errs);
    if !blocked(&mut errs) {
        cel(obj, old, &mut errs);
    }
    errs
}

/// The ExecutorSet strategy (see the module docs).
pub(crate) struct ExecutorSets;

impl Strategy for ExecutorSets {
    fn validate(&self, obj: &Value, _ns: &str) -> Vec<FieldError> {
        validate(obj, None)
    }

    fn validate_update(&self, new: &Value, old: &Value, _ns: &str) -> Vec<FieldError> {
        validate(new, Some(old))
    }

    fn allow_unconditional_update(&self) -> bool {
        false
    }

    fn prepare_create(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
        obj["metadata"]["generation"] = json!(1);
    }

    fn prepare_update(&self, new: &mut Value, old: &Value) {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                new.as_object_mut().map(|m| m.remove("status"));
            }
        }
        let non_meta = |v: &Value| -> Map<String, Value> {
            let mut m = v.as_object().cloned().unwrap_or_default();
            m.remove("metadata");
            m
        };
        let generation = old["metadata"]["generation"].as_i64().unwrap_or(0);
        let bump = i64::from(non_meta(new) != non_meta(old));
        new["metadata"]["generation"] = json!(generation + bump);
    }

    fn status(&self) -> Option<&dyn StatusStrategy> {
        Some(self)
    }
}

impl StatusStrategy for ExecutorSets {
    fn prepare_update(&self, new: &mut Value, old: &Value) {
        let status = new.get("status").cloned();
        *new = old.clone();
        match status {
            Some(s) => new["status"] = s,
            None => {
                new.as_object_mut().map(|m| m.remove("status"));
            }
        }
    }

    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError> {
        let mut errs = Vec::new();
        if let Some(status) = new.get("status") {
            check(
                &schema()["properties"]["status"],
                status,
                "status",
                "",
                &mut errs,
            );
        }
        scale_checks(new, false, &mut errs);
        if !blocked(&mut errs) {
            cel(new, Some(old), &mut errs);
        }
        errs
    }
}

/// What `scaleUpdatedObjectInfo` puts in a Scale's `spec.replicas` when the object has none,
/// so that a patch which sets none is told apart (the smallest int32).
pub(crate) const NO_REPLICAS: i64 = i32::MIN as i64;

/// The `autoscaling/v1` `Scale` of an ExecutorSet (see the module docs); `spec.replicas` is
/// left out when 0 (Go's `omitempty`), `status.selector` when empty. `unset`: what
/// `spec.replicas` holds when the object has no `.spec.replicas` (0 for a read,
/// [`NO_REPLICAS`] for the Scale a patch applies to).
pub(crate) fn scale_of(ns: &str, obj: &Value, unset: i64) -> Value {
    let meta = &obj["metadata"];
    let spec = obj["spec"]["replicas"].as_i64().unwrap_or(unset);
    let mut scale = json!({"kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {"name": meta["name"], "namespace": ns, "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"],
            "creationTimestamp": meta["creationTimestamp"]},
        "spec": {}, "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0)}});
    if spec != 0 {
        scale["spec"]["replicas"] = json!(spec);
    }
    if let Some(sel) = obj["status"]["selector"].as_str().filter(|s| !s.is_empty()) {
        scale["status"]["selector"] = json!(sel);
    }
    scale
}

/// `ScaleREST.Get`'s 500 when the object has no `.spec.replicas`.
pub(crate) fn no_spec_replicas() -> ApiError {
    ApiError::internal_error("the spec replicas field \".spec.replicas\" does not exist")
}

/// The object `old` with the `spec.replicas` of `scale` (a decoded `autoscaling/v1` Scale)
/// and, when the Scale names one, its resourceVersion as the write's precondition
/// (`scaleUpdatedObjectInfo.UpdatedObject`; no `spec.replicas` is 0). Errors: 400 for a
/// mistyped `spec.replicas`, or [`NO_REPLICAS`] left by a patch.
pub(crate) fn with_scale(old: &Value, scale: &Value) -> Result<Value, ApiError> {
    let replicas = match scale.get("spec").and_then(|s| s.get("replicas")) {
        None | Some(Value::Null) => 0,
        Some(v) => v.as_i64().filter(|n| i32::try_from(*n).is_ok()).ok_or_else(|| {
            ApiError::bad_request(format!(
                "Scale in version \"v1\" cannot be handled as a Scale: json: cannot unmarshal {} into Go struct field ScaleSpec.spec.replicas of type int32",
                type_name(v)
            ))
        })?,
    };
    if replicas == NO_REPLICAS {
        return Err(ApiError::bad_request(
            "the spec replicas field \".spec.replicas\" cannot be empty",
        ));
    }
    let mut new = old.clone();
    new["spec"]["replicas"] = json!(replicas);
    if let Some(rv) = scale
        .get("metadata")
        .and_then(|m| m.get("resourceVersion"))
        .and_then(Value::as_str)
        .filter(|rv| !rv.is_empty())
    {
        new["metadata"]["resourceVersion"] = json!(rv);
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn es(spec: Value) -> Value {
        json!({"metadata": {"name": "etl", "namespace": "ns"}, "spec": spec})
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn the_schema_rules_give_the_apiservers_messages() {
        assert!(validate(&es(json!({"appId": "a", "replicas": 2})), None).is_empty());
        assert_eq!(
            messages(&validate(&es(json!({"replicas": 2})), None)),
            [
                "spec.appId: Required value",
                "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"
            ]
        );
        assert_eq!(
            messages(&validate(&es(json!({"appId": "a", "replicas": -1})), None)),
            [
                "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
                ".spec.replicas: Invalid value: -1: should be a non-negative integer"
            ]
        );
        let bounds = json!({"appId": "a", "minReplicas": 5, "maxReplicas": 2});
        assert_eq!(
            messages(&validate(&es(bounds), None)),
            ["spec: Invalid value: minReplicas must be less than or equal to maxReplicas"]
        );
        let old = es(json!({"appId": "a"}));
        assert_eq!(
            messages(&validate(&es(json!({"appId": "b"})), Some(&old))),
            ["spec.appId: Invalid value: \"b\": appId is immutable"]
        );
        let one = es(json!({"appId": "a", "resourceProfile": 1}));
        assert_eq!(
            messages(&validate(&one, Some(&old))),
            ["spec: Invalid value: resourceProfile is immutable"]
        );
        let zero = es(json!({"appId": "a", "resourceProfile": 0}));
        assert!(validate(&zero, Some(&old)).is_empty(), "absent reads as 0");
        assert!(validate(&one, Some(&one)).is_empty());
        let typed = validate(&es(json!({"appId": "a", "replicas": "3"})), None);
        assert_eq!(typed[0].to_string(), "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"");
        assert_eq!(typed[0].cause_type(), "FieldValueTypeInvalid");
    }

    #[test]
    fn unknown_fields_are_named_by_their_paths() {
        let body = json!({"apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
            "metadata": {"name": "etl", "whatever": 1}, "extra": 1,
            "spec": {"appId": "a", "nope": true, "template": {"x": 1},
                "removals": [{"request": "r", "executors": [1], "x": 2}]}});
        assert_eq!(
            unknown_fields(&body),
            ["extra", "spec.nope", "spec.removals[0].x"]
        );
    }

    #[test]
    fn decoding_prunes_undeclared_fields_but_the_templates() {
        let body = json!({"apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
            "metadata": {"name": "etl"}, "extra": 1,
            "spec": {"appId": "a", "nope": true, "template": {"spec": {"anything": 1}},
                "removals": [{"request": "r", "executors": [1], "x": 2}]},
            "status": {"replicas": 1, "zzz": 1, "allocator": {"kept": {"deep": 1}}}});
        let got = decode(body.to_string().as_bytes()).unwrap();
        assert_eq!(
            got,
            json!({"metadata": {"name": "etl"},
                "spec": {"appId": "a", "template": {"spec": {"anything": 1}},
                    "removals": [{"request": "r", "executors": [1]}]},
                "status": {"replicas": 1, "allocator": {"kept": {"deep": 1}}}})
        );
    }

    #[test]
    fn updates_keep_status_and_bump_the_generation_on_spec_changes_only() {
        let s = ExecutorSets;
        let mut new = es(json!({"appId": "a"}));
        Strategy::prepare_create(&s, &mut new);
        assert_eq!(new["metadata"]["generation"], 1);
        let mut old = new.clone();
        old["status"] = json!({"replicas": 3});
        let mut same = old.clone();
        same["status"] = json!({"replicas": 9});
        same["metadata"]["labels"] = json!({"x": "y"});
        Strategy::prepare_update(&s, &mut same, &old);
        assert_eq!(same["status"], json!({"replicas": 3}));
        assert_eq!(same["metadata"]["generation"], 1);
        let mut scaled = old.clone();
        scaled["spec"]["replicas"] = json!(4);
        Strategy::prepare_update(&s, &mut scaled, &old);
        assert_eq!(scaled["metadata"]["generation"], 2);
        let mut st = scaled.clone();
        st["spec"]["replicas"] = json!(7);
        st["metadata"]["annotations"] = json!({"a": "b"});
        st["status"] = json!({"replicas": 4});
        StatusStrategy::prepare_update(&s, &mut st, &scaled);
        assert_eq!(st["spec"]["replicas"], 4);
        assert!(st["metadata"].get("annotations").is_none());
        assert_eq!(st["status"], json!({"replicas": 4}));
    }

    #[test]
    fn the_scale_reads_and_writes_spec_replicas() {
        let mut obj = es(json!({"appId": "a", "replicas": 3}));
        obj["metadata"]["resourceVersion"] = json!("7");
        obj["status"] = json!({"replicas": 2, "selector": "a=b"});
        let scale = scale_of("ns", &obj, 0);
        assert_eq!(scale["spec"], json!({"replicas": 3}));
        assert_eq!(scale["status"], json!({"replicas": 2, "selector": "a=b"}));
        let new = with_scale(&obj, &json!({"spec": {"replicas": 5}})).unwrap();
        assert_eq!(new["spec"]["replicas"], 5);
        assert_eq!(new["metadata"]["resourceVersion"], "7");
        let pinned = json!({"metadata": {"resourceVersion": "6"}, "spec": {"replicas": 1}});
        assert_eq!(
            with_scale(&obj, &pinned).unwrap()["metadata"]["resourceVersion"],
            "6"
        );
        let unset = scale_of("ns", &es(json!({"appId": "a"})), NO_REPLICAS);
        assert_eq!(with_scale(&obj, &unset).unwrap_err().code, 400);
        assert_eq!(
            with_scale(&obj, &json!({"spec": {}})).unwrap()["spec"]["replicas"],
            0
        );
    }
}
