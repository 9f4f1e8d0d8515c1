//! `coordination.k8s.io/v1` Leases, as the apiserver serves them to leader election: get,
//! create (409 AlreadyExists when the name is taken), update (PUT, 409 Conflict with the
//! optimistic-lock message when `metadata.resourceVersion` is stale), delete.
//!
//! Decoding checks the types of the spec fields (`holderIdentity` a string, the durations
//! and counts int32, the times `MicroTime` strings), and validation is the apiserver's
//! `ValidateLease`: the name a DNS-1123 subdomain, `leaseDurationSeconds` > 0 and
//! `leaseTransitions` ≥ 0 when set. Resource versions come from the store's global counter,
//! as etcd's revision is shared by every kind.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{json, Value};

use super::configmap::OPTIMISTIC_LOCK;
use super::pod::{json_kind, validate_meta};
use super::status::ApiError;
use super::store::{check_update_target, meta_str, Store};
use super::validation::FieldError;

/// The group/version of Leases.
pub(crate) const API_VERSION: &str = "coordination.k8s.io/v1";

/// The group-qualified resource, as API errors name it.
const RESOURCE: &str = "leases.coordination.k8s.io";

/// Details of an error about a Lease: group `coordination.k8s.io`, kind `leases` (the
/// message keeps the qualified resource, as `NewNotFound(qualifiedResource, …)` renders it).
fn grouped(mut e: ApiError) -> ApiError {
    if let Some(d) = e.details.as_mut() {
        d.group = "coordination.k8s.io".into();
        d.kind = "leases".into();
    }
    e
}

/// The Leases of every namespace, by `ns/name`.
#[derive(Default)]
pub(crate) struct Leases {
    items: BTreeMap<String, Value>,
}

fn decode_error(v: &Value, go_field: &str, go_type: &str) -> ApiError {
    ApiError::bad_request(format!(
        "Lease in version \"v1\" cannot be handled as a Lease: json: cannot unmarshal {} into Go struct field {go_field} of type {go_type}",
        json_kind(v)
    ))
}

/// Go's layout for `MicroTime` (`metav1.RFC3339Micro`).
const MICRO_LAYOUT: &str = "2006-01-02T15:04:05.000000Z07:00";

/// Parses `s` as `MicroTime.UnmarshalJSON` does (`time.Parse(RFC3339Micro, s)`): exactly six
/// fractional digits, `Z` or a `±hh:mm` offset, fields in range. Errors: Go's message after
/// `parsing time "S" as "LAYOUT": ` (`cannot parse "REST" as "ELEMENT"`, `month out of
/// range`, …), or after `parsing time "S"` for `extra text`.
fn parse_micro_time(s: &str) -> Result<(), String> {
    let digits =
        |r: &str, n: usize| r.len() >= n && r.as_bytes()[..n].iter().all(u8::is_ascii_digit);
    let num = |r: &str, n: usize| r[..n].parse::<u32>().unwrap_or(0);
    let elems: [(&str, usize, u32); 11] = [
        ("2006", 4, 0),
        ("-", 0, 0),
        ("01", 2, 12),
        ("-", 0, 0),
        ("02", 2, 31),
        ("T", 0, 0),
        ("15", 2, 23),
        (":", 0, 0),
        ("04", 2, 59),
        (":", 0, 0),
        ("05", 2, 59),
    ];
    let mut rest = s;
    for (elem, n, max) in elems {
        let bad = || format!("as \"{MICRO_LAYOUT}\": cannot parse \"{rest}\" as \"{elem}\"");
        if n == 0 {
            rest = rest.strip_prefix(elem).ok_or_else(bad)?;
            continue;
        }
        if !digits(rest, n) {
            return Err(bad());
        }
        let v = num(rest, n);
        let min = u32::from(elem == "01" || elem == "02");
        if n == 2 && (v < min || v > max) {
            let what = match elem {
                "01" => "month",
                "02" => "day",
                _ => "value",
            };
            return Err(format!("as \"{MICRO_LAYOUT}\": {what} out of range"));
        }
        rest = &rest[n..];
    }
    let frac_ok = rest.starts_with('.') && digits(&rest[1..], 6);
    if !frac_ok {
        return Err(format!(
            "as \"{MICRO_LAYOUT}\": cannot parse \"{rest}\" as \".000000\""
        ));
    }
    rest = &rest[7..];
    let zone_len = if rest.starts_with('Z') {
        1
    } else if rest.len() >= 6
        && (rest.starts_with('+') || rest.starts_with('-'))
        && digits(&rest[1..], 2)
        && rest.as_bytes()[3] == b':'
        && digits(&rest[4..], 2)
    {
        6
    } else {
        return Err(format!(
            "as \"{MICRO_LAYOUT}\": cannot parse \"{rest}\" as \"Z07:00\""
        ));
    };
    match &rest[zone_len..] {
        "" => Ok(()),
        extra => Err(format!(": extra text: \"{extra}\"")),
    }
}

