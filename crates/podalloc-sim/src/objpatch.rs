//! `PATCH` of the kinds the registry stores (`registry.rs`), as kube-apiserver's patch
//! handler (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go`) applies the
//! three patch types to the object as served (with `kind` and `apiVersion`), before the
//! result goes through the kind's update:
//!
//! - `application/merge-patch+json`: RFC 7386 (objects merge key by key, `null` removes);
//! - `application/json-patch+json`: RFC 6902 (`add`, `remove`, `replace`, `move`, `copy`,
//!   `test`), with `gopkg.in/evanphx/json-patch.v4`'s semantics (a `replace` of a missing
//!   key of an object adds it) and error texts; a failed operation is the 422 the handler
//!   makes of it (`the server rejected our request due to an error in our request`);
//! - `application/strategic-merge-patch+json`, for built-in kinds only (a custom resource
//!   answers 415, listing the types it accepts): a merge patch whose `$patch: replace` /
//!   `delete`, `$retainKeys` and `$deleteFromPrimitiveList/…` directives are obeyed, and
//!   whose lists are replaced except `metadata.finalizers` (merged as a set) and
//!   `metadata.ownerReferences` (merged by `uid`), the only lists with a patch strategy in
//!   the kinds stored here (ConfigMaps, Events, Leases).
//!
//! Server-side apply (`application/apply-patch+yaml`) is not modelled: 415.

use serde_json::{Map, Value};

use crate::status::ApiError;

/// A patch type the simulator applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Strategic,
    Json,
}

/// The patch type of a `Content-Type`, for a built-in kind (`custom` false) or a custom
/// resource. Errors: 415 with the apiserver's message (a custom resource lists the types its
/// handler accepts, strategic merge patch not among them).
pub(crate) fn patch_type(content_type: &str, custom: bool) -> Result<PatchType, ApiError> {
    let media = content_type.split(';').next().unwrap_or("").trim();
    match (media.to_ascii_lowercase().as_str(), custom) {
        ("application/merge-patch+json", _) => Ok(PatchType::Merge),
        ("application/json-patch+json", _) => Ok(PatchType::Json),
        ("application/strategic-merge-patch+json", false) => Ok(PatchType::Strategic),
        (_, false) => Err(ApiError::unsupported_patch_type(content_type)),
        (_, true) => Err(ApiError::unsupported_patch_type_of(&[
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        ])),
    }
}

/// `served` (the object as a GET returns it) with the patch `body` of type `t` applied.
/// Errors: 400 for a body that does not decode, 422 for a JSON patch operation that fails.
pub(crate) fn apply(t: PatchType, served: &Value, body: &[u8]) -> Result<Value, ApiError> {
    match t {
        PatchType::Merge | PatchType::Strategic => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "json: cannot unmarshal array into Go value of type map[string]interface {}",
                ));
            }
            let mut out = served.clone();
            match t {
                PatchType::Merge => merge(&mut out, &patch),
                _ => strategic(&mut out, &patch, ""),
            }
            Ok(out)
        }
        PatchType::Json => {
            let ops: Vec<Value> = match serde_json::from_slice::<Value>(body) {
                Ok(Value::Array(ops)) => ops,
                Ok(other) => {
                    return Err(ApiError::bad_request(format!(
                        "json: cannot unmarshal {} into Go value of type jsonpatch.Patch",
                        go_type(&other)
                    )))
                }
                Err(e) => return Err(ApiError::bad_request(e.to_string())),
            };
            // `NewGenericServerResponse(422, …)`: the library's text is not kept.
            json_patch(served, &ops).map_err(|_| ApiError::json_patch_failed())
        }
    }
}

/// The name Go's JSON decoder gives a value's type in its errors.
fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Number(_) => "number",
        Value::Bool(_) => "bool",
        Value::Null => "null",
    }
}

/// RFC 7386: merges `patch` into `target` (objects key by key, `null` deletes, anything
/// else replaces).
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// The lists with a patch strategy (`patchStrategy:"merge"`) of the kinds stored here, by
/// path, and their merge key (`None`: a list of primitives, merged as a set).
fn list_merge_key(path: &str) -> Option<Option<&'static str>> {
    match path {
        "metadata.finalizers" => Some(None),
        "metadata.ownerReferences" => Some(Some("uid")),
        _ => None,
    }
}

/// A strategic merge patch of `patch` into `target` at `path` (see the module docs).
fn strategic(target: &mut Value, patch: &Value, path: &str) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut rest = p.clone();
        rest.remove("$patch");
        *target = Value::Object(rest);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("an object");
    if let Some(keep) = p.get("$retainKeys").and_then(Value::as_array) {
        t.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
    for (k, v) in p {
        let child = if path.is_empty() {
            k.clone()
        } else {
            format!("{path}.{k}")
        };
        if let Some(list) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(have)), Some(gone)) = (t.get_mut(list), v.as_array()) {
                have.retain(|x| !gone.contains(x));
                if have.is_empty() {
                    t.remove(list);
                }
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                t.remove(k);
            }
            Value::Object(o) if o.get("$patch").and_then(Value::as_str) == Some("delete") => {
                t.remove(k);
            }
            Value::Array(items) => match list_merge_key(&child) {
                Some(key) => merge_list(t.entry(k.clone()).or_insert(Value::Null), items, key),
                None => {
                    t.insert(k.clone(), v.clone());
                }
            },
            _ => strategic(t.entry(k.clone()).or_insert(Value::Null), v, &child),
        }
    }
}

