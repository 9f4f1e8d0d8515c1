//! core/v1 Events (`/api/v1/namespaces/{ns}/events[/{name}]`, `/api/v1/events`): create,
//! get, list (with the field selectors `kubectl describe` sends: `involvedObject.name`,
//! `involvedObject.namespace`, `involvedObject.kind`, `involvedObject.uid`, `reason`,
//! `type`, `source`, ...) and patch (JSON merge patch and strategic merge patch, which
//! for an Event's scalar fields are the same thing), as kube-apiserver serves them.
//!
//! Validation is the apiserver's `ValidateEventCreate` for the core group: the object
//! meta (a DNS-subdomain name; a `generateName` ending in `.` is accepted, as the real server
//! does), and an event about a namespaced object must live in that
//! object's namespace (`involvedObject.namespace: Invalid value: "x": does not match
//! event.namespace`). Events are kept until the simulator stops (a real cluster drops
//! them an hour after their last update, the apiserver's `--event-ttl`).

use serde_json::Value;

use super::Strategy;
use crate::pod::{decode_object, validate_meta};
use crate::status::ApiError;
use crate::validation::{dns1123_subdomain, FieldError};

/// The Event strategy (`event.Strategy`): `ValidateEventCreate` for create, update and
/// patch alike (see the module docs), and the `source` field label, which selects on
/// `source.component`.
pub(crate) struct Events;

impl Strategy for Events {
    fn validate(&self, obj: &Value, ns: &str) -> Vec<FieldError> {
        validate(obj, ns)
    }

    fn field<'a>(&self, obj: &'a Value, f: &str) -> &'a str {
        field(obj, f)
    }
}

/// Decodes a create body into an Event (400 for non-JSON, another kind or version).
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    Ok(Value::Object(decode_object(body, "Event")?))
}

