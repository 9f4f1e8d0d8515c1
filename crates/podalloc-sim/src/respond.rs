//! Responses the API handlers (`api.rs`) and the side door (`sidedoor.rs`) share: the
//! `Status` of an error, a pod, and a `PodList` streamed from stored pods' JSON; each in
//! Protobuf instead when the request's `Accept` picks it (`protobuf.rs`), as kube-apiserver
//! answers a built-in kind.

use std::sync::Arc;

use super::discovery;
use super::http::{Body, Request, Response};
use super::protobuf;
use super::status::ApiError;
use super::store::StoredPod;

/// Whether `req`'s `Accept` header picks Protobuf ([`protobuf::accepted`]).
fn wants_protobuf(req: &Request) -> bool {
    protobuf::accepted(req.header("accept").unwrap_or(""))
}

/// A Protobuf response with status `code`.
fn protobuf_response(code: u16, body: Vec<u8>) -> Response {
    Response {
        status: code,
        content_type: protobuf::MEDIA_TYPE,
        headers: Vec::new(),
        body: Body::Bytes(body),
    }
}

/// [`error_response`] in the encoding `req` negotiates: a Protobuf `Status` when its
/// `Accept` picks Protobuf (kube-apiserver's `ErrorNegotiated`), else JSON.
pub(crate) fn error_for(req: &Request, e: ApiError) -> Response {
    let mut r = error_response(e);
    if wants_protobuf(req) {
        if let Body::Bytes(json) = &r.body {
            r.body = Body::Bytes(protobuf::status(json));
            r.content_type = protobuf::MEDIA_TYPE;
        }
    }
    r
}

/// The `Status` of an API error, with `Retry-After` when its details ask for one.
pub(crate) fn error_response(e: ApiError) -> Response {
    let mut r = Response::json(e.code, e.to_json());
    if let Some(d) = &e.details {
        if d.retry_after_seconds > 0 {
            r.headers
                .push(("Retry-After", d.retry_after_seconds.to_string()));
        }
    }
    r
}

/// A pod as a single-object response with status `code`.
pub(crate) fn object(code: u16, p: &StoredPod) -> Response {
    Response::json(code, p.object_json())
}

/// A one-row `Table` of the pod whose JSON is `json`, at its resourceVersion: what the
/// apiserver converts a single pod to (kubectl's `get pod NAME`, each event of `get -w`).
pub(crate) fn pod_table_of(json: &[u8]) -> Response {
    let pod: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
    let rv = pod["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    discovery::pod_table(rv, None, &[pod], std::time::SystemTime::now())
}

/// [`object`] in the encoding `req` negotiates.
pub(crate) fn object_for(req: &Request, code: u16, p: &StoredPod) -> Response {
    match wants_protobuf(req) {
        true => protobuf_response(code, protobuf::pod(p)),
        false => object(code, p),
    }
}

/// [`pod_list`] in the encoding `req` negotiates: the same page (`items`, the token,
/// `remainingItemCount`) in JSON or Protobuf.
pub(crate) fn pod_list_for(
    req: &Request,
    rv: u64,
    continue_token: Option<String>,
    remaining: Option<usize>,
    items: Vec<Arc<StoredPod>>,
) -> Response {
    if !wants_protobuf(req) {
        return pod_list(rv, continue_token, remaining, items);
    }
    let body = protobuf::pod_list(rv, continue_token.as_deref(), remaining, &items);
    protobuf_response(200, body)
}

/// A streamed `PodList` response.
pub(crate) fn pod_list(
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
