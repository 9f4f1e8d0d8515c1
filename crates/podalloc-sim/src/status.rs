//! The apiserver's `Status` error bodies (`metav1.Status`), shaped byte for byte like the
//! real ones: `kind`, `apiVersion`, `metadata`, `status`, `message`, `reason`, `details`,
//! `code`, in that order.

use serde::Serialize;

use super::validation::FieldError;

/// One entry of `details.causes`; the JSON key `reason` holds Go's `CauseType`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Cause {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
}

/// `details` of a Status. Empty fields are omitted like Go's `omitempty`.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Details {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "is_zero")]
    pub retry_after_seconds: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A failed API call: the HTTP code plus everything the Status body carries.
#[derive(Clone, Debug)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Box<Details>>,
    /// `metadata.continue` of the Status (only the 410 for an expired continue token has it).
    pub continue_token: Option<String>,
}

#[derive(Serialize)]
struct ListMeta<'a> {
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    continue_token: Option<&'a str>,
}

#[derive(Serialize)]
struct StatusBody<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    kind: &'static str,
    #[serde(rename = "apiVersion", skip_serializing_if = "str::is_empty")]
    api_version: &'static str,
    metadata: ListMeta<'a>,
    status: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<&'a Details>,
    code: u16,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            continue_token: None,
        }
    }

    fn with_details(mut self, details: Details) -> Self {
        self.details = Some(Box::new(details));
        self
    }

    /// 400 BadRequest: undecodable body, malformed selector, unsupported field label...
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized, exactly as kube-apiserver sends it.
    pub(crate) fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 404 for `pods "name" not found`.
    pub(crate) fn pod_not_found(name: &str) -> Self {
        Self::not_found("pods", name)
    }

    /// 404 for `RESOURCE "name" not found` (`resource` plural, e.g. `configmaps`).
    pub(crate) fn not_found(resource: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{resource} \"{name}\" not found")).with_details(
            Details {
                name: name.to_string(),
                kind: resource.to_string(),
                ..Details::default()
            },
        )
    }

    /// 403 Forbidden as `NewForbidden(resource, name, err)` renders it: `RESOURCE "name"
    /// is forbidden: ERR`, or `RESOURCE is forbidden: ERR` without a name.
    pub(crate) fn forbidden(resource: &str, name: &str, err: &str) -> Self {
        let message = if name.is_empty() {
            format!("{resource} is forbidden: {err}")
        } else {
            format!("{resource} \"{name}\" is forbidden: {err}")
        };
        Self::new(403, "Forbidden", message).with_details(Details {
            name: name.to_string(),
            kind: resource.to_string(),
            ..Details::default()
        })
    }

    /// 500 InternalError (`NewInternalError(err)`): the message is prefixed and the error
    /// repeated as the one cause.
    pub(crate) fn internal_error(err: &str) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {err}"),
        )
        .with_details(Details {
            causes: vec![Cause {
                reason: String::new(),
                message: err.to_string(),
                field: String::new(),
            }],
            ..Details::default()
        })
    }

    /// 503 ServiceUnavailable (`NewServiceUnavailable(reason)`).
    pub(crate) fn service_unavailable(message: &str) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// 429 TooManyRequests (`NewTooManyRequests(message, seconds)`).
    pub(crate) fn too_many_requests(message: &str, retry_after_seconds: u32) -> Self {
        Self::new(429, "TooManyRequests", message).with_details(Details {
            retry_after_seconds,
            ..Details::default()
        })
    }

    /// 504 Timeout (`NewTimeoutError(message, 0)`): `Timeout: MESSAGE`, empty details.
    pub(crate) fn timeout(message: &str) -> Self {
        Self::new(504, "Timeout", format!("Timeout: {message}")).with_details(Details::default())
    }

    /// 404 for a namespace that does not (cannot) exist.
    pub(crate) fn namespace_not_found(ns: &str) -> Self {
        Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found")).with_details(Details {
            name: ns.to_string(),
            kind: "namespaces".to_string(),
            ..Details::default()
        })
    }

    /// 404 for a path that names no resource.
    pub(crate) fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(Details::default())
    }

    /// 405 for a verb the resource does not support.
    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
        .with_details(Details::default())
    }

    /// 409 AlreadyExists for a pod. `generated` adds the generateName wording and a
    /// retry hint.
    pub(crate) fn already_exists(name: &str, generated: bool) -> Self {
        Self::already_exists_in("pods", name, generated)
    }

    /// 409 AlreadyExists for `resource` (plural); see [`ApiError::already_exists`].
    pub(crate) fn already_exists_in(resource: &str, name: &str, generated: bool) -> Self {
        let mut message = format!("{resource} \"{name}\" already exists");
        let mut details = Details {
            name: name.to_string(),
            kind: resource.to_string(),
            ..Details::default()
        };
        if generated {
            message.push_str(", the server was not able to generate a unique name for the object");
            details.retry_after_seconds = 1;
        }
        Self::new(409, "AlreadyExists", message).with_details(details)
    }

    /// 409 Conflict as `NewConflict(resource, name, err)` renders it.
    pub(crate) fn conflict(resource: &str, name: &str, err: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} \"{name}\": {err}"),
        )
        .with_details(Details {
            name: name.to_string(),
            kind: resource.to_string(),
            ..Details::default()
        })
    }

    /// 410 Expired (a continue token older than the compaction window).
    pub(crate) fn expired(message: impl Into<String>, continue_token: Option<String>) -> Self {
        let mut e = Self::new(410, "Expired", message);
        e.continue_token = continue_token;
        e
    }

    /// 413 for a request body over the apiserver's 3 MiB limit.
    pub(crate) fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// 415 for a body that is not JSON.
    pub(crate) fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json (got {content_type:?})"),
        )
    }

    /// 415 for a PATCH whose Content-Type is not a patch type.
    pub(crate) fn unsupported_patch_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"),
        )
    }

    /// 415 for a PATCH of a custom resource whose Content-Type is not one of `accepted`
    /// (`negotiation.NewUnsupportedMediaTypeError`).
    pub(crate) fn unsupported_patch_type_of(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 422 for a JSON patch whose operation fails (`NewGenericServerResponse(422, …)`:
    /// the generic message, empty details).
    pub(crate) fn json_patch_failed() -> Self {
        Self::new(
            422,
            "Invalid",
            "the server rejected our request due to an error in our request",
        )
        .with_details(Details::default())
    }

    /// 422 Invalid with one cause per field error; `kind` is the Kind (`Pod`).
    pub(crate) fn invalid(kind: &str, name: &str, errs: &[FieldError]) -> Self {
        let agg = if errs.len() == 1 {
            errs[0].to_string()
        } else {
            format!(
                "[{}]",
                errs.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {agg}"),
        )
        .with_details(Details {
            name: name.to_string(),
            kind: kind.to_string(),
            causes: errs
                .iter()
                .map(|e| Cause {
                    reason: e.cause_type().to_string(),
                    message: e.body(),
                    field: e.field.clone(),
                })
                .collect(),
            ..Details::default()
        })
    }

    /// 500 with an empty reason: what `ErrorToAPIStatus` makes of a plain (non-API) error,
    /// e.g. the storage layer's `resourceVersion should not be set on objects to be created`.
    pub(crate) fn unknown_server_error(message: impl Into<String>) -> Self {
        Self::new(500, "", message)
    }

    /// The JSON Status body.
    pub(crate) fn to_json(&self) -> Vec<u8> {
        self.render(true)
    }

    /// The Status as Go's `json.Encoder` writes a bare `metav1.Status` (no `kind` and
    /// `apiVersion`, a trailing newline): what the request timeout filter sends.
    pub(crate) fn to_bare_json_line(&self) -> Vec<u8> {
        let mut out = self.render(false);
        out.push(b'\n');
        out
    }

    fn render(&self, type_meta: bool) -> Vec<u8> {
        let body = StatusBody {
            kind: if type_meta { "Status" } else { "" },
            api_version: if type_meta { "v1" } else { "" },
            metadata: ListMeta {
                continue_token: self.continue_token.as_deref(),
            },
            status: "Failure",
            message: &self.message,
            reason: self.reason,
            details: self.details.as_deref(),
            code: self.code,
        };
        // Serialising plain strings and numbers cannot fail.
        serde_json::to_vec(&body).unwrap_or_default()
    }
}

#[derive(Serialize)]
struct SuccessBody<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: ListMeta<'a>,
    status: &'static str,
    details: &'a Details,
}

/// The `Status` a delete answers with for resources that do not return the deleted
/// object (the generic registry's `finalizeDelete`): `status: Success`, details with the
/// name, the group (omitted for the core group), the resource as `kind`, and the uid; no
/// `code`.
pub(crate) fn delete_success(group: &str, resource: &str, name: &str, uid: &str) -> Vec<u8> {
    let details = Details {
        name: name.to_string(),
        group: group.to_string(),
        kind: resource.to_string(),
        uid: uid.to_string(),
        ..Details::default()
    };
    let body = SuccessBody {
        kind: "Status",
        api_version: "v1",
        metadata: ListMeta {
            continue_token: None,
        },
        status: "Success",
        details: &details,
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unauthorized_is_byte_exact() {
        assert_eq!(
            String::from_utf8(ApiError::unauthorized().to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#
        );
    }

    #[test]
    fn already_exists_matches_the_real_shape() {
        assert_eq!(
            String::from_utf8(ApiError::already_exists("web-1", false).to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"web-1\" already exists","reason":"AlreadyExists","details":{"name":"web-1","kind":"pods"},"code":409}"#
        );
    }

    #[test]
    fn unknown_path_has_empty_details() {
        assert_eq!(
            String::from_utf8(ApiError::path_not_found().to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#
        );
    }
}
