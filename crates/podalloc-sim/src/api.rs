//! The request path: authentication, the cut-off of `SimServer::cut_off`, discovery, the
//! request's `RequestInfo` (`request.rs`), fault rules, RBAC's `forbid`, NamespaceLifecycle
//! admission, then the handler: the pods' own, the namespaces', or the registry's by verb
//! for every other kind. Also a few unauthenticated endpoints (`/healthz`, `/livez`,
//! `/readyz`, `/version`); `/sim/...` goes to the side door (`sidedoor.rs`).
//!
//! Deletes follow the apiserver's pod strategy: an unscheduled pod, or one already
//! Succeeded/Failed, is removed at once; otherwise `deletionTimestamp = now + grace` (grace
//! from the request, else `spec.terminationGracePeriodSeconds`) and the kubelet finishes
//! the job; a second delete can only shorten the grace period; grace 0 removes at once.
//! A pod with `metadata.finalizers` is not removed but kept, with `deletionTimestamp` and
//! `deletionGracePeriodSeconds: 0` (its containers stopped), until a patch empties them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::discovery;
use super::faults::Fault;
use super::http::{Body, Request, Response};
use super::kinds::{configmap, event, executorset, lease};
use super::objpatch;
use super::pod;
use super::registry::{self, DeleteOptions};
use super::request::RequestInfo;
use super::resources::{of, Kind, Resource, Verb};
use super::respond::{error_for, error_response, object_for, pod_list_for, pod_table_of};
use super::schema;
use super::selector::{FieldSelector, LabelSelector};
use super::shared::Shared;
use super::sidedoor;
use super::status::{self, ApiError};
use super::store::{
    decode_continue, encode_continue, CreateMode, Store, StoredPod, EXPIRED_CONTINUE,
};
use super::watch;

fn lock(shared: &Shared) -> MutexGuard<'_, Store> {
    shared.store.lock().unwrap_or_else(|e| e.into_inner())
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
    /// Send the head at once, then the body one byte per interval.
    Trickle(Response, Duration),
}

/// The user a bearer token authenticates as (the simulator has one token).
const TOKEN_USER: &str = "system:serviceaccount:default:podalloc";
/// Fake UIDs for the APF headers of a 429.
const FLOW_SCHEMA_UID: &str = "5b2c9f7e-3a41-4c1e-9d0a-6f8e2b7c4d13";
const PRIORITY_LEVEL_UID: &str = "a1d4e6f2-7b3c-4e59-8f01-2c9d5e7a3b64";

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
        } => error_for(req, ApiError::too_many_requests(
            "storage is (re)initializing",
            (*retry_after_seconds).max(1),
        )),
        Fault::InternalError => {
            error_for(req, ApiError::internal_error("etcdserver: leader changed"))
        }
        Fault::ServiceUnavailable => {
            let mut r = error_for(req, ApiError::service_unavailable("apiserver is shutting down"));
            r.headers.push(("Retry-After", "1".to_string()));
            r
        }
        Fault::Timeout => timeout_response(),
        Fault::Reset => return Some(Reply::Drop),
        Fault::Expired => {
            let c = decode_continue(req.param("continue").unwrap_or("")).ok()?;
            error_for(req, ApiError::expired(
                EXPIRED_CONTINUE,
                Some(encode_continue(-1, &c.start)),
            ))
        }
        Fault::Html => Response {
            status: 200,
            content_type: "text/html; charset=utf-8",
            headers: Vec::new(),
            body: Body::Bytes(PROXY_PAGE.as_bytes().to_vec()),
        },
        Fault::Redirect => Response {
            status: 307,
            content_type: "text/html; charset=utf-8",
            headers: vec![(
                "Location",
                "https://login.example.com/oauth2/start?rd=%2Fapi%2Fv1".to_string(),
            )],
            body: Body::Bytes(
                b"<a href=\"https://login.example.com/oauth2/start?rd=%2Fapi%2Fv1\">Temporary Redirect</a>.\n"
                    .to_vec(),
            ),
        },
        Fault::TimeoutAfterWrite
        | Fault::Delay(_)
        | Fault::LostResponse
        | Fault::Truncate
        | Fault::Garbage
        | Fault::NoKind
        | Fault::Trickle(_) => return None,
    };
    Some(Reply::Send(resp))
}

