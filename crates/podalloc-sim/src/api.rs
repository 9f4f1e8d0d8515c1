//! Routing and the request handlers: the pods API under `/api/v1`, a few unauthenticated
//! endpoints (`/healthz`, `/livez`, `/readyz`, `/version`) and the simulator's own
//! `/sim/...` side door.
//!
//! Deletes follow the apiserver's pod strategy: an unscheduled pod, or one already
//! Succeeded/Failed, is removed at once; otherwise `deletionTimestamp = now + grace` (grace
//! from the request, else `spec.terminationGracePeriodSeconds`) and the kubelet finishes
//! the job; a second delete can only shorten the grace period; grace 0 removes at once.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde_json::{json, Value};

use super::configmap;
use super::faults::{Fault, FaultRule};
use super::http::{Body, Request, Response};
use super::pod::{self, Phase};
use super::selector::{FieldSelector, LabelSelector};
use super::status::{self, ApiError};
use super::store::{
    decode_continue, encode_continue, CreateMode, DeleteOptions, PhaseOverride, Store, StoredPod,
    EXPIRED_CONTINUE,
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

/// What the connection does after a request.
pub(crate) enum Reply {
    /// Send the response.
    Send(Response),
    /// Close the connection without a response.
    Drop,
    /// Send the head (with the full Content-Length) and half the body, then close.
    Truncate(Response),
}

/// The user a bearer token authenticates as (the simulator has one token).
const TOKEN_USER: &str = "system:serviceaccount:default:podalloc";
/// Fake UIDs for the APF headers of a 429.
const FLOW_SCHEMA_UID: &str = "5b2c9f7e-3a41-4c1e-9d0a-6f8e2b7c4d13";
const PRIORITY_LEVEL_UID: &str = "a1d4e6f2-7b3c-4e59-8f01-2c9d5e7a3b64";

/// A routed API request.
#[derive(Clone, Copy, Debug)]
enum Route<'a> {
    PodList(Option<&'a str>),
    PodCreate(&'a str),
    PodDeleteCollection(&'a str),
    PodGet(&'a str, &'a str),
    PodDelete(&'a str, &'a str),
    PodPatch(&'a str, &'a str),
    CmList(Option<&'a str>),
    CmCreate(&'a str),
    CmGet(&'a str, &'a str),
    CmUpdate(&'a str, &'a str),
    CmDelete(&'a str, &'a str),
}

impl<'a> Route<'a> {
    /// The verb fault rules and `forbid` name.
    fn verb(self) -> &'static str {
        match self {
            Route::PodList(_) => "list",
            Route::PodCreate(_) => "create",
            Route::PodDeleteCollection(_) => "deletecollection",
            Route::PodGet(..) => "get",
            Route::PodDelete(..) => "delete",
            Route::PodPatch(..) => "patch",
            Route::CmList(_) => "cm-list",
            Route::CmCreate(_) => "cm-create",
            Route::CmGet(..) => "cm-get",
            Route::CmUpdate(..) => "cm-update",
            Route::CmDelete(..) => "cm-delete",
        }
    }

    /// The authorizer's view: (RBAC verb, resource, namespace, name).
    fn rbac(self) -> (&'static str, &'static str, Option<&'a str>, &'a str) {
        match self {
            Route::PodList(ns) => ("list", "pods", ns, ""),
            Route::PodCreate(ns) => ("create", "pods", Some(ns), ""),
            Route::PodDeleteCollection(ns) => ("deletecollection", "pods", Some(ns), ""),
            Route::PodGet(ns, n) => ("get", "pods", Some(ns), n),
            Route::PodDelete(ns, n) => ("delete", "pods", Some(ns), n),
            Route::PodPatch(ns, n) => ("patch", "pods", Some(ns), n),
            Route::CmList(ns) => ("list", "configmaps", ns, ""),
            Route::CmCreate(ns) => ("create", "configmaps", Some(ns), ""),
            Route::CmGet(ns, n) => ("get", "configmaps", Some(ns), n),
            Route::CmUpdate(ns, n) => ("update", "configmaps", Some(ns), n),
            Route::CmDelete(ns, n) => ("delete", "configmaps", Some(ns), n),
        }
    }
}

fn route<'a>(method: &str, segs: &[&'a str]) -> Result<Route<'a>, ApiError> {
    let bad_method = || Err(ApiError::method_not_allowed());
    match *segs {
        ["api", "v1", "namespaces", ns, "pods"] if !ns.is_empty() => match method {
            "GET" => Ok(Route::PodList(Some(ns))),
            "POST" => Ok(Route::PodCreate(ns)),
            "DELETE" => Ok(Route::PodDeleteCollection(ns)),
            _ => bad_method(),
        },
        ["api", "v1", "namespaces", ns, "pods", name] if !ns.is_empty() && !name.is_empty() => {
            match method {
                "GET" => Ok(Route::PodGet(ns, name)),
                "DELETE" => Ok(Route::PodDelete(ns, name)),
                "PATCH" => Ok(Route::PodPatch(ns, name)),
                _ => bad_method(),
            }
        }
        ["api", "v1", "pods"] => match method {
            "GET" => Ok(Route::PodList(None)),
            _ => bad_method(),
        },
        ["api", "v1", "namespaces", ns, "configmaps"] if !ns.is_empty() => match method {
            "GET" => Ok(Route::CmList(Some(ns))),
            "POST" => Ok(Route::CmCreate(ns)),
            _ => bad_method(),
        },
        ["api", "v1", "namespaces", ns, "configmaps", name]
            if !ns.is_empty() && !name.is_empty() =>
        {
            match method {
                "GET" => Ok(Route::CmGet(ns, name)),
                "PUT" => Ok(Route::CmUpdate(ns, name)),
                "DELETE" => Ok(Route::CmDelete(ns, name)),
                _ => bad_method(),
            }
        }
        ["api", "v1", "configmaps"] => match method {
            "GET" => Ok(Route::CmList(None)),
            _ => bad_method(),
        },
        _ => Err(ApiError::path_not_found()),
    }
}

/// The 429 of API Priority and Fairness: plain text, `Retry-After: 1`.
fn apf_too_many_requests() -> Response {
    let mut r = Response::text(429, "Too many requests, please try again later.\n");
    r.headers.push(("Retry-After", "1".to_string()));
    r.headers
        .push(("X-Content-Type-Options", "nosniff".to_string()));
    r.headers.push((
        "X-Kubernetes-Pf-Flowschema-Uid",
        FLOW_SCHEMA_UID.to_string(),
    ));
    r.headers.push((
        "X-Kubernetes-Pf-Prioritylevel-Uid",
        PRIORITY_LEVEL_UID.to_string(),
    ));
    r
}

/// The request timeout filter's 504: a bare `metav1.Status` encoded by `json.Encoder`
/// into a response without a Content-Type (so Go sniffs `text/plain`).
fn timeout_response() -> Response {
    Response {
        status: 504,
        content_type: "text/plain; charset=utf-8",
        headers: Vec::new(),
        body: Body::Bytes(
            ApiError::timeout("request did not complete within the allotted timeout")
                .to_bare_json_line(),
        ),
    }
}

/// The answer of a fault that replaces the handler, if `f` is one. `Reply::Drop` for
/// `reset`.
fn fault_reply(f: &Fault, req: &Request) -> Option<Reply> {
    let resp = match f {
        Fault::TooManyRequestsText => apf_too_many_requests(),
        Fault::TooManyRequestsStatus {
            retry_after_seconds,
        } => error_response(ApiError::too_many_requests(
            "storage is (re)initializing",
            (*retry_after_seconds).max(1),
        )),
        Fault::InternalError => {
            error_response(ApiError::internal_error("etcdserver: leader changed"))
        }
        Fault::ServiceUnavailable => {
            let mut r = error_response(ApiError::service_unavailable("apiserver is shutting down"));
            r.headers.push(("Retry-After", "1".to_string()));
            r
        }
        Fault::Timeout => timeout_response(),
        Fault::Reset => return Some(Reply::Drop),
        Fault::Expired => {
            let c = decode_continue(req.param("continue").unwrap_or("")).ok()?;
            error_response(ApiError::expired(
                EXPIRED_CONTINUE,
                Some(encode_continue(-1, &c.start)),
            ))
        }
        Fault::TimeoutAfterWrite | Fault::Delay(_) | Fault::LostResponse | Fault::Truncate => {
            return None
        }
    };
    Some(Reply::Send(resp))
}

/// The RBAC authorizer's 403 (`ForbiddenStatusError`).
fn rbac_denied(user: &str, r: Route<'_>) -> ApiError {
    let (verb, resource, ns, name) = r.rbac();
    let scope = match ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    ApiError::forbidden(
        resource,
        name,
        &format!("User \"{user}\" cannot {verb} resource \"{resource}\" in API group \"\" {scope}"),
    )
}

/// Handles one request. `client_user` is the common name of a verified client
/// certificate (it authenticates the request without a bearer token).
pub(crate) fn handle(shared: &Shared, req: &Request, client_user: Option<&str>) -> Reply {
    let Some(segs) = req.segments() else {
        let reply = Reply::Send(error_response(ApiError::bad_request(
            "invalid URL escape in path",
        )));
        shared.requests.fetch_add(1, Ordering::Relaxed);
        record(shared, req, None, None, &reply);
        return reply;
    };
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    if segs.first() == Some(&"sim") {
        let now = Instant::now();
        return Reply::Send(sim(shared, req, &segs[1..], now).unwrap_or_else(error_response));
    }
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let mut verb = None;
    let mut fault = None;
    let reply = handle_api(shared, req, &segs, client_user, &mut verb, &mut fault);
    record(shared, req, verb, fault.as_ref(), &reply);
    reply
}

fn handle_api(
    shared: &Shared,
    req: &Request,
    segs: &[&str],
    client_user: Option<&str>,
    verb_out: &mut Option<&'static str>,
    fault_out: &mut Option<Fault>,
) -> Reply {
    let send = |r: Result<Response, ApiError>| Reply::Send(r.unwrap_or_else(error_response));
    let get = req.method == "GET";
    match segs {
        ["healthz"] | ["livez"] | ["readyz"] if get => return Reply::Send(Response::text(200, "ok")),
        ["version"] if get => {
            return Reply::Send(Response::json(
                200,
                br#"{"major":"1","minor":"34","gitVersion":"v1.34.0-podalloc-sim","gitCommit":"","gitTreeState":"clean","buildDate":"","goVersion":"","compiler":"gc","platform":"linux/amd64"}"#.to_vec(),
            ))
        }
        _ => {}
    }
    if segs.first() == Some(&"api") && !shared.latency.is_zero() {
        std::thread::sleep(shared.latency);
    }
    let user = match client_user {
        Some(u) => u,
        None if authorized(shared.token.as_deref(), req) => TOKEN_USER,
        None => return send(Err(ApiError::unauthorized())),
    };
    let r = match route(&req.method, segs) {
        Ok(r) => r,
        Err(e) => return send(Err(e)),
    };
    let verb = r.verb();
    *verb_out = Some(verb);
    let has_continue = matches!(r, Route::PodList(_))
        && req
            .param("continue")
            .is_some_and(|t| !t.is_empty() && decode_continue(t).is_ok());
    let fault = relock(&shared.faults).pick(verb, has_continue);
    *fault_out = fault.clone();
    if let Some(f) = &fault {
        if let Some(reply) = fault_reply(f, req) {
            return reply;
        }
        if let Fault::Delay(d) = f {
            std::thread::sleep(*d);
        }
    }
    if shared.forbid.iter().any(|v| v == verb) {
        return send(Err(rbac_denied(user, r)));
    }
    let now = Instant::now();
    let result = match r {
        Route::PodList(ns) => list(shared, req, ns, now),
        Route::PodCreate(ns) => create(shared, req, ns, now),
        Route::PodDeleteCollection(ns) => delete_collection(shared, req, ns, now),
        Route::PodGet(ns, name) => lock(shared).get(ns, name, now).map(|p| object(200, &p)),
        Route::PodDelete(ns, name) => delete(shared, req, ns, name, now),
        Route::PodPatch(ns, name) => patch_pod(shared, req, ns, name, now),
        Route::CmList(ns) => cm_list(shared, req, ns),
        Route::CmCreate(ns) => cm_create(shared, req, ns, now),
        Route::CmGet(ns, name) => lock(shared)
            .cm_get(ns, name)
            .map(|v| Response::json(200, configmap::object_json(&v))),
        Route::CmUpdate(ns, name) => cm_update(shared, req, ns, name),
        Route::CmDelete(ns, name) => cm_delete(shared, req, ns, name),
    };
    let resp = result.unwrap_or_else(error_response);
    match fault {
        Some(Fault::LostResponse) => Reply::Drop,
        Some(Fault::Truncate) => Reply::Truncate(resp),
        Some(Fault::TimeoutAfterWrite) => Reply::Send(timeout_response()),
        _ => Reply::Send(resp),
    }
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn record(
    shared: &Shared,
    req: &Request,
    verb: Option<&'static str>,
    fault: Option<&Fault>,
    reply: &Reply,
) {
    let status = match reply {
        Reply::Send(r) | Reply::Truncate(r) => Some(r.status),
        Reply::Drop => None,
    };
    let fault = fault.map(ToString::to_string);
    relock(&shared.log).push(req, verb, status, fault);
}

fn labels_of(v: &Value) -> BTreeMap<String, String> {
    v.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn cm_list(shared: &Shared, req: &Request, ns: Option<&str>) -> Result<Response, ApiError> {
    if matches!(req.param("watch"), Some("true" | "1")) {
        return Err(ApiError::bad_request(
            "watch is not supported by the podalloc simulator",
        ));
    }
    let label = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let field = FieldSelector::parse_for_metadata(req.param("fieldSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let (rv, items) = lock(shared).cm_list(ns);
    let mut body = format!(
        r#"{{"kind":"ConfigMapList","apiVersion":"v1","metadata":{{"resourceVersion":"{rv}"}},"items":["#
    );
    let mut first = true;
    for item in &items {
        let meta_str = |k: &str| {
            item.pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let fields_match = field.matches(|f| match f {
            "metadata.name" => meta_str("name"),
            "metadata.namespace" => meta_str("namespace"),
            _ => "",
        });
        if !fields_match || !label.matches(&labels_of(item)) {
            continue;
        }
        if !first {
            body.push(',');
        }
        first = false;
        body.push_str(&serde_json::to_string(item).unwrap_or_else(|_| "{}".into()));
    }
    body.push_str("]}");
    Ok(Response::json(200, body.into_bytes()))
}

fn cm_create(shared: &Shared, req: &Request, ns: &str, now: Instant) -> Result<Response, ApiError> {
    check_json_content_type(req)?;
    let dry = dry_run(req, None)?;
    let v = configmap::decode(&req.body)?;
    let out = lock(shared).cm_create(ns, v, dry, now)?;
    Ok(Response::json(201, configmap::object_json(&out)))
}

fn cm_update(shared: &Shared, req: &Request, ns: &str, name: &str) -> Result<Response, ApiError> {
    check_json_content_type(req)?;
    let dry = dry_run(req, None)?;
    let v = configmap::decode(&req.body)?;
    let out = lock(shared).cm_update(ns, name, v, dry)?;
    Ok(Response::json(200, configmap::object_json(&out)))
}

fn cm_delete(shared: &Shared, req: &Request, ns: &str, name: &str) -> Result<Response, ApiError> {
    let (opts, dry) = delete_options(req)?;
    let uid = lock(shared).cm_delete(ns, name, &opts, dry)?;
    Ok(Response::json(
        200,
        status::delete_success("configmaps", name, &uid),
    ))
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

/// `PATCH` of a pod: a JSON merge patch (see the `patch` module).
fn patch_pod(
    shared: &Shared,
    req: &Request,
    ns: &str,
    name: &str,
    now: Instant,
) -> Result<Response, ApiError> {
    super::patch::check_patch_type(req.header("content-type").unwrap_or(""))?;
    let patch: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let p = lock(shared).patch(ns, name, &patch, now)?;
    shared.kubelet.notify_all();
    Ok(object(200, &p))
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
            let s = super::collect_stats(shared, now);
            let body = serde_json::to_vec(&s).map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok(Response::json(200, body))
        }
        ["faults"] if req.method == "GET" => Ok(faults_json(shared)),
        ["faults"] if post => set_faults(shared, &req.body),
        ["quota"] if req.method == "GET" => Ok(quota_json(lock(shared).pod_quota())),
        ["quota"] if post => set_quota(shared, &req.body),
        ["log"] if req.method == "GET" => Ok(Response {
            status: 200,
            content_type: "application/x-ndjson",
            headers: Vec::new(),
            body: Body::Bytes(relock(&shared.log).render().into_bytes()),
        }),
        ["pods", ns] if post && !ns.is_empty() => {
            let v = pod::decode(&req.body)?;
            let p = lock(shared).create(ns, v, CreateMode::Seed, false, now)?;
            shared.kubelet.notify_all();
            Ok(object(201, &p))
        }
        ["pods", ns, name, "phase"] if post => {
            let o = phase_override(&req.body)?;
            let p = lock(shared).set_phase(ns, name, &o, now)?;
            shared.kubelet.notify_all();
            Ok(object(200, &p))
        }
        ["stats"] | ["pods", _] | ["pods", _, _, "phase"] | ["faults"] | ["quota"] | ["log"] => {
            Err(ApiError::method_not_allowed())
        }
        _ => Err(ApiError::path_not_found()),
    }
}

/// `POST /sim/faults`: a JSON list of rule strings replaces the fault rules.
fn set_faults(shared: &Shared, body: &[u8]) -> Result<Response, ApiError> {
    let texts: Vec<String> = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "faults body: expected a JSON list of rule strings such as [\"create:lost-response@2,3\"]: {e}"
        ))
    })?;
    let rules = texts
        .iter()
        .map(|t| FaultRule::parse(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ApiError::bad_request)?;
    relock(&shared.faults).replace(rules);
    Ok(faults_json(shared))
}

/// `POST /sim/quota`: `{"pods": N}` sets the pods quota, `{"pods": null}` lifts it.
fn set_quota(shared: &Shared, body: &[u8]) -> Result<Response, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("quota body: {e}")))?;
    let pods = match v.get("pods") {
        Some(Value::Null) => None,
        Some(n) => Some(n.as_u64().ok_or_else(|| {
            ApiError::bad_request(
                "quota body: \"pods\" must be a whole number or null, e.g. {\"pods\": 10}",
            )
        })?),
        None => {
            return Err(ApiError::bad_request(
                "quota body: expected {\"pods\": N} or {\"pods\": null}",
            ))
        }
    };
    lock(shared).set_pod_quota(pods);
    Ok(quota_json(pods))
}

/// The body of `POST /sim/pods/{ns}/{name}/phase`: `{"phase": …, "exitCode": …, "reason":
/// …, "message": …}`, the phase required.
fn phase_override(body: &[u8]) -> Result<PhaseOverride, ApiError> {
    let v: Value = serde_json::from_slice(body)
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
    Ok(PhaseOverride {
        phase,
        exit_code: v.get("exitCode").and_then(Value::as_i64),
        reason: text("reason"),
        message: text("message"),
    })
}

fn faults_json(shared: &Shared) -> Response {
    let f = relock(&shared.faults);
    let rules: Vec<String> = f.rules().iter().map(ToString::to_string).collect();
    let body = json!({"faults": rules, "injected": f.injected()});
    Response::json(200, body.to_string().into_bytes())
}

fn quota_json(pods: Option<u64>) -> Response {
    Response::json(200, json!({ "pods": pods }).to_string().into_bytes())
}
