//! Responses the API handlers (`api.rs`) and the side door (`sidedoor.rs`) share: the
//! `Status` of an error, a pod, and a `PodList` streamed from stored pods' JSON.

use std::sync::Arc;

use super::discovery;
use super::http::{Body, Response};
use super::status::ApiError;
use super::store::StoredPod;

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