/// The RBAC authorizer's 403 (`ForbiddenStatusError`, the message of
/// `rbac.RBACAuthorizer.Authorize`'s denial).
fn rbac_denied(user: &str, r: &RequestInfo<'_>) -> ApiError {
    let scope = match r.ns {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_string(),
    };
    let (verb, res) = (r.verb.as_str(), r.res);
    ApiError::forbidden(
        &res.qualified(),
        r.name.unwrap_or(""),
        &format!(
            "User \"{user}\" cannot {verb} resource \"{}\" in API group \"{}\" {scope}",
            r.rbac_resource(),
            res.group
        ),
    )
}

/// Handles one request. `client_user` is the common name of a verified client
/// certificate (it authenticates the request without a bearer token).
pub(crate) fn handle(shared: &Shared, req: &Request, client_user: Option<&str>) -> Reply {
    let Some(segs) = req.segments() else {
        let reply = Reply::Send(error_for(
            req,
            ApiError::bad_request("invalid URL escape in path"),
        ));
        shared.requests.fetch_add(1, Ordering::Relaxed);
        record(shared, req, None, None, None, &reply);
        return reply;
    };
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    if segs.first() == Some(&"sim") {
        let now = Instant::now();
        return Reply::Send(
            sidedoor::handle(shared, req, &segs[1..], now).unwrap_or_else(error_response),
        );
    }
    shared.requests.fetch_add(1, Ordering::Relaxed);
    let mut verb = None;
    let mut fault = None;
    let user = client_user.or_else(|| token_user(shared, req));
    let reply = handle_api(shared, req, &segs, user, &mut verb, &mut fault);
    let logged_user = user.filter(|_| verb.is_some() || fault.is_some());
    record(
        shared,
        req,
        verb.as_deref(),
        logged_user,
        fault.as_ref(),
        &reply,
    );
    reply
}

/// The user a bearer token authenticates as: the server's token, or one of
/// `SimOptions::users`.
fn token_user<'a>(shared: &'a Shared, req: &Request) -> Option<&'a str> {
    if authorized(shared.token.as_deref(), req) {
        return Some(TOKEN_USER);
    }
    shared
        .users
        .iter()
        .find(|(token, _)| authorized(Some(token), req))
        .map(|(_, user)| user.as_str())
}

/// A user cut off by `SimServer::cut_off`: waits until the cut ends (or the server stops)
/// and answers the request timeout's 504, having done nothing. `None` when not cut off.
fn cut_off_reply(shared: &Shared, user: &str) -> Option<Reply> {
    let until = *relock(&shared.cuts).get(user)?;
    if Instant::now() >= until {
        return None;
    }
    while Instant::now() < until && !shared.stopping.load(Ordering::Relaxed) {
        std::thread::sleep((until - Instant::now()).min(std::time::Duration::from_millis(50)));
    }
    Some(Reply::Send(timeout_response()))
}