/// `ValidateEventCreate` for core/v1 (see the module docs).
fn validate(ev: &Value, ns: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(ev.get("metadata").unwrap_or(&Value::Null), &mut errs);
    // kube-apiserver v1.37.2 creates an Event from `generateName: "clamp."` (as
    // `clamp.7qm4g`) where it refuses the same prefix for a ConfigMap: an Event's generateName
    // is not validated, only the name made from it.
    errs.retain(|e| e.field != "metadata.generateName");
    let involved_ns = ev
        .pointer("/involvedObject/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let event_time_set = ev.get("eventTime").is_some_and(|t| !t.is_null());
    let mismatch = match involved_ns {
        // A cluster-scoped object's events live in "default" (or no namespace).
        "" => !ns.is_empty() && ns != "default",
        other => other != ns,
    };
    if mismatch && !event_time_set {
        errs.push(FieldError::invalid(
            "involvedObject.namespace",
            involved_ns,
            "does not match event.namespace",
        ));
    }
    for m in dns1123_subdomain(ns) {
        errs.push(FieldError::invalid("namespace", ns, m));
    }
    errs
}

/// One field of an event for field selectors (empty when unset).
fn field<'a>(ev: &'a Value, f: &str) -> &'a str {
    let ptr = match f {
        "source" => "/source/component",
        other => {
            return ev
                .pointer(&format!("/{}", other.replace('.', "/")))
                .and_then(Value::as_str)
                .unwrap_or("")
        }
    };
    ev.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use crate::resources::{of, Kind, EVENT_FIELDS};
    use crate::selector::{FieldSelector, LabelSelector};
    use crate::util::{SplitMix64, WallClock};
    use serde_json::json;
    use std::time::Instant;

    fn ev(name: &str, involved_ns: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "a"},
               "involvedObject": {"kind": "Pod", "name": "p", "namespace": involved_ns, "uid": "u1"},
               "reason": "SuccessfulCreate", "message": "m", "type": "Normal", "count": 1,
               "source": {"component": "podalloc"}})
    }

    fn registry() -> Registry {
        Registry::new(SplitMix64::new(0), WallClock::new())
    }

    #[test]
    fn create_validates_the_namespace_and_rejects_duplicates() {
        let (mut r, res, now) = (registry(), of(Kind::Event), Instant::now());
        let e = r.create(res, "a", ev("p.1", "b"), false, now).unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Event \"p.1\" is invalid: involvedObject.namespace: Invalid value: \"b\": does not match event.namespace"
        );
        // A dry run answers with a uid but stores nothing and takes no resourceVersion.
        let dry = r.create(res, "a", ev("p.1", "a"), true, now).unwrap();
        assert!(dry["metadata"]["uid"].is_string());
        assert!(dry["metadata"].get("resourceVersion").is_none(), "{dry}");
        assert!(!r.contains(Kind::Event, "a", "p.1"));
        assert_eq!(r.rv, 0);
        let made = r.create(res, "a", ev("p.1", "a"), false, now).unwrap();
        assert_eq!(made["metadata"]["resourceVersion"], "1");
        let e = r.create(res, "a", ev("p.1", "a"), false, now).unwrap_err();
        assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
        assert_eq!(e.message, "events \"p.1\" already exists");
        assert_eq!(r.rv, 1);
    }

    #[test]
    fn a_generate_name_ending_in_a_dot_makes_a_name_as_on_kube_apiserver() {
        let (mut r, res, now) = (registry(), of(Kind::Event), Instant::now());
        let mut e = ev("", "a");
        e["metadata"] = json!({"generateName": "clamp.", "namespace": "a"});
        let made = r.create(res, "a", e, false, now).unwrap();
        let name = made["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("clamp.") && name.len() == 11, "{name}");
    }

    /// A merge patch as the API applies it: to the object as served, decoded again.
    fn merged(patch: Value) -> impl FnOnce(&Value) -> Result<Value, ApiError> {
        move |served: &Value| {
            let mut v = served.clone();
            crate::objpatch::merge(&mut v, &patch);
            decode(&serde_json::to_vec(&v).unwrap())
        }
    }

    #[test]
    fn patch_merges_and_list_selects_by_involved_object() {
        use crate::registry::Part::Main;
        let (mut r, res, now) = (registry(), of(Kind::Event), Instant::now());
        r.create(res, "a", ev("p.1", "a"), false, now).unwrap();
        let patch = json!({"count": 2, "lastTimestamp": "t2"});
        let out = r
            .patch(res, "a", "p.1", merged(patch), false, Main)
            .unwrap();
        assert_eq!(out["count"], 2);
        assert_eq!(out["metadata"]["resourceVersion"], "2");
        assert_eq!(out["reason"], "SuccessfulCreate");
        assert!(out.get("kind").is_none(), "stored without type meta");
        let e = r
            .patch(res, "a", "nope", merged(json!({})), false, Main)
            .unwrap_err();
        assert_eq!(e.message, "events \"nope\" not found");
        let uid = json!({"metadata": {"uid": "x"}});
        let e = (r.patch(res, "a", "p.1", merged(uid), false, Main)).unwrap_err();
        assert_eq!(e.code, 422);
        // Failed patches write nothing, so take no resourceVersion.
        assert_eq!(r.rv, 2);
        let sel = |s: &str| FieldSelector::parse(s, EVENT_FIELDS).unwrap();
        let n =
            |ns: Option<&str>, s: &str| r.list(res, ns, &LabelSelector::default(), &sel(s)).1.len();
        assert_eq!(
            n(Some("a"), "involvedObject.name=p,involvedObject.uid=u1"),
            1
        );
        assert_eq!(n(None, "source=podalloc"), 1);
        assert_eq!(n(Some("a"), "involvedObject.name=q"), 0);
        assert_eq!(n(Some("b"), ""), 0);
        assert!(FieldSelector::parse("spec.nodeName=x", EVENT_FIELDS).is_err());
    }
}
