//! Routing and the request handlers: the pods API under `/api/v1`, a few unauthenticated
//! endpoints (`/healthz`, `/livez`, `/readyz`, `/version`) and the simulator's own
//! `/sim/...` side door.
//!
//! Deletes follow the apiserver's pod strategy: an unscheduled pod, or one already
//! Succeeded/Failed, is removed at once; otherwise `deletionTimestamp = now + grace` (grace
//! from the request, else `spec.terminationGracePeriodSeconds`) and the kubelet finishes
//! the job; a second delete can only shorten the grace period; grace 0 removes at once.

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use serde_json::Value;

use super::http::{Body, Request, Response};
use super::pod::{self, Phase};
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{
    decode_continue, encode_continue, CreateMode, DeleteOptions, PhaseOverride, Store, StoredPod,
};
use super::Shared;

fn lock(shared: &Shared) -> MutexGuard<'_, Store> {
    shared.store.lock().unwrap_or_else(|e| e.into_inner())
}

fn error_response(e: ApiError) -> Response {
    let mut r = Response::json(e.code, e.to_json());
    if let Some(d) = &e.details {
        if d.retry_after_seconds > 0 {
            r.headers
                .push(("Retry-After", d.retry_after_seconds.to_string()));
        }
    }
    r
}

fn object(code: u16, p: &StoredPod) -> Response {
    Response::json(code, p.object_json())
}

/// Compares in time independent of where the strings differ.
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Bearer-token check as the apiserver's bearer authenticator parses the header.
fn authorized(token: Option<&str>, req: &Request) -> bool {
    let Some(want) = token else { return true };
    let Some(h) = req.header("authorization") else {
        return false;
    };
    let mut parts = h.trim().splitn(3, ' ');
    let scheme = parts.next().unwrap_or("");
    let got = parts.next().unwrap_or("");
    scheme.eq_ignore_ascii_case("bearer") && !got.is_empty() && same_secret(got, want)
}