fn handle_api(
    shared: &Shared,
    req: &Request,
    segs: &[&str],
    user: Option<&str>,
    verb_out: &mut Option<String>,
    fault_out: &mut Option<Fault>,
) -> Reply {
    let send = |r: Result<Response, ApiError>| Reply::Send(r.unwrap_or_else(|e| error_for(req, e)));
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
    let Some(user) = user else {
        return send(Err(ApiError::unauthorized()));
    };
    if let Some(reply) = cut_off_reply(shared, user) {
        *fault_out = Some(Fault::Timeout);
        return reply;
    }
    if let Some(resp) = discovery::discovery(req, segs).or_else(|| discovery::openapi(req, segs)) {
        return Reply::Send(resp);
    }
    let mut r = match RequestInfo::parse(&req.method, segs) {
        Ok(r) => r,
        Err(e) => return send(Err(e)),
    };
    // A list with `watch=true` is the verb `watch` (RBAC, fault rules, the request log), as
    // kube-apiserver's RequestInfo says, where the kind serves it; elsewhere the list
    // handler refuses it with a 400.
    if r.verb == Verb::List
        && matches!(req.param("watch"), Some("true" | "1"))
        && r.res.serves(Verb::Watch)
    {
        r.verb = Verb::Watch;
    }
    let verb = r.fault_verb();
    *verb_out = Some(verb.clone());
    let has_continue = (r.res.id, r.verb) == (Kind::Pod, Verb::List)
        && req
            .param("continue")
            .is_some_and(|t| !t.is_empty() && decode_continue(t).is_ok());
    let fault = relock(&shared.faults).pick(&verb, has_continue);
    *fault_out = fault.clone();
    if let Some(f) = &fault {
        if let Some(reply) = fault_reply(f, req) {
            return reply;
        }
        if let Fault::Delay(d) = f {
            // In steps, so that stopping the server does not wait out a long delay.
            let until = Instant::now() + *d;
            while !shared.stopping.load(Ordering::SeqCst) {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(50)));
            }
        }
    }
    if shared.forbid.contains(&verb) {
        return send(Err(rbac_denied(user, &r)));
    }
    // The NamespaceLifecycle admission plugin: no creates in a namespace that does not exist.
    if let (Verb::Create, Some(ns)) = (r.verb, r.ns) {
        if !shared.namespace_exists(ns) {
            return send(Err(ApiError::namespace_not_found(ns)));
        }
    }
    let call = Call {
        shared,
        req,
        r: &r,
        now: Instant::now(),
    };
    let result = dispatch(&call);
    reply_with(result.unwrap_or_else(|e| error_for(req, e)), fault)
}

/// The reply carrying `resp`, as the fault that applies after the handler (if any) changes it.
fn reply_with(resp: Response, fault: Option<Fault>) -> Reply {
    // A watch's body never ends: the faults that rewrite or cut a body leave it alone.
    let watch = matches!(resp.body, Body::Watch(_));
    let fault = fault.filter(|f| {
        !(watch
            && matches!(
                f,
                Fault::Truncate | Fault::Trickle(_) | Fault::Garbage | Fault::NoKind
            ))
    });
    match fault {
        Some(Fault::LostResponse) => Reply::Drop,
        Some(Fault::Truncate) => Reply::Truncate(resp),
        Some(Fault::Trickle(d)) => Reply::Trickle(resp, d),
        Some(Fault::Garbage) => Reply::Send(Response {
            body: Body::Bytes(b"\x1f\x8b\x08\x00garbage\xff\xfe not json {".to_vec()),
            ..resp
        }),
        Some(Fault::NoKind) => Reply::Send(without_kind(resp)),
        Some(Fault::TimeoutAfterWrite) => Reply::Send(timeout_response()),
        _ => Reply::Send(resp),
    }
}

/// An authenticated, authorized request as its handler takes it: the server's state, the
/// request, what [`RequestInfo::parse`] made of it, and when it is served.
struct Call<'a> {
    shared: &'a Shared,
    req: &'a Request,
    r: &'a RequestInfo<'a>,
    now: Instant,
}

impl Call<'_> {
    /// The namespace: `RequestInfo::parse` gives every namespaced verb but list one.
    fn ns(&self) -> &str {
        self.r.ns.unwrap_or("")
    }

    /// The object's name: `RequestInfo::parse` gives every object verb one.
    fn name(&self) -> &str {
        self.r.name.unwrap_or("")
    }
}

/// Runs the handler of an authenticated, authorized request: pods and namespaces have
/// their own; every other kind (ConfigMaps, Leases, Events) is the registry's, by verb.
fn dispatch(c: &Call<'_>) -> Result<Response, ApiError> {
    let (shared, req, r) = (c.shared, c.req, c.r);
    let (ns, name) = (c.ns(), c.name());
    match (r.res.id, r.verb) {
        (Kind::Pod, Verb::List | Verb::Watch) => list(c),
        (Kind::Pod, Verb::Create) if r.sub.is_some() => evict(c),
        (Kind::Pod, Verb::Create) => create(c),
        (Kind::Pod, Verb::DeleteCollection) => delete_collection(c),
        // A one-row Table for kubectl's `get pod NAME`, as the apiserver converts one object.
        (Kind::Pod, Verb::Get) => lock(shared).get(ns, name, c.now).map(|p| {
            if discovery::wants_table(req) {
                pod_table_of(p.json.as_bytes())
            } else {
                object_for(req, 200, &p)
            }
        }),
        (Kind::Pod, Verb::Delete) => delete(c),
        (Kind::Pod, Verb::Patch) => patch_pod(c),
        (Kind::Namespace, Verb::List) => Ok(ns_list(shared, req)),
        (Kind::Namespace, Verb::Get) => ns_get(shared, name),
        (Kind::Namespace, Verb::Create) => ns_create(shared, req),
        // Every other kind is the registry's.
        _ => registry_dispatch(c),
    }
}

