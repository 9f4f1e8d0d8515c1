//! What the apiserver does to a ConfigMap object: decoding checks, `ValidateConfigMap`
//! (config keys, no key in both `data` and `binaryData`, at most 1 MiB of values) and
//! `ValidateConfigMapUpdate` (`immutable`). The objects live in the registry (`registry.rs`).

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::Strategy;
use crate::pod::{check_meta_strings, unmarshal_error, validate_meta};
use crate::status::ApiError;
use crate::validation::{config_map_key, FieldError};

/// `core.MaxSecretSize`: the most bytes of `data` plus `binaryData` values a ConfigMap may
/// hold (1 MiB).
pub(crate) const MAX_DATA_BYTES: usize = 1024 * 1024;

/// The ConfigMap strategy (`configmap.Strategy`): `ValidateConfigMap` and
/// `ValidateConfigMapUpdate`.
pub(crate) struct ConfigMaps;

impl Strategy for ConfigMaps {
    fn validate(&self, obj: &Value, _ns: &str) -> Vec<FieldError> {
        validate(obj)
    }

    fn validate_update(&self, new: &Value, old: &Value, _ns: &str) -> Vec<FieldError> {
        validate_update(new, old)
    }
}

fn decode_error(v: &Value, go_field: &str, go_type: &str) -> ApiError {
    unmarshal_error("ConfigMap", v, go_field, go_type)
}

/// A `map[string]string` field: an object of strings (a JSON null value decodes as "").
fn check_string_map(parent: &mut Value, key: &str, go_field: &str) -> Result<(), ApiError> {
    match parent.get_mut(key) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(m)) => {
            for v in m.values_mut() {
                match v {
                    Value::String(_) => {}
                    Value::Null => *v = json!(""),
                    other => return Err(decode_error(other, go_field, "string")),
                }
            }
            Ok(())
        }
        Some(other) => Err(decode_error(other, go_field, "map[string]string")),
    }
}

/// Decodes a request body into a ConfigMap value, as the apiserver's decoder would: 400
/// for non-JSON, a non-object, a foreign kind, a mistyped field or bad base64 in
/// `binaryData` (re-encoded canonically). `kind` and `apiVersion` are removed.
pub(crate) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let obj = crate::pod::decode_object(body, "ConfigMap")?;
    let mut cm = Value::Object(obj);
    match cm.get_mut("metadata") {
        None | Some(Value::Null) => {}
        Some(meta @ Value::Object(_)) => {
            check_meta_strings("ConfigMap", meta)?;
            check_string_map(meta, "labels", "ObjectMeta.metadata.labels")?;
            check_string_map(meta, "annotations", "ObjectMeta.metadata.annotations")?;
        }
        Some(other) => return Err(decode_error(other, "ConfigMap.metadata", "v1.ObjectMeta")),
    }
    check_string_map(&mut cm, "data", "ConfigMap.data")?;
    match cm.get("immutable") {
        None | Some(Value::Null) | Some(Value::Bool(_)) => {}
        Some(other) => return Err(decode_error(other, "ConfigMap.immutable", "bool")),
    }
    match cm.get_mut("binaryData") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for v in m.values_mut() {
                let text = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => return Err(decode_error(other, "ConfigMap.binaryData", "[]uint8")),
                };
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text.as_bytes())
                    .map_err(|e| {
                        let at = match e {
                            base64::DecodeError::InvalidByte(i, _)
                            | base64::DecodeError::InvalidLastSymbol(i, _) => i,
                            _ => text.len(),
                        };
                        ApiError::bad_request(format!(
                            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: illegal base64 data at input byte {at}"
                        ))
                    })?;
                *v = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
            }
        }
        Some(other) => {
            return Err(decode_error(
                other,
                "ConfigMap.binaryData",
                "map[string][]uint8",
            ))
        }
    }
    // Empty maps are dropped on the way through Go's omitempty.
    if let Some(obj) = cm.as_object_mut() {
        for k in ["data", "binaryData"] {
            if obj
                .get(k)
                .is_some_and(|m| m.is_null() || m.as_object().is_some_and(Map::is_empty))
            {
                obj.remove(k);
            }
        }
        if obj.get("immutable").is_some_and(Value::is_null) {
            obj.remove("immutable");
        }
    }
    drop_empty_meta(&mut cm);
    Ok(cm)
}

