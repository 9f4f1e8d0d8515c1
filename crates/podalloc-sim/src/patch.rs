//! `PATCH /api/v1/namespaces/{ns}/pods/{name}` with a JSON merge patch (RFC 7386), what
//! `kubectl annotate` and `kubectl label` send (`Content-Type:
//! application/merge-patch+json`). A strategic merge patch is read the same way: for the
//! maps a pod's metadata holds (labels, annotations) both merge key by key, and `null`
//! removes a key.
//!
//! As the apiserver's pod strategy: `status` in a patch of the pod itself is ignored (the
//! old status is kept); a changed `spec` is 422 Invalid (`spec: Forbidden: pod updates may
//! not change fields other than …`); a changed name, namespace or uid is 422 too
//! (`field is immutable`); a `metadata.resourceVersion` in the patch that is not the
//! current one is 409 Conflict. A successful patch answers 200 with the pod, its
//! resourceVersion bumped. Other patch types (JSON patch, server-side apply) are not
//! modelled: 415, with the apiserver's message.

use crate::status::ApiError;
use crate::validation::FieldError;
use serde_json::Value;

use crate::objpatch::merge;

/// The patch media types the simulator applies.
pub(crate) const PATCH_TYPES: [&str; 2] = [
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// Checks the request's Content-Type. Errors: 415 UnsupportedMediaType with the
/// apiserver's message listing the patch types.
pub(crate) fn check_patch_type(content_type: &str) -> Result<(), ApiError> {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if PATCH_TYPES.contains(&media.as_str()) {
        return Ok(());
    }
    Err(ApiError::unsupported_patch_type(content_type))
}

/// The pod `old` with `patch` applied, or the apiserver's error.
pub(crate) fn apply(old: &Value, patch: &Value, name: &str) -> Result<Value, ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "json: cannot unmarshal array into Go value of type map[string]interface {}",
        ));
    }
    if let Some(rv) = patch
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        if Some(rv)
            != old
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
        {
            return Err(ApiError::conflict(
                "pods",
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
    }
    let mut new = old.clone();
    merge(&mut new, patch);
    new["status"] = old["status"].clone();
    let mut errs = Vec::new();
    for f in ["name", "namespace", "uid", "creationTimestamp"] {
        if new["metadata"][f] != old["metadata"][f] {
            errs.push(FieldError::invalid(
                format!("metadata.{f}"),
                new["metadata"][f].as_str().unwrap_or(""),
                "field is immutable",
            ));
        }
    }
    for m in ["labels", "annotations"] {
        let bad = new["metadata"][m]
            .as_object()
            .is_some_and(|o| o.values().any(|v| !v.is_string()));
        if bad {
            return Err(ApiError::bad_request(format!(
                "json: cannot unmarshal number into Go struct field ObjectMeta.metadata.{m} of type string"
            )));
        }
    }
    let gates = |v: &Value| -> Vec<Value> {
        v["spec"]["schedulingGates"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let (old_gates, new_gates) = (gates(old), gates(&new));
    let mut same = new["spec"].clone();
    if let Some(o) = same.as_object_mut() {
        match old["spec"].get("schedulingGates") {
            Some(g) => o.insert("schedulingGates".into(), g.clone()),
            None => o.remove("schedulingGates"),
        };
    }
    if let Some(added) = new_gates.iter().find(|g| !old_gates.contains(g)) {
        // The apiserver: scheduling gates can only be removed (KEP-3521).
        errs.push(FieldError::forbidden(
            "spec.schedulingGates",
            format!(
                "only deletion is allowed, but found new scheduling gate '{}'",
                added["name"].as_str().unwrap_or_default()
            ),
        ));
    } else if same != old["spec"] {
        errs.push(FieldError::forbidden(
            "spec",
            "pod updates may not change fields other than `spec.containers[*].image`,\
             `spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` \
             (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` \
             (allow it to be set to 1 if it was previously negative)",
        ));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid("Pod", name, &errs));
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_follows_rfc_7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge(&mut t, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}}));
    }

    #[test]
    fn spec_changes_and_stale_versions_are_refused_status_is_kept() {
        let old = json!({"metadata": {"name": "p", "resourceVersion": "5"},
            "spec": {"containers": []}, "status": {"phase": "Running"}});
        let ok = apply(
            &old,
            &json!({"metadata": {"annotations": {"x": "1"}},
            "status": {"phase": "Failed"}}),
            "p",
        )
        .unwrap();
        assert_eq!(ok["metadata"]["annotations"]["x"], "1");
        assert_eq!(ok["status"]["phase"], "Running");
        assert_eq!(
            apply(&old, &json!({"spec": {"nodeName": "n"}}), "p")
                .unwrap_err()
                .code,
            422
        );
        let stale = json!({"metadata": {"resourceVersion": "4"}});
        assert_eq!(apply(&old, &stale, "p").unwrap_err().code, 409);
        assert!(check_patch_type("application/merge-patch+json; charset=utf-8").is_ok());
        assert_eq!(check_patch_type("application/json").unwrap_err().code, 415);
    }

    #[test]
    fn scheduling_gates_may_only_be_removed() {
        let old = json!({"metadata": {"name": "p"},
            "spec": {"containers": [], "schedulingGates": [{"name": "a"}, {"name": "b"}]}});
        let fewer = json!({"spec": {"schedulingGates": [{"name": "b"}]}});
        assert_eq!(
            apply(&old, &fewer, "p").unwrap()["spec"]["schedulingGates"],
            json!([{"name": "b"}])
        );
        let none = apply(&old, &json!({"spec": {"schedulingGates": null}}), "p").unwrap();
        assert!(none["spec"].get("schedulingGates").is_none());
        let added = json!({"spec": {"schedulingGates": [{"name": "a"}, {"name": "c"}]}});
        let e = apply(&old, &added, "p").unwrap_err();
        assert_eq!(e.code, 422);
        assert!(
            e.message
                .contains("only deletion is allowed, but found new scheduling gate 'c'"),
            "{}",
            e.message
        );
        let both = json!({"spec": {"schedulingGates": null, "nodeName": "n"}});
        assert_eq!(
            apply(&old, &both, "p").unwrap_err().code,
            422,
            "other spec changes still refused"
        );
    }
}
