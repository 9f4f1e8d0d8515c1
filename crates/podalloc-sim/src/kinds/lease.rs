//! `coordination.k8s.io/v1` Leases, as the apiserver serves them to leader election: get,
//! create (409 AlreadyExists when the name is taken), update (PUT, 409 Conflict with the
//! optimistic-lock message when `metadata.resourceVersion` is stale), delete.
//!
//! Decoding checks the types of the spec fields (`holderIdentity` a string, the durations
//! and counts int32, the times `MicroTime` strings), and validation is the apiserver's
//! `ValidateLease`: the name a DNS-1123 subdomain, `leaseDurationSeconds` > 0 and
//! `leaseTransitions` ≥ 0 when set. The objects live in the registry (`registry.rs`), which
//! does what every kind shares (metadata, the optimistic lock, the resourceVersion counter
//! shared with every kind, as etcd's revision is).

use serde_json::Value;

use super::Strategy;
use crate::pod::{object_of, parse_body, unmarshal_error, validate_meta};
use crate::status::ApiError;
use crate::validation::FieldError;

/// The group/version of Leases.
pub(crate) const API_VERSION: &str = "coordination.k8s.io/v1";

/// The Lease strategy (`lease.Strategy`): `ValidateLease`, and no unconditional update
/// (`AllowUnconditionalUpdate` is false).
pub(crate) struct Leases;

impl Strategy for Leases {
    fn validate(&self, obj: &Value, _ns: &str) -> Vec<FieldError> {
        validate(obj)
    }

    fn allow_unconditional_update(&self) -> bool {
        false
    }
}

fn decode_error(v: &Value, go_field: &str, go_type: &str) -> ApiError {
    unmarshal_error("Lease", v, go_field, go_type)
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
    let obj = object_of(parse_body(body)?, "Lease", API_VERSION)?;
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
    // (field, least valid value, message)
    let checks = [
        ("leaseDurationSeconds", 1, "must be greater than 0"),
        ("leaseTransitions", 0, "must be greater than or equal to 0"),
    ];
    for (field, least, msg) in checks {
        if let Some(n) = spec[field].as_i64().filter(|n| *n < least) {
            let mut e = FieldError::invalid(format!("spec.{field}"), &n.to_string(), msg);
            // Go prints the int32 value unquoted.
            e.value = n.to_string();
            errs.push(e);
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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

    /// A Lease's uid and creationTimestamp come from the registry's seeded RNG and clock, as
    /// every kind's do (not from a counter and the system clock).
    #[test]
    fn uid_and_creation_time_come_from_the_seeded_rng_and_the_clock() {
        use crate::registry::Registry;
        use crate::resources::{of, Kind};
        use crate::util::{SplitMix64, WallClock};
        let now = std::time::Instant::now();
        let body = || json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}});
        let create = |r: &mut Registry| r.create(of(Kind::Lease), "a", body(), false, now).unwrap();
        let mut r = Registry::new(SplitMix64::new(7), WallClock::new());
        let lease = create(&mut r);
        assert_eq!(lease["metadata"]["creationTimestamp"], r.clock.rfc3339(now));
        let again = create(&mut Registry::new(SplitMix64::new(7), WallClock::new()));
        assert_eq!(lease["metadata"]["uid"], again["metadata"]["uid"]);
        let uid = lease["metadata"]["uid"].as_str().unwrap();
        assert_eq!((uid.len(), &uid[14..15]), (36, "4"), "a v4 UUID: {uid}");
    }
}
