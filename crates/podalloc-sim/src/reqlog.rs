//! The last requests the simulator answered (`GET /sim/log`): one JSON object per line
//! with the sequence number, the time (ms since the start, and µs since the Unix epoch), the
//! method, the path, the query (values of secret-looking parameters redacted), the verb, the
//! authenticated user, the status sent (null when the connection was dropped), the injected
//! fault and, for a pod create, the `metadata.name` its body asked for (so a client's creates
//! can be told apart from the log alone). Headers are never recorded, so neither is the
//! Authorization header.

use std::collections::VecDeque;
use std::time::Instant;

use serde::Serialize;
use serde_json::{Map, Value};

use super::http::Request;

/// How many requests are kept.
pub(crate) const CAPACITY: usize = 1000;

#[derive(Serialize)]
struct Line<'a> {
    seq: u64,
    /// Milliseconds since the server started.
    ms: u64,
    /// When it was answered, microseconds since the Unix epoch by this host's clock (to
    /// line the log up with a client's own clock, as an audit log's timestamps are).
    unix_us: u64,
    method: &'a str,
    path: &'a str,
    #[serde(skip_serializing_if = "Map::is_empty")]
    query: Map<String, Value>,
    verb: Option<&'a str>,
    /// The authenticated user (absent when the request was not authenticated).
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a str>,
    status: Option<u16>,
    fault: Option<String>,
    /// A pod create's `metadata.name` (absent for other requests and generateName creates).
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

/// The `metadata.name` a create's body asks for, if it is a JSON object that has one.
fn created_name(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Meta {
        name: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Obj {
        metadata: Option<Meta>,
    }
    serde_json::from_slice::<Obj>(body).ok()?.metadata?.name
}

/// A ring of rendered log lines.
pub(crate) struct RequestLog {
    started: Instant,
    seq: u64,
    lines: VecDeque<String>,
}

/// True for query parameter names that might carry a credential.
fn secret_like(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "token",
        "secret",
        "password",
        "passwd",
        "auth",
        "key",
        "credential",
    ]
    .iter()
    .any(|w| n.contains(w))
}

impl RequestLog {
    pub(crate) fn new() -> Self {
        RequestLog {
            started: Instant::now(),
            seq: 0,
            lines: VecDeque::with_capacity(CAPACITY),
        }
    }

    /// Records one request (the oldest line goes once there are `CAPACITY`).
    pub(crate) fn push(
        &mut self,
        req: &Request,
        verb: Option<&str>,
        user: Option<&str>,
        status: Option<u16>,
        fault: Option<String>,
    ) {
        self.seq += 1;
        let query = req
            .query
            .iter()
            .map(|(k, v)| {
                let v = if secret_like(k) {
                    "REDACTED"
                } else {
                    v.as_str()
                };
                (k.clone(), Value::String(v.to_string()))
            })
            .collect();
        let line = Line {
            seq: self.seq,
            ms: self.started.elapsed().as_millis() as u64,
            unix_us: (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH))
                .map_or(0, |d| d.as_micros() as u64),
            method: &req.method,
            path: &req.path,
            query,
            verb,
            user,
            status,
            fault,
            name: if verb == Some("create") {
                created_name(&req.body)
            } else {
                None
            },
        };
        if self.lines.len() == CAPACITY {
            self.lines.pop_front();
        }
        self.lines
            .push_back(serde_json::to_string(&line).unwrap_or_default());
    }

    /// The lines, oldest first, each ending in a newline.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        for l in &self.lines {
            out.push_str(l);
            out.push('\n');
        }
        out
    }
}
