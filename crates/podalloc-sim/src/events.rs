//! core/v1 Events (`/api/v1/namespaces/{ns}/events[/{name}]`, `/api/v1/events`): create,
//! get, list (with the field selectors `kubectl describe` sends: `involvedObject.name`,
//! `involvedObject.namespace`, `involvedObject.kind`, `involvedObject.uid`, `reason`,
//! `type`, `source`, ...) and patch (JSON merge patch and strategic merge patch, which
//! for an Event's scalar fields are the same thing), as kube-apiserver serves them.
//!
//! Validation is the apiserver's `ValidateEventCreate` for the core group: the object
//! meta (a DNS-subdomain name), and an event about a namespaced object must live in that
//! object's namespace (`involvedObject.namespace: Invalid value: "x": does not match
//! event.namespace`). Events are kept until the simulator stops (a real cluster drops
//! them an hour after their last update, the apiserver's `--event-ttl`).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::pod::{decode_object, validate_meta};
use super::selector::FieldSelector;
use super::status::ApiError;
use super::validation::{dns1123_subdomain, FieldError};

/// The stored Events, by `namespace/name`, without type meta.
#[derive(Debug, Default)]
pub(crate) struct EventStore {
    items: BTreeMap<String, Value>,
}

/// A new Event's uid and `creationTimestamp` (RFC 3339), from the store's seeded RNG and
/// clock.
pub(crate) struct Stamp {
    pub uid: String,
    pub now: String,
}

/// Decodes a create body into an Event (400 for non-JSON, another kind or version).
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    Ok(Value::Object(decode_object(body, "Event")?))
}

/// `ValidateEventCreate` for core/v1 (see the module docs).
fn validate(ev: &Value, ns: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(ev.get("metadata").unwrap_or(&Value::Null), &mut errs);
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

/// RFC 7386 JSON merge patch: objects merge key by key, `null` removes, anything else
/// replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The Event as a single-object response (type meta first).
pub(crate) fn object_json(ev: &Value) -> Vec<u8> {
    let mut out = Map::new();
    out.insert("kind".into(), json!("Event"));
    out.insert("apiVersion".into(), json!("v1"));
    if let Value::Object(m) = ev {
        out.extend(m.clone());
    }
    serde_json::to_vec(&Value::Object(out)).unwrap_or_default()
}

impl EventStore {
    /// Creates an event in `ns` (the metadata already prepared: namespace set, server
    /// fields dropped). Errors: 422 invalid, 409 name taken. `next_rv` is called only for
    /// a create that is stored: a dry run (`dry_run`) keeps nothing and answers without a
    /// resourceVersion, as the apiserver's `DryRunnableStorage.Create` copies the object
    /// out without writing it to etcd.
    pub(crate) fn create(
        &mut self,
        ns: &str,
        mut ev: Value,
        s: Stamp,
        dry_run: bool,
        next_rv: impl FnOnce() -> String,
    ) -> Result<Value, ApiError> {
        let name = ev
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let errs = validate(&ev, ns);
        if !errs.is_empty() {
            return Err(ApiError::invalid("Event", &name, &errs));
        }
        let key = format!("{ns}/{name}");
        if self.items.contains_key(&key) {
            return Err(ApiError::already_exists_in("events", &name, false));
        }
        ev["metadata"]["uid"] = json!(s.uid);
        ev["metadata"]["creationTimestamp"] = json!(s.now);
        if dry_run {
            return Ok(ev);
        }
        ev["metadata"]["resourceVersion"] = json!(next_rv());
        self.items.insert(key, ev.clone());
        Ok(ev)
    }

    /// The event `ns/name`, or 404.
    pub(crate) fn get(&self, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.items
            .get(&format!("{ns}/{name}"))
            .cloned()
            .ok_or_else(|| ApiError::not_found("events", name))
    }

    /// Applies a merge patch to `ns/name` (404 when missing; 422 when the result is
    /// invalid or changes the name, namespace or uid). `next_rv` is called only when the
    /// patched object is stored: a failed patch writes nothing, so takes no version.
    pub(crate) fn patch(
        &mut self,
        ns: &str,
        name: &str,
        patch: &Value,
        next_rv: impl FnOnce() -> String,
    ) -> Result<Value, ApiError> {
        let key = format!("{ns}/{name}");
        let Some(old) = self.items.get(&key) else {
            return Err(ApiError::not_found("events", name));
        };
        let mut new = old.clone();
        merge_patch(&mut new, patch);
        let mut errs = Vec::new();
        for f in ["name", "namespace", "uid"] {
            let ptr = format!("/metadata/{f}");
            if new.pointer(&ptr) != old.pointer(&ptr) {
                let v = new.pointer(&ptr).and_then(Value::as_str).unwrap_or("");
                errs.push(FieldError::invalid(
                    format!("metadata.{f}"),
                    v,
                    "field is immutable",
                ));
            }
        }
        errs.extend(validate(&new, ns));
        if !errs.is_empty() {
            return Err(ApiError::invalid("Event", name, &errs));
        }
        new["metadata"]["resourceVersion"] = json!(next_rv());
        self.items.insert(key, new.clone());
        Ok(new)
    }

    /// The events of `ns` (all namespaces with `None`) that match `sel`, in key order.
    pub(crate) fn list(&self, ns: Option<&str>, sel: &FieldSelector) -> Vec<Value> {
        let prefix = ns.map(|n| format!("{n}/")).unwrap_or_default();
        self.items
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, v)| v)
            .filter(|v| sel.matches(|f| field(v, f)))
            .cloned()
            .collect()
    }

    /// Every stored event (for tests and `kubectl get events -A`).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }
}