/// Decodes a create or update body, as the apiserver's decoder would: 400 for non-JSON, a
/// foreign kind or group, or a mistyped field. `kind` and `apiVersion` are removed.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    let Value::Object(mut obj) = v else {
        return Err(ApiError::bad_request(format!(
            "couldn't get version/kind; json parse error: json: cannot unmarshal {} into Go value",
            json_kind(&v)
        )));
    };
    let kind = obj.remove("kind");
    let api_version = obj.remove("apiVersion");
    let kind = kind.as_ref().and_then(Value::as_str).unwrap_or("");
    let api_version = api_version.as_ref().and_then(Value::as_str).unwrap_or("");
    if !kind.is_empty() && kind != "Lease" {
        return Err(ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type Lease): decoding kind {kind:?} ({api_version:?}) into Lease"
        )));
    }
    if !api_version.is_empty() && api_version != API_VERSION {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({API_VERSION})"
        )));
    }
    let lease = Value::Object(obj);
    match lease.get("metadata") {
        None | Some(Value::Null) | Some(Value::Object(_)) => {}
        Some(other) => return Err(decode_error(other, "Lease.metadata", "v1.ObjectMeta")),
    }
    check_spec(lease.get("spec"))?;
    Ok(lease)
}

fn check_spec(spec: Option<&Value>) -> Result<(), ApiError> {
    let spec = match spec {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(m)) => m,
        Some(other) => return Err(decode_error(other, "Lease.spec", "v1.LeaseSpec")),
    };
    for (k, v) in spec {
        let field = format!("LeaseSpec.spec.{k}");
        match (k.as_str(), v) {
            (_, Value::Null) => {}
            ("holderIdentity" | "strategy" | "preferredHolder", Value::String(_)) => {}
            ("holderIdentity" | "strategy" | "preferredHolder", other) => {
                return Err(decode_error(other, &field, "string"))
            }
            ("leaseDurationSeconds" | "leaseTransitions", n) => {
                let ok = n.as_i64().is_some_and(|n| i32::try_from(n).is_ok());
                if !ok {
                    return Err(decode_error(n, &field, "int32"));
                }
            }
            ("acquireTime" | "renewTime", Value::String(s)) => {
                if let Err(why) = parse_micro_time(s) {
                    return Err(ApiError::bad_request(format!(
                        "Lease in version \"v1\" cannot be handled as a Lease: parsing time \"{s}\" {}",
                        why.trim_start_matches(' ')
                    )));
                }
            }
            ("acquireTime" | "renewTime", other) => {
                return Err(decode_error(other, &field, "v1.MicroTime"))
            }
            // Unknown fields are dropped by the decoder.
            _ => {}
        }
    }
    Ok(())
}

/// `ValidateLease`: object meta (name a DNS-1123 subdomain) and the spec's numbers.
pub(crate) fn validate(lease: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(lease.get("metadata").unwrap_or(&Value::Null), &mut errs);
    let spec = &lease["spec"];
    if let Some(d) = spec["leaseDurationSeconds"].as_i64() {
        if d <= 0 {
            errs.push(FieldError::invalid(
                "spec.leaseDurationSeconds",
                &d.to_string(),
                "must be greater than 0",
            ));
            // Go prints the int32 value unquoted.
            if let Some(e) = errs.last_mut() {
                e.value = d.to_string();
            }
        }
    }
    if let Some(t) = spec["leaseTransitions"].as_i64() {
        if t < 0 {
            errs.push(FieldError::invalid(
                "spec.leaseTransitions",
                &t.to_string(),
                "must be greater than or equal to 0",
            ));
            if let Some(e) = errs.last_mut() {
                e.value = t.to_string();
            }
        }
    }
    errs
}