/// The handler of a kind the registry stores, by subresource and verb: the object itself,
/// its `status` (read and written as the object, the status strategy deciding what a write
/// keeps) or its `scale` (`scale_dispatch`).
fn registry_dispatch(c: &Call<'_>) -> Result<Response, ApiError> {
    let (shared, req, r) = (c.shared, c.req, c.r);
    let (res, ns, name) = (r.res, c.ns(), c.name());
    let stored = |code, v: &Value| Response::json(code, registry::object_json(res, v));
    let part = match r.sub.map(|s| s.name) {
        None => registry::Part::Main,
        Some("status") => registry::Part::Status,
        Some(_) => return scale_dispatch(c),
    };
    match r.verb {
        Verb::List => reg_list(shared, req, res, r.ns),
        Verb::Get => {
            let v = lock(shared).reg.get(res, ns, name)?;
            if res.id == Kind::ExecutorSet && discovery::wants_table(req) {
                let now = std::time::SystemTime::now();
                let rv = v["metadata"]["resourceVersion"].as_str().unwrap_or("0");
                let rv = rv.parse().unwrap_or(0);
                return Ok(discovery::executorset_table(rv, &[v], now));
            }
            Ok(stored(200, &v))
        }
        Verb::Create => {
            let unknown = registry_field_validation(req, res)?;
            let (v, dry) = write_body(req, res)?;
            let v = lock(shared).reg.create(res, ns, v, dry, c.now)?;
            Ok(warned(stored(201, &v), &unknown))
        }
        Verb::Update => {
            let unknown = registry_field_validation(req, res)?;
            let (v, dry) = write_body(req, res)?;
            let v = lock(shared).reg.update(res, ns, name, v, dry, part)?;
            Ok(warned(stored(200, &v), &unknown))
        }
        Verb::Patch => {
            let t = patch_type_of(req, res)?;
            let dry = dry_run(req, None)?;
            let decode = decoder(res.id);
            let patched = |served: &Value| {
                let new = objpatch::apply(t, served, &req.body)?;
                decode(&serde_json::to_vec(&new).unwrap_or_default())
            };
            let v = lock(shared).reg.patch(res, ns, name, patched, dry, part)?;
            Ok(stored(200, &v))
        }
        Verb::Delete => {
            let (opts, dry) = delete_options(req)?;
            let uid = lock(shared).reg.delete(res, ns, name, &opts, dry)?;
            let body = status::delete_success(res.group, res.plural, name, &uid);
            Ok(Response::json(200, body))
        }
        // The table lists no other verb, so `RequestInfo::parse` let none through.
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// The patch type of a PATCH of `res` (a custom resource refuses strategic merge patches).
fn patch_type_of(req: &Request, res: &Resource) -> Result<objpatch::PatchType, ApiError> {
    let custom = res.id == Kind::ExecutorSet;
    objpatch::patch_type(req.header("content-type").unwrap_or(""), custom)
}

/// `…/scale` of an ExecutorSet (`kinds/executorset.rs`): GET reads the `autoscaling/v1`
/// Scale (500 when the object has no `.spec.replicas`); PUT and PATCH write its
/// `spec.replicas` into the object's, through the object's own update (its validation, its
/// generation), conditional on the Scale's resourceVersion when it names one.
fn scale_dispatch(c: &Call<'_>) -> Result<Response, ApiError> {
    use super::kinds::executorset::{no_spec_replicas, scale_of, with_scale, NO_REPLICAS};
    let (shared, req, r) = (c.shared, c.req, c.r);
    let (res, ns, name) = (r.res, c.ns(), c.name());
    let answer = |v: &Value| Response::json(200, scale_of(ns, v, 0).to_string().into_bytes());
    let decode_scale = |bytes: &[u8]| -> Result<Value, ApiError> {
        let v = pod::parse_body(bytes)?;
        Ok(Value::Object(pod::object_of(v, "Scale", "autoscaling/v1")?))
    };
    match r.verb {
        Verb::Get => {
            let v = lock(shared).reg.get(res, ns, name)?;
            if v.pointer("/spec/replicas").is_none() {
                return Err(no_spec_replicas());
            }
            Ok(answer(&v))
        }
        Verb::Update => {
            check_json_content_type(req)?;
            let dry = dry_run(req, None)?;
            let scale = decode_scale(&req.body)?;
            registry::check_update_target(&scale, ns, name)?;
            let mut store = lock(shared);
            let new = with_scale(&store.reg.get(res, ns, name)?, &scale)?;
            let v = store
                .reg
                .update(res, ns, name, new, dry, registry::Part::Main)?;
            Ok(answer(&v))
        }
        Verb::Patch => {
            let t = patch_type_of(req, res)?;
            let dry = dry_run(req, None)?;
            let patched = |served: &Value| {
                let scale = scale_of(ns, served, NO_REPLICAS);
                let new = objpatch::apply(t, &scale, &req.body)?;
                let new = decode_scale(&serde_json::to_vec(&new).unwrap_or_default())?;
                let mut old = served.clone();
                if let Some(m) = old.as_object_mut() {
                    m.remove("kind");
                    m.remove("apiVersion");
                }
                with_scale(&old, &new)
            };
            let v = (lock(shared).reg).patch(res, ns, name, patched, dry, registry::Part::Main)?;
            Ok(answer(&v))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// What an authenticating proxy in front of the apiserver answers (fault `html`).
const PROXY_PAGE: &str = "<!DOCTYPE html>\n<html><head><title>Sign in</title></head>\
<body><h1>Sign in to continue</h1><form action=\"/oauth2/start\"></form></body></html>\n";

/// The response with `kind` and `apiVersion` taken out of its JSON object, or its Protobuf
/// envelope's `typeMeta` emptied (fault `no-kind`); other bodies unchanged.
fn without_kind(resp: Response) -> Response {
    let bytes = match resp.body {
        Body::Bytes(b) => b,
        Body::Stream(f) => {
            let mut b = Vec::new();
            if f(&mut b).is_err() {
                return Response {
                    body: Body::Bytes(b),
                    ..resp
                };
            }
            b
        }
        // Its events keep their objects whole.
        Body::Watch(_) => return resp,
    };
    if let Some(b) = super::protobuf::without_kind(&bytes) {
        return Response {
            body: Body::Bytes(b),
            ..resp
        };
    }
    let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(&bytes) else {
        return Response {
            body: Body::Bytes(bytes),
            ..resp
        };
    };
    m.remove("kind");
    m.remove("apiVersion");
    Response {
        body: Body::Bytes(Value::Object(m).to_string().into_bytes()),
        ..resp
    }
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn record(
    shared: &Shared,
    req: &Request,
    verb: Option<&str>,
    user: Option<&str>,
    fault: Option<&Fault>,
    reply: &Reply,
) {
    let status = match reply {
        Reply::Send(r) | Reply::Truncate(r) | Reply::Trickle(r, _) => Some(r.status),
        Reply::Drop => None,
    };
    let fault = fault.map(ToString::to_string);
    relock(&shared.log).push(req, verb, user, status, fault);
}

/// The decoder of a kind the registry stores (its `kind`/`apiVersion` checks and field
/// types), before the registry sees the object.
fn decoder(id: Kind) -> fn(&[u8]) -> Result<Value, ApiError> {
    match id {
        Kind::ConfigMap => configmap::decode,
        Kind::Lease => lease::decode,
        Kind::ExecutorSet => executorset::decode,
        _ => event::decode,
    }
}

/// A 400 for `?watch=true`, which the simulator does not serve.
fn refuse_watch(req: &Request) -> Result<(), ApiError> {
    match req.param("watch") {
        Some("true" | "1") => Err(ApiError::bad_request(
            "watch is not supported by the podalloc simulator",
        )),
        _ => Ok(()),
    }
}

/// `GET` of a collection of a registry kind, with label and field selectors (the fields of
/// its row in the kind table); a `Table` of Events for kubectl.
fn reg_list(
    shared: &Shared,
    req: &Request,
    res: &Resource,
    ns: Option<&str>,
) -> Result<Response, ApiError> {
    refuse_watch(req)?;
    let label = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let field = FieldSelector::parse(req.param("fieldSelector").unwrap_or(""), res.fields)
        .map_err(ApiError::bad_request)?;
    let (rv, items) = lock(shared).reg.list(res, ns, &label, &field);
    if discovery::wants_table(req) {
        let now = std::time::SystemTime::now();
        match res.id {
            Kind::Event => return Ok(discovery::event_table(rv, &items, now)),
            Kind::ExecutorSet => return Ok(discovery::executorset_table(rv, &items, now)),
            _ => {}
        }
    }
    Ok(Response::json(200, registry::list_json(res, rv, &items)))
}

/// The body of a create or update (PUT) of a kind the registry stores, decoded by the
/// kind's decoder, and whether it is a dry run. Errors: 415, 400.
fn write_body(req: &Request, res: &Resource) -> Result<(Value, bool), ApiError> {
    check_json_content_type(req)?;
    let dry = dry_run(req, None)?;
    Ok((decoder(res.id)(&req.body)?, dry))
}

fn ns_list(shared: &Shared, req: &Request) -> Response {
    let (names, rv) = {
        let store = lock(shared);
        (store.reg.namespace_names(), store.rv())
    };
    if discovery::wants_table(req) {
        return discovery::namespace_table(rv, &names);
    }
    let items: Vec<Value> = names.iter().map(|n| discovery::namespace_json(n)).collect();
    let body = json!({"kind": "NamespaceList", "apiVersion": "v1",
                      "metadata": {"resourceVersion": rv.to_string()}, "items": items});
    Response::json(200, body.to_string().into_bytes())
}

fn ns_get(shared: &Shared, name: &str) -> Result<Response, ApiError> {
    if !shared.namespace_exists(name) {
        return Err(ApiError::not_found("namespaces", name));
    }
    let body = discovery::namespace_json(name).to_string();
    Ok(Response::json(200, body.into_bytes()))
}

/// `POST /api/v1/namespaces`: adds a namespace (a no-op 409 when every name exists or it
/// already does).
fn ns_create(shared: &Shared, req: &Request) -> Result<Response, ApiError> {
    check_json_content_type(req)?;
    let obj = pod::decode_object(&req.body, "Namespace")?;
    let name = obj
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let errs: Vec<_> = super::validation::dns1123_label(&name)
        .into_iter()
        .map(|m| super::validation::FieldError::invalid("metadata.name", &name, m))
        .collect();
    if name.is_empty() {
        let e = super::validation::FieldError::required(
            "metadata.name",
            "name or generateName is required",
        );
        return Err(ApiError::invalid("Namespace", "", &[e]));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid("Namespace", &name, &errs));
    }
    lock(shared).reg.create_namespace(&name)?;
    Ok(Response::json(
        201,
        discovery::namespace_json(&name).to_string().into_bytes(),
    ))
}

/// The `Content-Type` header as sent, and its media type in lower case without parameters.
fn content_type(req: &Request) -> (&str, String) {
    let ct = req.header("content-type").unwrap_or("");
    let media = ct.split(';').next().unwrap_or("").trim();
    (ct, media.to_ascii_lowercase())
}

fn parse_selectors(req: &Request) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let label = LabelSelector::parse(req.param("labelSelector").unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let field = FieldSelector::parse(
        req.param("fieldSelector").unwrap_or(""),
        of(Kind::Pod).fields,
    )
    .map_err(ApiError::bad_request)?;
    Ok((label, field))
}

fn selected(p: &StoredPod, label: &LabelSelector, field: &FieldSelector) -> bool {
    label.matches(&p.labels) && field.matches(|f| p.field(f))
}

fn list(c: &Call<'_>) -> Result<Response, ApiError> {
    let (shared, req, now) = (c.shared, c.req, c.now);
    let ns = c.r.ns;
    if matches!(req.param("watch"), Some("true" | "1")) {
        let w = watch_params(req, ns)?;
        return Ok(watch::response(lock(shared).watch_start(ns, now), w));
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
    if discovery::wants_table(req) {
        let pods: Vec<Value> = (page.iter())
            .filter_map(|p| serde_json::from_str(&p.json).ok())
            .collect();
        let now = std::time::SystemTime::now();
        return Ok(discovery::pod_table(
            snap.rv,
            continue_token.as_deref(),
            &pods,
            now,
        ));
    }
    Ok(pod_list_for(req, snap.rv, continue_token, remaining, page))
}

/// The parameters of `GET …/pods?watch=true`, which streams the store's change feed (see
/// `watch.rs`).
fn watch_params(req: &Request, ns: Option<&str>) -> Result<watch::WatchParams, ApiError> {
    let (label, field) = parse_selectors(req)?;
    let table = discovery::wants_table(req);
    watch::WatchParams::parse(|k| req.param(k), ns, label, field, table)
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
    let (ct, media) = content_type(req);
    // An absent Content-Type means the first supported type, JSON.
    if media.is_empty() || media == "application/json" {
        Ok(())
    } else {
        Err(ApiError::unsupported_media_type(ct))
    }
}

fn create(c: &Call<'_>) -> Result<Response, ApiError> {
    let (shared, req, now) = (c.shared, c.req, c.now);
    let ns = c.ns();
    check_json_content_type(req)?;
    let dry = dry_run(req, None)?;
    let unknown = field_validation(req)?;
    let v = pod::decode(&req.body)?;
    let p = lock(shared).create(ns, v, CreateMode::Api, dry, now)?;
    shared.kubelet.notify_all();
    let mut resp = object_for(req, 201, &p);
    for f in unknown {
        resp.headers
            .push(("Warning", warning_header(&format!("unknown field \"{f}\""))));
    }
    Ok(resp)
}

/// Server-side field validation of a pod create (see `schema`): the `fieldValidation`
/// parameter (`Strict`, `Warn` — the default — or `Ignore`). Under `Strict` an unknown field
/// is a 400; otherwise returns the unknown fields to warn about (none under `Ignore`).
fn field_validation(req: &Request) -> Result<Vec<String>, ApiError> {
    checked_fields(req, ("Pod", "v1"), |v| {
        schema::unknown_fields(v, &schema::POD)
    })
}

/// [`field_validation`] of a body of `kind` in `version`, whose undeclared fields `unknown`
/// lists.
fn checked_fields(
    req: &Request,
    (kind, version): (&str, &str),
    unknown: impl Fn(&Value) -> Vec<String>,
) -> Result<Vec<String>, ApiError> {
    let mode = req.param("fieldValidation").unwrap_or("");
    if !matches!(mode, "" | "Strict" | "Warn" | "Ignore") {
        return Err(ApiError::bad_request(format!(
            "fieldValidation: Unsupported value: {mode:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
        )));
    }
    if mode == "Ignore" {
        return Ok(Vec::new());
    }
    // Undecodable bodies are left to the decoder, which answers them with its own 400.
    let Ok(v) = serde_json::from_slice::<Value>(&req.body) else {
        return Ok(Vec::new());
    };
    let unknown = unknown(&v);
    if mode == "Strict" && !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
            schema::strict_message(&unknown)
        )));
    }
    Ok(unknown)
}

/// The fields of a create or update body that `fieldValidation` reports: an ExecutorSet's
/// that its schema prunes; none for the built-in kinds of the registry (not modelled).
fn registry_field_validation(req: &Request, res: &Resource) -> Result<Vec<String>, ApiError> {
    match res.id {
        Kind::ExecutorSet => checked_fields(
            req,
            ("ExecutorSet", "v1alpha1"),
            executorset::unknown_fields,
        ),
        _ => Ok(Vec::new()),
    }
}

/// `resp` with a `Warning` header per unknown field (`fieldValidation=Warn`, the default).
fn warned(mut resp: Response, unknown: &[String]) -> Response {
    for f in unknown {
        resp.headers
            .push(("Warning", warning_header(&format!("unknown field \"{f}\""))));
    }
    resp
}

/// A `Warning` header value as the apiserver writes it: code 299, agent `-`, the text
/// quoted with `"` and `\` escaped (RFC 7234 section 5.5).
fn warning_header(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("299 - \"{escaped}\"")
}

/// `PATCH` of a pod: a JSON merge patch (see the `patch` module).
fn patch_pod(c: &Call<'_>) -> Result<Response, ApiError> {
    let (shared, req, now) = (c.shared, c.req, c.now);
    let (ns, name) = (c.ns(), c.name());
    super::patch::check_patch_type(req.header("content-type").unwrap_or(""))?;
    let patch: Value = serde_json::from_slice(&req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let p = lock(shared).patch(ns, name, &patch, now)?;
    shared.kubelet.notify_all();
    Ok(object_for(req, 200, &p))
}

/// DeleteOptions from the body if there is one, else from the query (never both, as in
/// the apiserver's delete handler).
fn delete_options(req: &Request) -> Result<(DeleteOptions, bool), ApiError> {
    if !req.body.is_empty() {
        let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })?;
        return delete_options_of(req, &v);
    }
    let mut opts = DeleteOptions::default();
    if let Some(g) = req.param("gracePeriodSeconds").filter(|g| !g.is_empty()) {
        opts.grace_period_seconds = Some(g.parse().map_err(|_| {
            ApiError::bad_request(format!("strconv.ParseInt: parsing {g:?}: invalid syntax"))
        })?);
    }
    Ok((opts, dry_run(req, None)?))
}

/// The `DeleteOptions` object `v` (a DELETE's body, or an Eviction's `deleteOptions`), and
/// whether it asks for a dry run.
fn delete_options_of(req: &Request, v: &Value) -> Result<(DeleteOptions, bool), ApiError> {
    let mut opts = DeleteOptions::default();
    {
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
    }
    let dry = dry_run(req, Some(v))?;
    Ok((opts, dry))
}

/// `POST …/pods/NAME/eviction` (a policy/v1 `Eviction`), as kube-apiserver's
/// `EvictionREST.Create` (`pkg/registry/core/pod/storage/eviction.go`) serves it for a pod
/// no PodDisruptionBudget covers — the simulator serves no budgets: the body's name must be
/// the URL's (400 `name in URL does not match name in Eviction object`), the pod is deleted
/// with the Eviction's `deleteOptions` (404 when it does not exist, 409 when a precondition
/// fails), and the answer is 201 with a `Status` of `Success`.
fn evict(c: &Call<'_>) -> Result<Response, ApiError> {
    let (shared, req, now) = (c.shared, c.req, c.now);
    let (ns, name) = (c.ns(), c.name());
    let v: Value = serde_json::from_slice(&req.body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    if v["metadata"]["name"].as_str().unwrap_or("") != name {
        return Err(ApiError::bad_request(
            "name in URL does not match name in Eviction object",
        ));
    }
    let (opts, dry) = match v.get("deleteOptions").filter(|o| !o.is_null()) {
        Some(o) => delete_options_of(req, o)?,
        None => (DeleteOptions::default(), dry_run(req, None)?),
    };
    lock(shared).delete(ns, name, &opts, dry, now)?;
    shared.kubelet.notify_all();
    // The create handler writes the status code into a Status it returns.
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "code": 201});
    Ok(Response::json(
        201,
        serde_json::to_vec(&body).unwrap_or_default(),
    ))
}

fn delete(c: &Call<'_>) -> Result<Response, ApiError> {
    let (shared, req, now) = (c.shared, c.req, c.now);
    let (ns, name) = (c.ns(), c.name());
    let (opts, dry) = delete_options(req)?;
    let p = lock(shared).delete(ns, name, &opts, dry, now)?;
    shared.kubelet.notify_all();
    Ok(object_for(req, 200, &p))
}

fn delete_collection(c: &Call<'_>) -> Result<Response, ApiError> {
    let (shared, req, now) = (c.shared, c.req, c.now);
    let ns = c.ns();
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
    Ok(pod_list_for(req, rv, None, None, out))
}
