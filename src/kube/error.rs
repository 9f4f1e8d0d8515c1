//! Errors of the kube client, and the parser for the API server's `Status` body.
//!
//! Every failed call ends as one [`KubeError`]. Its `Display` is a single line meant for a
//! person (the CLI prints it as is); the variants and [`ApiStatus`] are for code that decides
//! what to do next (retry, treat 409 as "already there", stop on quota).
//!
//! Secrets never reach these values: messages are built from HTTP codes, `Status` bodies,
//! file names and URLs without credentials, never from tokens, keys or request headers.

use std::fmt;

use serde::Deserialize;

/// Longest message kept from a body that is not a `Status` object (plain text, HTML), in
/// characters. Longer text is cut and ends with `…`.
pub const MAX_TEXT_MESSAGE_CHARS: usize = 300;

/// Why a call to the API server failed.
///
/// `Display` is one line, e.g.
/// `create pod app-exec-3: 403 Forbidden: pods "app-exec-3" is forbidden: exceeded quota: ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KubeError {
    /// The server answered with an HTTP error code. `verb` names the call ("list pods",
    /// "get pod NAME", "create pod NAME", "delete pod NAME"); `status` is the parsed `Status`
    /// body, or, for a body that is not a `Status` (the plain-text 429 of API Priority and
    /// Fairness, a proxy's HTML page), a `Status` made from the HTTP code and the text.
    Api {
        /// The call that failed, e.g. `"list pods"`.
        verb: String,
        /// What the server said.
        status: ApiStatus,
    },
    /// No HTTP answer: connection refused or reset, timeout, DNS, or a TLS failure.
    /// `kind` says which, and decides [`KubeError::is_retryable`]. TLS failures are not
    /// retryable and their message starts with `TLS:`; an untrusted server certificate reads
    /// `TLS: certificate not trusted; pass --certificate-authority or fix the kubeconfig`.
    Transport {
        /// The call that failed, e.g. `"list pods"`.
        verb: String,
        /// What kind of failure it was.
        kind: TransportKind,
        /// What went wrong, for a person, without credentials.
        message: String,
    },
    /// The connection configuration is unusable. The message names the file or field and
    /// says how to fix it.
    Config(String),
    /// The server's answer could not be decoded (malformed JSON, body too large, bad gzip).
    Decode {
        /// What was being decoded, e.g. `"created pod"` or `"list pods response"`.
        what: String,
        /// The decoder's message.
        message: String,
    },
    /// No usable credential: the server rejected it (HTTP 401), also after re-reading a
    /// token file or re-running an exec plugin; or an exec credential plugin failed (non-zero
    /// exit with the first line of its stderr, timeout, output without a credential). The
    /// request was not accepted in either case. The message names the credential source
    /// (file, flag, or plugin command and kubeconfig user) and what to do; it never holds a
    /// token or the plugin's stdout.
    Auth(String),
}

/// What kind of transport failure a [`KubeError::Transport`] is. Code branches on this,
/// never on the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportKind {
    /// The TLS handshake failed: an untrusted, expired or misnamed server certificate, or
    /// the server refused the client certificate. Not retryable: the same configuration
    /// fails the same way.
    Tls,
    /// No answer in time: the connect, per-read or whole-call timeout.
    Timeout,
    /// No connection: refused, or failed to open.
    Connect,
    /// The server's host name did not resolve (DNS).
    Dns,
    /// The connection broke: reset, aborted, or closed before the response was complete.
    Reset,
    /// The configured proxy refused or failed the `CONNECT`.
    Proxy,
    /// The server's answer was not valid HTTP.
    Protocol,
    /// Any other I/O failure.
    Other,
}

impl TransportKind {
    /// Whether a call that failed this way may succeed when tried again: every kind but
    /// [`TransportKind::Tls`] (client-go retries connection resets and timeouts, never a
    /// certificate error).
    pub fn is_retryable(self) -> bool {
        match self {
            TransportKind::Tls => false,
            TransportKind::Timeout
            | TransportKind::Connect
            | TransportKind::Dns
            | TransportKind::Reset
            | TransportKind::Proxy
            | TransportKind::Protocol
            | TransportKind::Other => true,
        }
    }
}