/// The object as a single-object response: `kind` and `apiVersion` first.
pub(crate) fn object_json(stored: &Value) -> Vec<u8> {
    let body = serde_json::to_string(stored).unwrap_or_else(|_| "{}".into());
    let mut out = Vec::with_capacity(body.len() + 60);
    out.extend_from_slice(br#"{"kind":"Lease","apiVersion":"coordination.k8s.io/v1""#);
    let rest = &body[1..];
    if !rest.starts_with('}') {
        out.push(b',');
    }
    out.extend_from_slice(rest.as_bytes());
    out
}

impl Leases {
    /// The Lease `ns/name`, or 404.
    pub(crate) fn get(&self, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.items
            .get(&format!("{ns}/{name}"))
            .cloned()
            .ok_or_else(|| grouped(ApiError::not_found(RESOURCE, name)))
    }

    /// Creates a Lease. Errors: 404 for an impossible namespace, 400 namespace mismatch, 422
    /// invalid, 500 resourceVersion set, 409 AlreadyExists.
    pub(crate) fn create(
        &mut self,
        store: &mut Store,
        ns: &str,
        mut v: Value,
        dry_run: bool,
        now: Instant,
    ) -> Result<Value, ApiError> {
        if !super::validation::dns1123_label(ns).is_empty() {
            return Err(ApiError::namespace_not_found(ns));
        }
        if !v.get("metadata").is_some_and(Value::is_object) {
            v["metadata"] = json!({});
        }
        let body_ns = meta_str(&v, "namespace");
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let rv_set = !matches!(meta_str(&v, "resourceVersion"), "" | "0");
        let name = meta_str(&v, "name").to_string();
        let meta = &mut v["metadata"];
        meta["namespace"] = json!(ns);
        if let Some(m) = meta.as_object_mut() {
            for k in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "managedFields",
            ] {
                m.remove(k);
            }
        }
        let errs = validate(&v);
        if !errs.is_empty() {
            return Err(ApiError::invalid("Lease", &name, &errs));
        }
        if rv_set {
            return Err(ApiError::unknown_server_error(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let key = format!("{ns}/{name}");
        if self.items.contains_key(&key) {
            return Err(grouped(ApiError::already_exists_in(RESOURCE, &name, false)));
        }
        // uid and creationTimestamp as every kind gets them (`FillObjectMetaSystemFields`),
        // from the store's seeded RNG and clock, dry run or not.
        let (uid, created) = store.identity(now);
        v["metadata"]["uid"] = json!(uid);
        v["metadata"]["creationTimestamp"] = json!(created);
        if dry_run {
            return Ok(v);
        }
        v["metadata"]["resourceVersion"] = json!(store.next_rv());
        self.items.insert(key, v.clone());
        Ok(v)
    }

    /// Replaces a Lease (PUT): conditional on `metadata.resourceVersion` when set (409
    /// Conflict when stale). Errors also: 400 name/namespace mismatch, 404, 422. An update
    /// that changes nothing keeps the resource version.
    pub(crate) fn update(
        &mut self,
        store: &mut Store,
        ns: &str,
        name: &str,
        mut v: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if !v.get("metadata").is_some_and(Value::is_object) {
            v["metadata"] = json!({});
        }
        check_update_target(&v, ns, name)?;
        let key = format!("{ns}/{name}");
        let Some(old) = self.items.get(&key) else {
            return Err(grouped(ApiError::not_found(RESOURCE, name)));
        };
        let want_rv = meta_str(&v, "resourceVersion");
        let old_rv = meta_str(old, "resourceVersion").to_string();
        if want_rv.is_empty() {
            // Leases do not allow unconditional updates (`AllowUnconditionalUpdate` is
            // false in the Lease strategy).
            let mut e = FieldError::invalid(
                "metadata.resourceVersion",
                "",
                "must be specified for an update",
            );
            e.value = "0x0".into();
            return Err(ApiError::invalid("Lease.coordination.k8s.io", name, &[e]));
        }
        if want_rv != old_rv {
            return Err(grouped(ApiError::conflict(RESOURCE, name, OPTIMISTIC_LOCK)));
        }
        let meta = &mut v["metadata"];
        meta["namespace"] = json!(ns);
        meta["uid"] = old["metadata"]["uid"].clone();
        meta["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
        meta["resourceVersion"] = json!(old_rv);
        let errs = validate(&v);
        if !errs.is_empty() {
            return Err(ApiError::invalid("Lease", name, &errs));
        }
        if &v == old || dry_run {
            return Ok(v);
        }
        v["metadata"]["resourceVersion"] = json!(store.next_rv());
        self.items.insert(key, v.clone());
        Ok(v)
    }

    /// Deletes a Lease at once; returns its uid. Errors: 404.
    pub(crate) fn delete(
        &mut self,
        store: &mut Store,
        ns: &str,
        name: &str,
    ) -> Result<String, ApiError> {
        let v = self
            .items
            .remove(&format!("{ns}/{name}"))
            .ok_or_else(|| grouped(ApiError::not_found(RESOURCE, name)))?;
        store.next_rv();
        Ok(meta_str(&v, "uid").to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_checks_group_and_types() {
        let v = decode(br#"{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"l"},"spec":{"holderIdentity":"a","leaseDurationSeconds":15,"renewTime":"2024-01-01T00:00:00.000000Z"}}"#).unwrap();
        assert_eq!(v["spec"]["holderIdentity"], "a");
        assert!(v.get("kind").is_none());
        let e = decode(br#"{"apiVersion":"v1"}"#).unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message.contains("(coordination.k8s.io/v1)"),
            "{}",
            e.message
        );
        let e = decode(br#"{"spec":{"leaseDurationSeconds":"15"}}"#).unwrap_err();
        assert_eq!(e.message, "Lease in version \"v1\" cannot be handled as a Lease: json: cannot unmarshal string into Go struct field LeaseSpec.spec.leaseDurationSeconds of type int32");
        for (t, why) in [
            ("2026-01-01T00:00:00Z", r#"cannot parse "Z" as ".000000""#),
            (
                "2026-01-01T00:00:00.123Z",
                r#"cannot parse ".123Z" as ".000000""#,
            ),
            (
                "2026-01-01T00:00:00.1234567Z",
                r#"cannot parse "7Z" as "Z07:00""#,
            ),
            ("2026-13-01T00:00:00.000000Z", "month out of range"),
            (
                "2026-01-01 00:00:00.000000Z",
                r#"cannot parse " 00:00:00.000000Z" as "T""#,
            ),
            ("2026-01-01T00:00:00.000000Zx", r#"extra text: "x""#),
        ] {
            let body = format!(r#"{{"spec":{{"renewTime":"{t}"}}}}"#);
            let e = decode(body.as_bytes()).unwrap_err();
            assert_eq!(e.code, 400, "{t}");
            assert!(e.message.contains(why), "{t}: {}", e.message);
        }
        for t in [
            "2026-01-01T00:00:00.123456Z",
            "2026-01-01T00:00:00.123456+02:00",
        ] {
            let body = format!(r#"{{"spec":{{"renewTime":"{t}"}}}}"#);
            assert!(decode(body.as_bytes()).is_ok(), "{t}");
        }
        let e = decode(br#"{"spec":{"renewTime":"yesterday"}}"#).unwrap_err();
        assert!(
            e.message.contains("parsing time \"yesterday\""),
            "{}",
            e.message
        );
    }

    #[test]
    fn validation_messages() {
        let v = json!({"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": 0, "leaseTransitions": -1}});
        let errs: Vec<String> = validate(&v).iter().map(ToString::to_string).collect();
        assert_eq!(
            errs,
            vec![
                "spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0",
                "spec.leaseTransitions: Invalid value: -1: must be greater than or equal to 0"
            ]
        );
    }
}
