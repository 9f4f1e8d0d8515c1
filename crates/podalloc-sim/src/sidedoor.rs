//! The simulator's own side door under `/sim/`, never authenticated and not logged: stats,
//! seeding pods (one or a `PodList`), forcing a pod's phase, fault rules, the pods quota,
//! cutting a user off, and the request log (see the crate docs).

use std::time::Instant;

use serde_json::{json, Value};

use super::faults::FaultRule;
use super::http::{Body, Request, Response};
use super::pod::{self, Phase};
use super::respond::{object, pod_list};
use super::shared::{collect_stats, relock, Shared};
use super::status::ApiError;
use super::store::{CreateMode, PhaseOverride, Store};

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Store> {
    relock(&shared.store)
}

/// Answers `/sim/SEGS…` (`segs` after `sim`): see the module docs. Errors: 404 for an
/// unknown path, 405 for a known path with another method, 400 for a bad body.
pub(crate) fn handle(
    shared: &Shared,
    req: &Request,
    segs: &[&str],
    now: Instant,
) -> Result<Response, ApiError> {
    let post = req.method == "POST";
    match segs {
        ["stats"] if req.method == "GET" => {
            let s = collect_stats(shared, now);
            let body = serde_json::to_vec(&s).map_err(|e| ApiError::bad_request(e.to_string()))?;
            Ok(Response::json(200, body))
        }
        ["faults"] if req.method == "GET" => Ok(faults_json(shared)),
        ["faults"] if post => set_faults(shared, &req.body),
        ["quota"] if req.method == "GET" => Ok(quota_json(lock(shared).pod_quota())),
        ["quota"] if post => set_quota(shared, &req.body),
        ["cut"] if post => set_cut(shared, &req.body),
        ["log"] if req.method == "GET" => Ok(Response {
            status: 200,
            content_type: "application/x-ndjson",
            headers: Vec::new(),
            body: Body::Bytes(relock(&shared.log).render().into_bytes()),
        }),
        ["pods", ns] if post && !ns.is_empty() => seed(shared, ns, &req.body, now),
        ["pods", ns, name, "phase"] if post => {
            let o = phase_override(&req.body)?;
            let p = lock(shared).set_phase(ns, name, &o, now)?;
            shared.kubelet.notify_all();
            Ok(object(200, &p))
        }
        ["stats"]
        | ["pods", _]
        | ["pods", _, _, "phase"]
        | ["faults"]
        | ["quota"]
        | ["log"]
        | ["cut"] => Err(ApiError::method_not_allowed()),
        _ => Err(ApiError::path_not_found()),
    }
}

/// `POST /sim/pods/{ns}`: seeds one pod (201 and the pod) or, for a `PodList` body, every
/// item in order under one store lock (201 and a `PodList` of the stored pods), so a
/// benchmark seeds thousands of pods in a few requests. Each item is decoded, defaulted,
/// validated and stored exactly as a single seeded pod (uid, resourceVersion,
/// creationTimestamp from the server; status from the kubelet model for a given
/// `status.phase`); no quota is charged, as for a single seed. Like `kubectl create -f` on
/// a list, the first item that fails stops the seeding: its error is returned with
/// `items[i]: ` before the message, and the items before it stay created. The body limit
/// is the apiserver's (3 MiB), so large seeds are sent in several lists.
fn seed(shared: &Shared, ns: &str, body: &[u8], now: Instant) -> Result<Response, ApiError> {
    let mut v = pod::parse_body(body)?;
    if v.get("kind").and_then(Value::as_str) != Some("PodList") {
        let p = lock(shared).create(ns, pod::decode_value(v)?, CreateMode::Seed, false, now)?;
        shared.kubelet.notify_all();
        return Ok(object(201, &p));
    }
    let Some(Value::Array(items)) = v.get_mut("items").map(Value::take) else {
        return Err(ApiError::bad_request(
            "seed body: a PodList needs \"items\": a list of pods",
        ));
    };
    let mut store = lock(shared);
    let mut out = Vec::with_capacity(items.len());
    let mut failed = None;
    for (i, item) in items.into_iter().enumerate() {
        match pod::decode_value(item)
            .and_then(|p| store.create(ns, p, CreateMode::Seed, false, now))
        {
            Ok(p) => out.push(p),
            Err(mut e) => {
                e.message = format!("items[{i}]: {}", e.message);
                failed = Some(e);
                break;
            }
        }
    }
    let rv = store.rv();
    drop(store);
    shared.kubelet.notify_all();
    if let Some(e) = failed {
        return Err(e);
    }
    let mut resp = pod_list(rv, None, None, out);
    resp.status = 201;
    Ok(resp)
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

/// `POST /sim/cut`: `{"user": NAME, "seconds": S}` cuts the user off from the API for S
/// seconds (see `SimServer::cut_off`); 0 ends a cut.
fn set_cut(shared: &Shared, body: &[u8]) -> Result<Response, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("cut body: {e}")))?;
    let (Some(user), Some(secs)) = (
        v.get("user").and_then(Value::as_str),
        v.get("seconds")
            .and_then(Value::as_f64)
            .filter(|s| s.is_finite() && (0.0..=86_400.0).contains(s)),
    ) else {
        return Err(ApiError::bad_request(
            "cut body: expected {\"user\": NAME, \"seconds\": S} with 0 <= S <= 86400",
        ));
    };
    let until = Instant::now() + std::time::Duration::from_secs_f64(secs);
    relock(&shared.cuts).insert(user.to_string(), until);
    Ok(Response::json(
        200,
        json!({"user": user, "seconds": secs})
            .to_string()
            .into_bytes(),
    ))
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
        disruption: text("disruption"),
        waiting: text("waiting"),
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