/// A list with a merge strategy: primitives are added when absent; objects replace or merge
/// into the item with the same `key`, or are appended; `{key: K, $patch: delete}` removes.
/// The result is ordered as `mergeSlice` orders it: the patch's items in the patch's order,
/// the others (in their stored order) placed before a patch item only when both were
/// stored and they came first.
fn merge_list(target: &mut Value, items: &[Value], key: Option<&str>) {
    let original = target.as_array().cloned().unwrap_or_default();
    let id = |v: &Value| match key {
        Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
        None => v.clone(),
    };
    let mut merged = original.clone();
    for item in items {
        let pos = merged.iter().position(|h| id(h) == id(item));
        let delete = key.is_some() && item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                merged.remove(i);
            }
            (Some(i), false) if key.is_some() => strategic(&mut merged[i], item, ""),
            (None, false) => merged.push(item.clone()),
            _ => {}
        }
    }
    let in_patch: Vec<Value> = items.iter().map(id).collect();
    let (mut right, left): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|m| in_patch.contains(&id(m)));
    right.sort_by_key(|m| in_patch.iter().position(|p| *p == id(m)));
    let stored = |v: &Value| original.iter().position(|o| id(o) == id(v));
    let (mut l, mut r) = (left.into_iter().peekable(), right.into_iter().peekable());
    let mut out = Vec::new();
    loop {
        let take_left = match (l.peek(), r.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => matches!((stored(a), stored(b)), (Some(x), Some(y)) if x < y),
        };
        out.extend(if take_left { l.next() } else { r.next() });
    }
    *target = Value::Array(out);
}

/// A JSON pointer's tokens (`~1` is `/`, `~0` is `~`).
fn tokens(path: &str) -> Vec<String> {
    path.split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// The container of `path`'s last token and that token (`findObject`): `None` when a parent
/// is missing or the path is empty.
fn parent<'a>(doc: &'a mut Value, path: &str) -> Option<(&'a mut Value, String)> {
    let mut toks = tokens(path);
    let last = toks.pop()?;
    let mut cur = doc;
    for t in toks {
        cur = match cur {
            Value::Object(m) => m.get_mut(&t)?,
            Value::Array(a) => a.get_mut(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    matches!(cur, Value::Object(_) | Value::Array(_)).then_some((cur, last))
}

/// `Unable to access invalid index` as the library words it.
fn bad_index(op: &str, path: &str, key: &str) -> String {
    format!("error in {op} for path: '{path}': Unable to access invalid index: {key}: invalid index referenced")
}

/// Adds `value` at `path` (an array index may be `-`, the end).
fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let missing =
        || format!("add operation does not apply: doc is missing path: \"{path}\": missing value");
    let (con, key) = parent(doc, path).ok_or_else(missing)?;
    match con {
        Value::Object(m) => {
            m.insert(key, value);
        }
        Value::Array(a) if key == "-" => a.push(value),
        Value::Array(a) => match key.parse::<usize>() {
            Ok(i) if i <= a.len() => a.insert(i, value),
            _ => return Err(bad_index("add", path, &key)),
        },
        _ => return Err(missing()),
    }
    Ok(())
}

/// Removes what is at `path` and returns it.
fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let missing = || {
        format!("remove operation does not apply: doc is missing path: \"{path}\": missing value")
    };
    let (con, key) = parent(doc, path).ok_or_else(missing)?;
    match con {
        Value::Object(m) => m.remove(&key).ok_or_else(|| {
            format!("error in remove for path: '{path}': Unable to remove nonexistent key: {key}: missing value")
        }),
        Value::Array(a) => match key.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(bad_index("remove", path, &key)),
        },
        _ => Err(missing()),
    }
}