/// Handles one request.
pub(crate) fn handle(shared: &Shared, req: &Request) -> Response {
    let now = Instant::now();
    let Some(segs) = req.segments() else {
        return error_response(ApiError::bad_request("invalid URL escape in path"));
    };
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    if segs.first() == Some(&"sim") {
        return sim(shared, req, &segs[1..], now).unwrap_or_else(error_response);
    }
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let get = req.method == "GET";
    match segs.as_slice() {
        ["healthz"] | ["livez"] | ["readyz"] if get => return Response::text(200, "ok"),
        ["version"] if get => {
            return Response::json(
                200,
                br#"{"major":"1","minor":"34","gitVersion":"v1.34.0-podalloc-sim","gitCommit":"","gitTreeState":"clean","buildDate":"","goVersion":"","compiler":"gc","platform":"linux/amd64"}"#.to_vec(),
            )
        }
        _ => {}
    }
    if !authorized(shared.token.as_deref(), req) {
        return error_response(ApiError::unauthorized());
    }
    let method = req.method.as_str();
    let result = match segs.as_slice() {
        ["api", "v1", "namespaces", ns, "pods"] if !ns.is_empty() => match method {
            "GET" => list(shared, req, Some(ns), now),
            "POST" => create(shared, req, ns, now),
            "DELETE" => delete_collection(shared, req, ns, now),
            _ => Err(ApiError::method_not_allowed()),
        },
        ["api", "v1", "namespaces", ns, "pods", name] if !ns.is_empty() && !name.is_empty() => {
            match method {
                "GET" => lock(shared).get(ns, name, now).map(|p| object(200, &p)),
                "DELETE" => delete(shared, req, ns, name, now),
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        ["api", "v1", "pods"] => match method {
            "GET" => list(shared, req, None, now),
            _ => Err(ApiError::method_not_allowed()),
        },
        _ => Err(ApiError::path_not_found()),
    };
    result.unwrap_or_else(error_response)
}

fn parse_selectors(req: &Request) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let label = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let field = FieldSelector::parse_for_pods(req.param("fieldSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    Ok((label, field))
}

fn selected(p: &StoredPod, label: &LabelSelector, field: &FieldSelector) -> bool {
    label.matches(&p.labels) && field.matches(|f| p.field(f))
}

fn list(
    shared: &Shared,
    req: &Request,
    ns: Option<&str>,
    now: Instant,
) -> Result<Response, ApiError> {
    if matches!(req.param("watch"), Some("true" | "1")) {
        return Err(ApiError::bad_request(
            "watch is not supported by the podalloc simulator",
        ));
    }
    let (label, field) = parse_selectors(req)?;
    let limit = match req.param("limit").unwrap_or("") {
        "" => None,
        s => {
            let n: i64 = s.parse().map_err(|_| {
                ApiError::bad_request(format!("strconv.ParseInt: parsing {s:?}: invalid syntax"))
            })?;
            (n > 0).then_some(n as usize)
        }
    };
    let cont = match req.param("continue").unwrap_or("") {
        "" => None,
        t => Some(
            decode_continue(t)
                .map_err(|e| ApiError::bad_request(format!("invalid continue token: {e}")))?,
        ),
    };
    let rv_param = req.param("resourceVersion").unwrap_or("");
    if cont.is_some() && !rv_param.is_empty() && rv_param != "0" {
        return Err(ApiError::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let snap = lock(shared).begin_list(ns, cont.as_ref(), limit, now)?;
    // Filtering and serialising happen outside the lock, on the immutable snapshot.
    let items = &snap.items;
    let mut page: Vec<Arc<StoredPod>> = Vec::new();
    let mut i = snap.start;
    while i < items.len() {
        if snap.limit.is_some_and(|l| page.len() >= l) {
            break;
        }
        if selected(&items[i], &label, &field) {
            page.push(Arc::clone(&items[i]));
        }
        i += 1;
    }
    let more = i < items.len();
    let continue_token = (more && i > 0).then(|| {
        encode_continue(
            snap.rv as i64,
            &format!("{}\0", &items[i - 1].key[snap.prefix_len..]),
        )
    });
    let remaining = (more && label.is_empty() && field.is_empty()).then(|| items.len() - i);
    Ok(pod_list(snap.rv, continue_token, remaining, page))
}

/// A streamed `PodList` response.
fn pod_list(
    rv: u64,
    continue_token: Option<String>,
    remaining: Option<usize>,
    items: Vec<Arc<StoredPod>>,
) -> Response {
    Response {
        status: 200,
        content_type: "application/json",
        headers: Vec::new(),
        body: Body::Stream(Box::new(move |w| {
            write!(
                w,
                r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}""#
            )?;
            if let Some(c) = &continue_token {
                write!(w, r#","continue":"{c}""#)?;
            }
            if let Some(n) = remaining {
                write!(w, r#","remainingItemCount":{n}"#)?;
            }
            w.write_all(br#"},"items":["#)?;
            for (i, p) in items.iter().enumerate() {
                if i > 0 {
                    w.write_all(b",")?;
                }
                w.write_all(p.json.as_bytes())?;
            }
            w.write_all(b"]}")
        })),
    }
}

fn dry_run(req: &Request, from_body: Option<&Value>) -> Result<bool, ApiError> {
    let mut values: Vec<String> = req
        .query
        .iter()
        .filter(|(k, _)| k == "dryRun")
        .map(|(_, v)| v.clone())
        .collect();
    if let Some(Value::Array(a)) = from_body.and_then(|b| b.get("dryRun")) {
        values.extend(a.iter().filter_map(Value::as_str).map(str::to_string));
    }
    for v in &values {
        if v != "All" {
            return Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {v:?}: supported values: \"All\""
            )));
        }
    }
    Ok(!values.is_empty())
}

fn check_json_content_type(req: &Request) -> Result<(), ApiError> {
    let ct = req.header("content-type").unwrap_or("");
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    // An absent Content-Type means the first supported type, JSON.
    if media.is_empty() || media == "application/json" {
        Ok(())
    } else {
        Err(ApiError::unsupported_media_type(ct))
    }
}

fn create(shared: &Shared, req: &Request, ns: &str, now: Instant) -> Result<Response, ApiError> {
    check_json_content_type(req)?;
    let dry = dry_run(req, None)?;
    let v = pod::decode(&req.body)?;
    let p = lock(shared).create(ns, v, CreateMode::Api, dry, now)?;
    shared.kubelet.notify_all();
    Ok(object(201, &p))
}

/// DeleteOptions from the body if there is one, else from the query (never both, as in
/// the apiserver's delete handler).
fn delete_options(req: &Request) -> Result<(DeleteOptions, bool), ApiError> {
    let mut opts = DeleteOptions::default();
    if !req.body.is_empty() {
        let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?;
        if !v.is_object() {
            return Err(ApiError::bad_request(
                "couldn't get version/kind; json parse error: DeleteOptions must be a JSON object",
            ));
        }
        let bad = |field: &str, want: &str| {
            ApiError::bad_request(format!(
                "json: cannot unmarshal into Go struct field DeleteOptions.{field} of type {want}"
            ))
        };
        opts.grace_period_seconds = match v.get("gracePeriodSeconds") {
            None | Some(Value::Null) => None,
            Some(g) => Some(
                g.as_i64()
                    .ok_or_else(|| bad("gracePeriodSeconds", "int64"))?,
            ),
        };
        if let Some(pre) = v.get("preconditions").filter(|p| !p.is_null()) {
            let s = |k: &str| -> Result<Option<String>, ApiError> {
                match pre.get(k) {
                    None | Some(Value::Null) => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(_) => Err(bad(&format!("preconditions.{k}"), "string")),
                }
            };
            opts.uid = s("uid")?;
            opts.resource_version = s("resourceVersion")?;
        }
        let dry = dry_run(req, Some(&v))?;
        return Ok((opts, dry));
    }
    if let Some(g) = req.param("gracePeriodSeconds").filter(|g| !g.is_empty()) {
        opts.grace_period_seconds = Some(g.parse().map_err(|_| {
            ApiError::bad_request(format!("strconv.ParseInt: parsing {g:?}: invalid syntax"))
        })?);
    }
    Ok((opts, dry_run(req, None)?))
}

fn delete(
    shared: &Shared,
    req: &Request,
    ns: &str,
    name: &str,
    now: Instant,
) -> Result<Response, ApiError> {
    let (opts, dry) = delete_options(req)?;
    let p = lock(shared).delete(ns, name, &opts, dry, now)?;
    shared.kubelet.notify_all();
    Ok(object(200, &p))
}

fn delete_collection(
    shared: &Shared,
    req: &Request,
    ns: &str,
    now: Instant,
) -> Result<Response, ApiError> {
    let (label, field) = parse_selectors(req)?;
    let (opts, dry) = delete_options(req)?;
    let mut store = lock(shared);
    let mut out = Vec::new();
    for p in store.keys_in(ns, now) {
        if !selected(&p, &label, &field) {
            continue;
        }
        match store.delete(ns, p.name(), &opts, dry, now) {
            Ok(d) => out.push(d),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let rv = store.rv();
    drop(store);
    shared.kubelet.notify_all();
    Ok(pod_list(rv, None, None, out))
}

fn sim(shared: &Shared, req: &Request, segs: &[&str], now: Instant) -> Result<Response, ApiError> {
    let post = req.method == "POST";
    match segs {
        ["stats"] if req.method == "GET" => {
            let mut s = lock(shared).stats(now);
            s.requests = shared.requests.load(Ordering::Relaxed);
            let body = serde_json::to_vec(&s).map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok(Response::json(200, body))
        }
        ["pods", ns] if post && !ns.is_empty() => {
            let v = pod::decode(&req.body)?;
            let p = lock(shared).create(ns, v, CreateMode::Seed, false, now)?;
            shared.kubelet.notify_all();
            Ok(object(201, &p))
        }
        ["pods", ns, name, "phase"] if post => {
            let v: Value = serde_json::from_slice(&req.body)
                .map_err(|e| ApiError::bad_request(format!("phase body: {e}")))?;
            let phase = v
                .get("phase")
                .and_then(Value::as_str)
                .and_then(Phase::parse)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "phase body: \"phase\" must be one of Pending, Running, Succeeded, Failed, Unknown",
                    )
                })?;
            let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
            let o = PhaseOverride {
                phase,
                exit_code: v.get("exitCode").and_then(Value::as_i64),
                reason: text("reason"),
                message: text("message"),
            };
            let p = lock(shared).set_phase(ns, name, &o, now)?;
            shared.kubelet.notify_all();
            Ok(object(200, &p))
        }
        ["stats"] | ["pods", _] | ["pods", _, _, "phase"] => Err(ApiError::method_not_allowed()),
        _ => Err(ApiError::path_not_found()),
    }
}