impl KubeError {
    /// A [`KubeError::Transport`] of kind [`TransportKind::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            KubeError::Transport {
                kind: TransportKind::Timeout,
                ..
            }
        )
    }

    /// The HTTP status code behind the error: the `Status` code for [`KubeError::Api`],
    /// 401 for [`KubeError::Auth`] (also when an exec plugin failed: the request could not be
    /// authenticated), `None` for the other variants.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            KubeError::Api { status, .. } => Some(status.code),
            KubeError::Auth(_) => Some(401),
            _ => None,
        }
    }

    /// Whether trying the same call again later may succeed: HTTP 429, 500, 502, 503 and
    /// 504 (the codes client-go and the API conventions treat as transient), and transport
    /// failures other than TLS (connection refused or reset, timeouts; see
    /// [`TransportKind::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        match self {
            KubeError::Api { status, .. } => is_retryable_code(status.code),
            KubeError::Transport { kind, .. } => kind.is_retryable(),
            _ => false,
        }
    }

    /// The kind of a [`KubeError::Transport`] error.
    pub fn transport_kind(&self) -> Option<TransportKind> {
        match self {
            KubeError::Transport { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// Whether this is a ResourceQuota rejection: HTTP 403 whose message says
    /// `exceeded quota` or `failed quota` (the admission plugin's wording, see
    /// k/k `plugin/pkg/admission/resourcequota`). Creating more pods will not help until
    /// the quota changes or pods go away.
    pub fn is_quota(&self) -> bool {
        match self {
            KubeError::Api { status, .. } => {
                status.code == 403
                    && (status.message.contains("exceeded quota")
                        || status.message.contains("failed quota"))
            }
            _ => false,
        }
    }

    /// The parsed `Status` of an [`KubeError::Api`] error.
    pub fn api_status(&self) -> Option<&ApiStatus> {
        match self {
            KubeError::Api { status, .. } => Some(status),
            _ => None,
        }
    }

    /// Whether the server said the object already exists (HTTP 409, reason `AlreadyExists`),
    /// the answer to a create whose name is taken. After a retried create this may mean the
    /// first attempt succeeded. A 409 `Conflict` (a failed precondition or a stale
    /// `resourceVersion` on update or delete) is not this.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, KubeError::Api { status, .. } if status.code == 409 && status.reason == "AlreadyExists")
    }
}

/// The HTTP codes retried inside one call and reported by [`KubeError::is_retryable`].
pub(crate) fn is_retryable_code(code: u16) -> bool {
    matches!(code, 429 | 500 | 502 | 503 | 504)
}

impl fmt::Display for KubeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeError::Api { verb, status } => write!(f, "{verb}: {status}"),
            KubeError::Transport { verb, message, .. } => write!(f, "{verb}: {message}"),
            KubeError::Config(message) => f.write_str(message),
            KubeError::Decode { what, message } => write!(f, "cannot decode {what}: {message}"),
            KubeError::Auth(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for KubeError {}

/// A Kubernetes `Status` object as sent with error responses (`meta/v1` `Status`).
///
/// Only the fields a client acts on are kept. `kind`/`apiVersion` are not required (real
/// servers and proxies omit them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiStatus {
    /// The HTTP status code of the response (authoritative over the body's `code`).
    pub code: u16,
    /// The machine-readable reason (`AlreadyExists`, `Forbidden`, `Invalid`, `Expired`,
    /// `TooManyRequests`, …). When the body has none, the conventional reason for the
    /// HTTP code (`meta/v1` `StatusReason*`), or `Unknown`.
    pub reason: String,
    /// The human-readable message, one line. For non-`Status` bodies: the trimmed text,
    /// cut to [`MAX_TEXT_MESSAGE_CHARS`] characters.
    pub message: String,
    /// `details.causes`: per-field problems (422 `Invalid` lists them here).
    pub causes: Vec<StatusCause>,
    /// `details.retryAfterSeconds`, else the `Retry-After` header, in whole seconds.
    pub retry_after_seconds: Option<u64>,
}

/// One entry of `Status.details.causes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct StatusCause {
    /// The cause type, e.g. `FieldValueRequired` (JSON key `reason`, Go field `Type`).
    pub reason: String,
    /// What is wrong with the field.
    pub message: String,
    /// The field path, e.g. `spec.containers[0].image`; empty when not about one field.
    pub field: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RawStatus {
    message: Option<String>,
    reason: Option<String>,
    details: Option<RawDetails>,
    code: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawDetails {
    causes: Option<Vec<StatusCause>>,
    retry_after_seconds: Option<i64>,
}

/// A Protobuf `meta.v1.Status` (message 3, reason 4, details 5 {causes 4 {reason 1,
/// message 2, field 3}, retryAfterSeconds 5}, code 6), as kube-apiserver encodes error
/// answers to a client that asked for Protobuf. Errors: not such a body.
fn protobuf_status(body: &[u8]) -> Result<RawStatus, String> {
    use crate::wire::protobuf::{bytes, each, number, text};
    let (kind, raw) = crate::wire::protobuf::envelope(body)?;
    if kind != Some("Status") {
        return Err(format!("kind {kind:?}, not Status"));
    }
    let mut st = RawStatus::default();
    let mut details = RawDetails::default();
    each(raw, |num, v| {
        match num {
            3 => st.message = Some(text(v, "message")?.to_string()),
            4 => st.reason = Some(text(v, "reason")?.to_string()),
            5 => each(bytes(v, "details")?, |n, v| {
                match n {
                    4 => {
                        let mut c = StatusCause::default();
                        each(bytes(v, "cause")?, |k, v| {
                            match k {
                                1 => c.reason = text(v, "cause reason")?.to_string(),
                                2 => c.message = text(v, "cause message")?.to_string(),
                                3 => c.field = text(v, "cause field")?.to_string(),
                                _ => {}
                            }
                            Ok(())
                        })?;
                        details.causes.get_or_insert_with(Vec::new).push(c);
                    }
                    5 => details.retry_after_seconds = Some(i64::from(number(v, "retry")? as i32)),
                    _ => {}
                }
                Ok(())
            })?,
            6 => st.code = Some(i64::from(number(v, "code")? as i32)),
            _ => {}
        }
        Ok(())
    })?;
    st.details = Some(details);
    Ok(st)
}

impl ApiStatus {
    /// Builds the status of an error response from its HTTP `code`, its (already
    /// decompressed) `body`, and its `Retry-After` header value in seconds, if any.
    ///
    /// A body holding a JSON object, or a Protobuf `Status` (`k8s\0` …), is read as a
    /// `Status` (missing fields are fine, leading whitespace too); anything else becomes a `Status` whose message is the body's text,
    /// trimmed and cut to [`MAX_TEXT_MESSAGE_CHARS`]. `retry_after_seconds` is the body's
    /// `details.retryAfterSeconds` when positive, else the header.
    pub fn from_body(code: u16, body: &[u8], retry_after_header: Option<u64>) -> ApiStatus {
        let parsed = match body.starts_with(crate::wire::protobuf::MAGIC) {
            // Asked for Protobuf, kube-apiserver answers most errors in it too.
            true => protobuf_status(body).ok(),
            false => serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .filter(|v| v.is_object())
                .and_then(|v| serde_json::from_value::<RawStatus>(v).ok()),
        };
        match parsed {
            Some(raw) => {
                let details = raw.details.unwrap_or_default();
                let retry = details
                    .retry_after_seconds
                    .filter(|s| *s > 0)
                    .map(|s| s as u64)
                    .or(retry_after_header);
                let reason = raw
                    .reason
                    .filter(|r| !r.is_empty())
                    .unwrap_or_else(|| reason_for_code(code).to_string());
                let mut message = one_line(raw.message.as_deref().unwrap_or(""));
                if message.is_empty() {
                    message = default_message(code, raw.code);
                }
                ApiStatus {
                    code,
                    reason,
                    message,
                    causes: details.causes.unwrap_or_default(),
                    retry_after_seconds: retry,
                }
            }
            None => {
                let text = String::from_utf8_lossy(body);
                let mut message = truncate_chars(&one_line(&text), MAX_TEXT_MESSAGE_CHARS);
                if message.is_empty() {
                    message = default_message(code, None);
                }
                ApiStatus {
                    code,
                    reason: reason_for_code(code).to_string(),
                    message,
                    causes: Vec::new(),
                    retry_after_seconds: retry_after_header,
                }
            }
        }
    }
}

impl fmt::Display for ApiStatus {
    /// `CODE REASON: MESSAGE`, e.g. `409 AlreadyExists: pods "x" already exists`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

fn default_message(code: u16, body_code: Option<i64>) -> String {
    match body_code {
        Some(c) if c != i64::from(code) && c > 0 => format!("(no message; Status code {c})"),
        _ => "(no message)".to_string(),
    }
}

/// The `meta/v1` `StatusReason` conventionally paired with an HTTP code
/// (k/k `apimachinery/pkg/apis/meta/v1/types.go`).
pub(crate) fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Gone",
        413 => "RequestEntityTooLarge",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        502 => "BadGateway",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

/// Collapses whitespace runs (including newlines) into single spaces and trims.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Cuts `s` to at most `max` characters (on a char boundary), marking the cut with `…`.
pub(crate) fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((idx, _)) => {
            let mut cut: String = s[..idx].chars().take(max.saturating_sub(1)).collect();
            cut.push('…');
            cut
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::testutil::fixture;

    #[test]
    fn status_409_without_kind_and_with_leading_space() {
        let body = std::fs::read(fixture("kubeclient_status-409-already-exists.json")).unwrap();
        assert_eq!(body[0], b' ');
        let s = ApiStatus::from_body(409, &body, None);
        assert_eq!(s.code, 409);
        assert_eq!(s.reason, "AlreadyExists");
        assert_eq!(s.message, "namespaces \"default\" already exists");
        assert!(s.causes.is_empty());
        assert_eq!(s.retry_after_seconds, None);
        let e = KubeError::Api {
            verb: "create pod default".into(),
            status: s,
        };
        assert!(e.is_already_exists());
        assert!(!e.is_retryable());
        assert_eq!(e.status_code(), Some(409));
        assert_eq!(
            e.to_string(),
            "create pod default: 409 AlreadyExists: namespaces \"default\" already exists"
        );
    }

    #[test]
    fn conflict_is_not_already_exists() {
        let conflict = KubeError::Api {
            verb: "delete pod p".into(),
            status: ApiStatus::from_body(
                409,
                br#"{"message":"Precondition failed: UID in precondition: a, UID in object meta: b","reason":"Conflict","code":409}"#,
                None,
            ),
        };
        assert_eq!(conflict.status_code(), Some(409));
        assert!(!conflict.is_already_exists());
        // A 409 without a reason gets the conventional one, Conflict.
        let bare = KubeError::Api {
            verb: "create pod p".into(),
            status: ApiStatus::from_body(409, b"", None),
        };
        assert!(!bare.is_already_exists());
        assert!(!KubeError::Config("x".into()).is_already_exists());
    }

    #[test]
    fn status_422_bodies_from_recorded_replay() {
        let replay: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixture(
                "k8s-openapi_v1-36_crd-test_status-422-invalid.replay.json",
            ))
            .unwrap(),
        )
        .unwrap();
        let bodies: Vec<&str> = replay
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["response_status_code"] == 422)
            .map(|e| e["response_body"].as_str().unwrap())
            .collect();
        assert_eq!(bodies.len(), 3);
        let parsed: Vec<ApiStatus> = bodies
            .iter()
            .map(|b| ApiStatus::from_body(422, b.as_bytes(), None))
            .collect();
        for s in &parsed {
            assert_eq!(s.reason, "Invalid");
            assert!(s.message.contains("\"fb3\" is invalid"), "{}", s.message);
            assert_eq!(s.causes.len(), 1);
        }
        assert_eq!(
            parsed[0].causes[0],
            StatusCause {
                reason: "FieldValueRequired".into(),
                message: "Required value".into(),
                field: "spec.prop2".into(),
            }
        );
        assert_eq!(parsed[1].causes[0].reason, "FieldValueTypeInvalid");
        assert_eq!(parsed[2].causes[0].field, "spec.prop4");
    }

    #[test]
    fn plain_text_429_uses_http_code_and_header() {
        let s = ApiStatus::from_body(
            429,
            b"Too many requests, please try again later.\n",
            Some(1),
        );
        assert_eq!(s.code, 429);
        assert_eq!(s.reason, "TooManyRequests");
        assert_eq!(s.message, "Too many requests, please try again later.");
        assert_eq!(s.retry_after_seconds, Some(1));
        let e = KubeError::Api {
            verb: "list pods".into(),
            status: s,
        };
        assert!(e.is_retryable());
        assert_eq!(
            e.to_string(),
            "list pods: 429 TooManyRequests: Too many requests, please try again later."
        );
    }

    #[test]
    fn status_retry_after_seconds_beats_header() {
        let body = br#"{"kind":"Status","status":"Failure","message":"the server is currently unable to handle the request","reason":"ServerTimeout","details":{"retryAfterSeconds":3},"code":500}"#;
        let s = ApiStatus::from_body(500, body, Some(1));
        assert_eq!(s.retry_after_seconds, Some(3));
        assert_eq!(s.reason, "ServerTimeout");
        let s = ApiStatus::from_body(500, br#"{"details":{"retryAfterSeconds":0}}"#, Some(2));
        assert_eq!(s.retry_after_seconds, Some(2));
        assert_eq!(s.reason, "InternalError");
        assert_eq!(s.message, "(no message)");
    }

    #[test]
    fn long_html_body_is_one_truncated_line() {
        let html = format!("<html>\n<body>{}</body>\n</html>", "x".repeat(1000));
        let s = ApiStatus::from_body(502, html.as_bytes(), None);
        assert_eq!(s.message.chars().count(), MAX_TEXT_MESSAGE_CHARS);
        assert!(s.message.starts_with("<html> <body>xxx"));
        assert!(s.message.ends_with('…'));
        assert!(!s.message.contains('\n'));
        assert_eq!(s.reason, "BadGateway");
        let s = ApiStatus::from_body(503, b"  \n", None);
        assert_eq!(s.message, "(no message)");
        // JSON that is not an object is text too.
        let s = ApiStatus::from_body(500, b"\"oops\"", None);
        assert_eq!(s.message, "\"oops\"");
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate_chars("ééé", 3), "ééé");
        assert_eq!(truncate_chars("éééé", 3), "éé…");
    }

    #[test]
    fn quota_detection() {
        let s = ApiStatus::from_body(
            403,
            br#"{"status":"Failure","message":"pods \"a-exec-1\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10","reason":"Forbidden","code":403}"#,
            None,
        );
        let e = KubeError::Api {
            verb: "create pod a-exec-1".into(),
            status: s,
        };
        assert!(e.is_quota());
        assert!(!e.is_retryable());
        assert_eq!(
            e.to_string(),
            "create pod a-exec-1: 403 Forbidden: pods \"a-exec-1\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=10, limited: pods=10"
        );
        let rbac = KubeError::Api {
            verb: "list pods".into(),
            status: ApiStatus::from_body(
                403,
                br#"{"message":"pods is forbidden: User \"x\" cannot list resource"}"#,
                None,
            ),
        };
        assert!(!rbac.is_quota());
    }

    #[test]
    fn retryable_classification() {
        for code in [429, 500, 502, 503, 504] {
            assert!(is_retryable_code(code));
        }
        for code in [400, 401, 403, 404, 409, 410, 422, 501] {
            assert!(!is_retryable_code(code));
        }
        let tls = KubeError::Transport {
            verb: "list pods".into(),
            kind: TransportKind::Tls,
            message: "TLS: certificate not trusted".into(),
        };
        assert!(!tls.is_retryable());
        assert_eq!(tls.to_string(), "list pods: TLS: certificate not trusted");
        let reset = KubeError::Transport {
            verb: "list pods".into(),
            kind: TransportKind::Reset,
            message: "connection reset".into(),
        };
        assert!(reset.is_retryable());
        assert_eq!(reset.transport_kind(), Some(TransportKind::Reset));
        // The kind decides, not the wording of the message.
        let odd = KubeError::Transport {
            verb: "list pods".into(),
            kind: TransportKind::Timeout,
            message: "TLS: not really".into(),
        };
        assert!(odd.is_retryable());
        for kind in [
            TransportKind::Timeout,
            TransportKind::Connect,
            TransportKind::Dns,
            TransportKind::Reset,
            TransportKind::Proxy,
            TransportKind::Protocol,
            TransportKind::Other,
        ] {
            assert!(kind.is_retryable(), "{kind:?}");
        }
        assert!(!TransportKind::Tls.is_retryable());
        assert_eq!(KubeError::Auth("x".into()).status_code(), Some(401));
        assert!(!KubeError::Config("x".into()).is_retryable());
    }
}