/// What is at `path`, if anything.
fn get<'a>(doc: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = doc;
    for t in tokens(path) {
        cur = match cur {
            Value::Object(m) => m.get(&t)?,
            Value::Array(a) => a.get(t.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// RFC 6902 over `doc`; the error is the library's text of the first operation that fails.
fn json_patch(doc: &Value, ops: &[Value]) -> Result<Value, String> {
    let mut doc = doc.clone();
    for op in ops {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or("unknown");
        let path = op.get("path").and_then(Value::as_str);
        let value = op.get("value").cloned().unwrap_or(Value::Null);
        let Some(path) = path else {
            return Err(format!(
                "{kind} operation failed to decode path: missing value"
            ));
        };
        match kind {
            "add" => add(&mut doc, path, value)?,
            "remove" => remove(&mut doc, path).map(drop)?,
            "replace" => replace(&mut doc, path, value)?,
            "test" => {
                let have = get(&doc, path).cloned().unwrap_or(Value::Null);
                if have != value {
                    return Err(format!("testing value {path} failed: test failed"));
                }
            }
            "move" | "copy" => {
                let from = op.get("from").and_then(Value::as_str).unwrap_or("");
                let v = match kind {
                    "move" => remove(&mut doc, from)?,
                    _ => get(&doc, from).cloned().ok_or_else(|| {
                        format!("copy operation does not apply: doc is missing from path: {from}: missing value")
                    })?,
                };
                add(&mut doc, path, v)?;
            }
            other => return Err(format!("Unexpected kind: {other}")),
        }
    }
    Ok(doc)
}

/// Replaces what is at `path` (a missing key of an object is added, as the library does).
fn replace(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let Some((con, key)) = parent(doc, path) else {
        return Err(format!(
            "replace operation does not apply: doc is missing path: {path}: missing value"
        ));
    };
    match con {
        Value::Object(m) => {
            m.insert(key, value);
        }
        Value::Array(a) => match key.parse::<usize>() {
            Ok(i) if i < a.len() => a[i] = value,
            _ => return Err(bad_index("replace", path, &key)),
        },
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn patched(t: PatchType, doc: Value, body: Value) -> Result<Value, ApiError> {
        apply(t, &doc, body.to_string().as_bytes())
    }

    #[test]
    fn json_patch_follows_rfc_6902_and_the_librarys_errors() {
        let doc = json!({"spec": {"replicas": 1, "list": [1, 2]}});
        let ops = json!([
            {"op": "test", "path": "/spec/replicas", "value": 1},
            {"op": "replace", "path": "/spec/replicas", "value": 3},
            {"op": "add", "path": "/spec/list/-", "value": 4},
            {"op": "remove", "path": "/spec/list/0"},
            {"op": "copy", "from": "/spec/replicas", "path": "/spec/copied"},
            {"op": "replace", "path": "/spec/new", "value": "x"}]);
        assert_eq!(
            patched(PatchType::Json, doc.clone(), ops).unwrap(),
            json!({"spec": {"replicas": 3, "list": [2, 4], "copied": 3, "new": "x"}})
        );
        let failed = patched(
            PatchType::Json,
            doc.clone(),
            json!([{"op": "test", "path": "/spec/replicas", "value": 2}]),
        )
        .unwrap_err();
        assert_eq!((failed.code, failed.reason), (422, "Invalid"));
        assert_eq!(
            failed.message,
            "the server rejected our request due to an error in our request"
        );
        assert_eq!(
            json_patch(&doc, &[json!({"op": "remove", "path": "/spec/nope"})]).unwrap_err(),
            "error in remove for path: '/spec/nope': Unable to remove nonexistent key: nope: missing value"
        );
        assert_eq!(
            json_patch(&doc, &[json!({"op": "add", "path": "/a/b", "value": 1})]).unwrap_err(),
            "add operation does not apply: doc is missing path: \"/a/b\": missing value"
        );
        assert_eq!(
            patched(PatchType::Json, doc, json!({})).unwrap_err().code,
            400
        );
    }

    #[test]
    fn strategic_merge_merges_finalizers_and_obeys_directives() {
        let doc = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}},
            "data": {"k": "v", "l": "w"}});
        let p = json!({"metadata": {"finalizers": ["b"], "labels": {"x": null}},
            "data": {"$patch": "replace", "only": "this"}});
        // The patch's new items first, as kube-apiserver orders them.
        assert_eq!(
            patched(PatchType::Strategic, doc.clone(), p).unwrap(),
            json!({"metadata": {"finalizers": ["b", "a"], "labels": {"y": "2"}},
                "data": {"only": "this"}})
        );
        let p = json!({"metadata": {"finalizers": ["c", "a"]}});
        let two = json!({"metadata": {"finalizers": ["a", "b"]}});
        assert_eq!(
            patched(PatchType::Strategic, two, p).unwrap()["metadata"]["finalizers"],
            json!(["c", "a", "b"])
        );
        let p = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}});
        let out = patched(PatchType::Strategic, doc, p).unwrap();
        assert!(out["metadata"].get("finalizers").is_none(), "{out}");
    }

    #[test]
    fn custom_resources_refuse_strategic_merge_patches() {
        assert_eq!(
            patch_type("application/merge-patch+json", true).unwrap(),
            PatchType::Merge
        );
        let e = patch_type("application/strategic-merge-patch+json", true).unwrap_err();
        assert_eq!(e.code, 415);
        assert_eq!(
            e.message,
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        );
        assert_eq!(
            patch_type("application/strategic-merge-patch+json", false).unwrap(),
            PatchType::Strategic
        );
    }
}