/// An `EventList` body.
pub(crate) fn list_json(rv: u64, items: &[Value]) -> Vec<u8> {
    let items: Vec<Value> = items
        .iter()
        .map(|v| {
            let mut m = Map::new();
            m.insert("kind".into(), json!("Event"));
            m.insert("apiVersion".into(), json!("v1"));
            if let Value::Object(o) = v {
                m.extend(o.clone());
            }
            Value::Object(m)
        })
        .collect();
    serde_json::to_vec(&json!({
        "kind": "EventList",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    }))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Event field labels.
    const EVENTS: &[&str] = crate::resources::EVENT_FIELDS;

    fn stamp(n: u64) -> Stamp {
        Stamp {
            uid: format!("uid-{n}"),
            now: "2026-01-01T00:00:00Z".into(),
        }
    }

    /// A version that fails the test if taken.
    fn no_rv() -> String {
        panic!("a write that failed or was a dry run took a resourceVersion")
    }

    fn ev(name: &str, involved_ns: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "a"},
               "involvedObject": {"kind": "Pod", "name": "p", "namespace": involved_ns, "uid": "u1"},
               "reason": "SuccessfulCreate", "message": "m", "type": "Normal", "count": 1,
               "source": {"component": "podalloc"}})
    }

    #[test]
    fn create_validates_the_namespace_and_rejects_duplicates() {
        let mut s = EventStore::default();
        let e = s
            .create("a", ev("p.1", "b"), stamp(1), false, no_rv)
            .unwrap_err();
        assert_eq!(e.code, 422);
        assert_eq!(
            e.message,
            "Event \"p.1\" is invalid: involvedObject.namespace: Invalid value: \"b\": does not match event.namespace"
        );
        let dry = s
            .create("a", ev("p.1", "a"), stamp(2), true, no_rv)
            .unwrap();
        assert_eq!(dry["metadata"]["uid"], "uid-2");
        assert!(dry["metadata"].get("resourceVersion").is_none(), "{dry}");
        assert_eq!(s.len(), 0);
        s.create("a", ev("p.1", "a"), stamp(2), false, || "2".into())
            .unwrap();
        let e = s
            .create("a", ev("p.1", "a"), stamp(3), false, no_rv)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
        assert_eq!(e.message, "events \"p.1\" already exists");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn patch_merges_and_list_selects_by_involved_object() {
        let mut s = EventStore::default();
        s.create("a", ev("p.1", "a"), stamp(1), false, || "1".into())
            .unwrap();
        let out = s
            .patch(
                "a",
                "p.1",
                &json!({"count": 2, "lastTimestamp": "t2"}),
                || "5".into(),
            )
            .unwrap();
        assert_eq!(out["count"], 2);
        assert_eq!(out["metadata"]["resourceVersion"], "5");
        assert_eq!(out["reason"], "SuccessfulCreate");
        let e = s.patch("a", "nope", &json!({}), no_rv).unwrap_err();
        assert_eq!(e.message, "events \"nope\" not found");
        let e = s
            .patch("a", "p.1", &json!({"metadata": {"uid": "x"}}), no_rv)
            .unwrap_err();
        assert_eq!(e.code, 422);
        let sel = |s: &str| FieldSelector::parse(s, EVENTS).unwrap();
        assert_eq!(
            s.list(
                Some("a"),
                &sel("involvedObject.name=p,involvedObject.uid=u1")
            )
            .len(),
            1
        );
        assert_eq!(s.list(None, &sel("source=podalloc")).len(), 1);
        assert_eq!(s.list(Some("a"), &sel("involvedObject.name=q")).len(), 0);
        assert_eq!(s.list(Some("b"), &sel("")).len(), 0);
        assert!(FieldSelector::parse("spec.nodeName=x", EVENTS).is_err());
    }
}