/// ObjectMeta's maps and lists that Go's `omitempty` drops when empty (a patch that removes
/// the last label or finalizer leaves none, not an empty one).
fn drop_empty_meta(cm: &mut Value) {
    if let Some(meta) = cm.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.retain(|k, v| {
            let empty =
                v.as_object().is_some_and(Map::is_empty) || v.as_array().is_some_and(Vec::is_empty);
            !(empty
                && ["labels", "annotations", "finalizers", "ownerReferences"].contains(&k.as_str()))
        });
    }
}

fn binary_len(b64: &str) -> usize {
    base64::engine::general_purpose::STANDARD
        .decode(b64.as_bytes())
        .map_or(0, |b| b.len())
}

/// `ValidateConfigMap`.
pub(crate) fn validate(cm: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_meta(cm.get("metadata").unwrap_or(&Value::Null), &mut errs);
    let empty = Map::new();
    let data = cm.get("data").and_then(Value::as_object).unwrap_or(&empty);
    let binary = cm
        .get("binaryData")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut total = 0usize;
    for (k, v) in data {
        for m in config_map_key(k) {
            errs.push(FieldError::invalid(format!("data[{k}]"), k, m));
        }
        if binary.contains_key(k) {
            errs.push(FieldError::invalid(
                format!("data[{k}]"),
                k,
                "duplicate of key present in binaryData",
            ));
        }
        total += v.as_str().map_or(0, str::len);
    }
    for (k, v) in binary {
        for m in config_map_key(k) {
            errs.push(FieldError::invalid(format!("binaryData[{k}]"), k, m));
        }
        total += v.as_str().map_or(0, binary_len);
    }
    if total > MAX_DATA_BYTES {
        // An empty field path renders as "[]": the error is about the whole object.
        errs.push(FieldError::too_long("[]", MAX_DATA_BYTES));
    }
    errs
}

/// `ValidateConfigMapUpdate`: once `immutable` is true neither it nor the data may change;
/// then `ValidateConfigMap` on the new object (the uid check is the registry's, common to
/// every kind).
pub(crate) fn validate_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let immutable = |v: &Value| v.get("immutable").and_then(Value::as_bool) == Some(true);
    if immutable(old) {
        const MSG: &str = "field is immutable when `immutable` is set";
        if !immutable(new) {
            errs.push(FieldError::forbidden("immutable", MSG));
        }
        for k in ["data", "binaryData"] {
            if new.get(k) != old.get(k) {
                errs.push(FieldError::forbidden(k, MSG));
            }
        }
    }
    errs.extend(validate(new));
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_checks_types_and_base64() {
        let v = decode(br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a"},"data":{"k":null},"binaryData":{"b":"aGk="}}"#).unwrap();
        assert_eq!(v["data"]["k"], "");
        assert!(v.get("kind").is_none());
        let e = decode(br#"{"data":{"k":1}}"#).unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(e.message, "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ConfigMap.data of type string");
        let e = decode(br#"{"binaryData":{"b":"not base64!"}}"#).unwrap_err();
        assert_eq!(e.message, "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: illegal base64 data at input byte 3");
        let e = decode(br#"{"kind":"Pod"}"#).unwrap_err();
        assert!(e.message.contains("must be of type ConfigMap"));
    }

    #[test]
    fn validation_messages() {
        let v = json!({"metadata": {"name": "cm"}, "data": {"bad key": "x", "dup": "y"},
                       "binaryData": {"dup": "eQ=="}});
        let errs: Vec<String> = validate(&v).iter().map(ToString::to_string).collect();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(
            errs[0].starts_with("data[bad key]: Invalid value: \"bad key\": a valid config key")
        );
        assert_eq!(
            errs[1],
            "data[dup]: Invalid value: \"dup\": duplicate of key present in binaryData"
        );
        let big = json!({"metadata": {"name": "cm"}, "data": {"a": "x".repeat(MAX_DATA_BYTES), "b": "y"}});
        let errs = validate(&big);
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].to_string(),
            "[]: Too long: may not be more than 1048576 bytes"
        );
        let exact = json!({"metadata": {"name": "cm"}, "data": {"a": "x".repeat(MAX_DATA_BYTES)}});
        assert!(validate(&exact).is_empty());
    }
}
