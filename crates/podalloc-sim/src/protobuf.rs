//! Kubernetes' Protobuf encoding (`application/vnd.kubernetes.protobuf`) of the pods and
//! error `Status`es the simulator serves, made from their JSON, and the content negotiation
//! that picks it.
//!
//! The wire format is kube-apiserver's (kubernetes/apimachinery
//! `pkg/runtime/serializer/protobuf/protobuf.go`): the 4 bytes `k8s\0`, then a
//! `runtime.Unknown` {1 typeMeta {1 apiVersion, 2 kind}, 2 raw, 3 contentEncoding,
//! 4 contentType} whose `raw` is the object's message (`v1.Pod`, `v1.PodList`, `meta.v1.Status`).
//! Field numbers are those of `k8s.io/api/core/v1/generated.proto` and
//! `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto` (Kubernetes 1.37). As the
//! gogo-protobuf code generated from them does, fields are written in ascending number
//! order, a Go non-pointer field (a plain string, number, bool, struct or `Time`) is written
//! even when empty, a pointer field only when set, a repeated field once per element and a map
//! once per entry, in key order; a `Time` is {1 seconds, 2 nanos = 0} (apimachinery's
//! `Time.ProtoTime` drops the nanoseconds JSON never had), the zero time an empty message.
//!
//! Encoding is driven by the tables below, from the JSON the simulator stores: only the fields
//! they name are encoded. They hold every field podalloc's decoder reads and the commonly set
//! rest of a pod; what they leave out (volumes, affinity, the containers' probes, lifecycle,
//! security contexts and `envFrom`, a variable's `valueFrom` other than `fieldRef`,
//! `managedFields`, `readinessGates`, `dnsConfig`, `overhead`, `topologySpreadConstraints`,
//! `resourceClaims`, the status' resources and resize details) is a deliberate difference
//! from kube-apiserver, listed in `tests/real/README.md`: a client that needs the whole object
//! asks for JSON.
//!
//! Only pods (get, list, and the pod a create, patch or delete answers) and error `Status`es
//! are served in Protobuf; ConfigMaps, Leases, Events, Namespaces, Tables and discovery
//! documents stay JSON whatever the `Accept` (also listed as deliberate).

use std::sync::Arc;

use serde_json::Value;

use super::store::StoredPod;

/// The media type of Kubernetes' Protobuf encoding.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The first bytes of every Protobuf-encoded Kubernetes object.
const MAGIC: &[u8; 4] = b"k8s\0";

/// How one JSON value is written.
#[derive(Clone, Copy)]
enum Ty {
    /// Wire type 2, the UTF-8 string (`""` when absent).
    Str,
    /// Wire type 0, the two's complement of the integer (int32 and int64 alike).
    Int,
    /// Wire type 0, 1 for `true`.
    Bool,
    /// A `meta.v1.Time` {seconds 1, nanos 2} from an RFC 3339 string.
    Time,
    /// An embedded message.
    Msg(&'static [F]),
    /// A `map<string, string>` entry {key 1, value 2} (with [`Presence::Each`]).
    Map,
    /// A `map<string, Quantity>` entry {key 1, value 2 {string 1}} (with [`Presence::Each`]).
    Quantities,
}

/// When a field is written.
#[derive(Clone, Copy, PartialEq)]
enum Presence {
    /// Always (a Go non-pointer field): its zero value when the JSON has none.
    Always,
    /// Only when the JSON has it (a Go pointer).
    Set,
    /// Once per element of the JSON array, or per entry of the JSON object (a map).
    Each,
}

/// One field: its JSON key, its field number, its type, when it is written.
struct F(&'static str, u64, Ty, Presence);

use Presence::{Always as A, Each as E, Set as S};
use Ty::{Bool, Int, Map, Msg, Quantities, Str, Time};

const OWNER_REFERENCE: &[F] = &[
    F("kind", 1, Str, A),
    F("name", 3, Str, A),
    F("uid", 4, Str, A),
    F("apiVersion", 5, Str, A),
    F("controller", 6, Bool, S),
    F("blockOwnerDeletion", 7, Bool, S),
];

const OBJECT_META: &[F] = &[
    F("name", 1, Str, A),
    F("generateName", 2, Str, A),
    F("namespace", 3, Str, A),
    F("selfLink", 4, Str, A),
    F("uid", 5, Str, A),
    F("resourceVersion", 6, Str, A),
    F("generation", 7, Int, A),
    F("creationTimestamp", 8, Time, A),
    F("deletionTimestamp", 9, Time, S),
    F("deletionGracePeriodSeconds", 10, Int, S),
    F("labels", 11, Map, E),
    F("annotations", 12, Map, E),
    F("ownerReferences", 13, Msg(OWNER_REFERENCE), E),
    F("finalizers", 14, Str, E),
];

const RESOURCES: &[F] = &[
    F("limits", 1, Quantities, E),
    F("requests", 2, Quantities, E),
];

const FIELD_REF: &[F] = &[F("apiVersion", 1, Str, A), F("fieldPath", 2, Str, A)];

const ENV_SOURCE: &[F] = &[F("fieldRef", 1, Msg(FIELD_REF), S)];

const ENV_VAR: &[F] = &[
    F("name", 1, Str, A),
    F("value", 2, Str, A),
    F("valueFrom", 3, Msg(ENV_SOURCE), S),
];

const CONTAINER_PORT: &[F] = &[
    F("name", 1, Str, A),
    F("hostPort", 2, Int, A),
    F("containerPort", 3, Int, A),
    F("protocol", 4, Str, A),
    F("hostIP", 5, Str, A),
];

const VOLUME_MOUNT: &[F] = &[
    F("name", 1, Str, A),
    F("readOnly", 2, Bool, A),
    F("mountPath", 3, Str, A),
    F("subPath", 4, Str, A),
    F("mountPropagation", 5, Str, S),
    F("subPathExpr", 6, Str, A),
    F("recursiveReadOnly", 7, Str, S),
];

const CONTAINER: &[F] = &[
    F("name", 1, Str, A),
    F("image", 2, Str, A),
    F("command", 3, Str, E),
    F("args", 4, Str, E),
    F("workingDir", 5, Str, A),
    F("ports", 6, Msg(CONTAINER_PORT), E),
    F("env", 7, Msg(ENV_VAR), E),
    F("resources", 8, Msg(RESOURCES), A),
    F("volumeMounts", 9, Msg(VOLUME_MOUNT), E),
    F("terminationMessagePath", 13, Str, A),
    F("imagePullPolicy", 14, Str, A),
    F("stdin", 16, Bool, A),
    F("stdinOnce", 17, Bool, A),
    F("tty", 18, Bool, A),
    F("terminationMessagePolicy", 20, Str, A),
    F("restartPolicy", 24, Str, S),
];

const POD_SECURITY_CONTEXT: &[F] = &[
    F("runAsUser", 2, Int, S),
    F("runAsNonRoot", 3, Bool, S),
    F("supplementalGroups", 4, Int, E),
    F("fsGroup", 5, Int, S),
    F("runAsGroup", 6, Int, S),
];

const NAME: &[F] = &[F("name", 1, Str, A)];

const TOLERATION: &[F] = &[
    F("key", 1, Str, A),
    F("operator", 2, Str, A),
    F("value", 3, Str, A),
    F("effect", 4, Str, A),
    F("tolerationSeconds", 5, Int, S),
];

const POD_SPEC: &[F] = &[
    F("containers", 2, Msg(CONTAINER), E),
    F("restartPolicy", 3, Str, A),
    F("terminationGracePeriodSeconds", 4, Int, S),
    F("activeDeadlineSeconds", 5, Int, S),
    F("dnsPolicy", 6, Str, A),
    F("nodeSelector", 7, Map, E),
    F("serviceAccountName", 8, Str, A),
    F("serviceAccount", 9, Str, A),
    F("nodeName", 10, Str, A),
    F("hostNetwork", 11, Bool, A),
    F("hostPID", 12, Bool, A),
    F("hostIPC", 13, Bool, A),
    F("securityContext", 14, Msg(POD_SECURITY_CONTEXT), S),
    F("imagePullSecrets", 15, Msg(NAME), E),
    F("hostname", 16, Str, A),
    F("subdomain", 17, Str, A),
    F("schedulerName", 19, Str, A),
    F("initContainers", 20, Msg(CONTAINER), E),
    F("automountServiceAccountToken", 21, Bool, S),
    F("tolerations", 22, Msg(TOLERATION), E),
    F("priorityClassName", 24, Str, A),
    F("priority", 25, Int, S),
    F("shareProcessNamespace", 27, Bool, S),
    F("runtimeClassName", 29, Str, S),
    F("enableServiceLinks", 30, Bool, S),
    F("preemptionPolicy", 31, Str, S),
    F("hostUsers", 37, Bool, S),
    F("schedulingGates", 38, Msg(NAME), E),
];

const CONDITION: &[F] = &[
    F("type", 1, Str, A),
    F("status", 2, Str, A),
    F("lastProbeTime", 3, Time, A),
    F("lastTransitionTime", 4, Time, A),
    F("reason", 5, Str, A),
    F("message", 6, Str, A),
    F("observedGeneration", 7, Int, A),
];

const WAITING: &[F] = &[F("reason", 1, Str, A), F("message", 2, Str, A)];

const RUNNING: &[F] = &[F("startedAt", 1, Time, A)];

const TERMINATED: &[F] = &[
    F("exitCode", 1, Int, A),
    F("signal", 2, Int, A),
    F("reason", 3, Str, A),
    F("message", 4, Str, A),
    F("startedAt", 5, Time, A),
    F("finishedAt", 6, Time, A),
    F("containerID", 7, Str, A),
];

const CONTAINER_STATE: &[F] = &[
    F("waiting", 1, Msg(WAITING), S),
    F("running", 2, Msg(RUNNING), S),
    F("terminated", 3, Msg(TERMINATED), S),
];

const CONTAINER_STATUS: &[F] = &[
    F("name", 1, Str, A),
    F("state", 2, Msg(CONTAINER_STATE), A),
    F("lastState", 3, Msg(CONTAINER_STATE), A),
    F("ready", 4, Bool, A),
    F("restartCount", 5, Int, A),
    F("image", 6, Str, A),
    F("imageID", 7, Str, A),
    F("containerID", 8, Str, A),
    F("started", 9, Bool, S),
];

const IP: &[F] = &[F("ip", 1, Str, A)];

const POD_STATUS: &[F] = &[
    F("phase", 1, Str, A),
    F("conditions", 2, Msg(CONDITION), E),
    F("message", 3, Str, A),
    F("reason", 4, Str, A),
    F("hostIP", 5, Str, A),
    F("podIP", 6, Str, A),
    F("startTime", 7, Time, S),
    F("containerStatuses", 8, Msg(CONTAINER_STATUS), E),
    F("qosClass", 9, Str, A),
    F("initContainerStatuses", 10, Msg(CONTAINER_STATUS), E),
    F("nominatedNodeName", 11, Str, A),
    F("podIPs", 12, Msg(IP), E),
    F("ephemeralContainerStatuses", 13, Msg(CONTAINER_STATUS), E),
    F("resize", 14, Str, A),
    F("hostIPs", 16, Msg(IP), E),
    F("observedGeneration", 17, Int, A),
];

const POD: &[F] = &[
    F("metadata", 1, Msg(OBJECT_META), A),
    F("spec", 2, Msg(POD_SPEC), A),
    F("status", 3, Msg(POD_STATUS), A),
];

const LIST_META: &[F] = &[
    F("selfLink", 1, Str, A),
    F("resourceVersion", 2, Str, A),
    F("continue", 3, Str, A),
    F("remainingItemCount", 4, Int, S),
];

const STATUS_CAUSE: &[F] = &[
    F("reason", 1, Str, A),
    F("message", 2, Str, A),
    F("field", 3, Str, A),
];

const STATUS_DETAILS: &[F] = &[
    F("name", 1, Str, A),
    F("group", 2, Str, A),
    F("kind", 3, Str, A),
    F("causes", 4, Msg(STATUS_CAUSE), E),
    F("retryAfterSeconds", 5, Int, A),
    F("uid", 6, Str, A),
];

const STATUS: &[F] = &[
    F("metadata", 1, Msg(LIST_META), A),
    F("status", 2, Str, A),
    F("message", 3, Str, A),
    F("reason", 4, Str, A),
    F("details", 5, Msg(STATUS_DETAILS), S),
    F("code", 6, Int, A),
];

/// Appends the base-128 varint `v`.
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends field `num` of wire type 2 holding `data`.
fn delimited(out: &mut Vec<u8>, num: u64, data: &[u8]) {
    varint(out, num << 3 | 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// Appends field `num` of wire type 0 holding `v`.
fn number(out: &mut Vec<u8>, num: u64, v: u64) {
    varint(out, num << 3);
    varint(out, v);
}

/// Appends the message of the JSON object `v` (anything else reads as `{}`) as `fields`
/// describe it.
fn message(out: &mut Vec<u8>, v: &Value, fields: &[F]) {
    for F(key, num, ty, presence) in fields {
        let x = v.get(key).filter(|x| !x.is_null());
        match (presence, x) {
            (Presence::Each, Some(Value::Array(items))) => {
                for item in items {
                    one(out, *num, *ty, Some(item));
                }
            }
            (Presence::Each, Some(Value::Object(map))) => {
                // In key order, as gogo sorts map keys.
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_unstable_by_key(|(k, _)| k.as_str());
                for (k, item) in entries {
                    let value = item.as_str().unwrap_or("").as_bytes();
                    let mut entry = Vec::new();
                    delimited(&mut entry, 1, k.as_bytes());
                    if let Quantities = ty {
                        let mut q = Vec::new();
                        delimited(&mut q, 1, value);
                        delimited(&mut entry, 2, &q);
                    } else {
                        delimited(&mut entry, 2, value);
                    }
                    delimited(out, *num, &entry);
                }
            }
            (Presence::Each, _) | (Presence::Set, None) => {}
            (_, x) => one(out, *num, *ty, x),
        }
    }
}

/// Appends one field `num` of type `ty` from `x` (its zero value when `None`). Maps are
/// written by [`message`], entry by entry.
fn one(out: &mut Vec<u8>, num: u64, ty: Ty, x: Option<&Value>) {
    match ty {
        Str => delimited(out, num, x.and_then(Value::as_str).unwrap_or("").as_bytes()),
        Int => {
            let n = x.and_then(|x| x.as_i64().or_else(|| x.as_u64().map(|u| u as i64)));
            number(out, num, n.unwrap_or(0) as u64);
        }
        Bool => number(
            out,
            num,
            u64::from(x.and_then(Value::as_bool) == Some(true)),
        ),
        Time => {
            let mut t = Vec::new();
            if let Some(secs) = x.and_then(Value::as_str).and_then(unix_seconds) {
                number(&mut t, 1, secs);
                number(&mut t, 2, 0);
            }
            delimited(out, num, &t);
        }
        Msg(fields) => {
            let mut m = Vec::new();
            message(&mut m, x.unwrap_or(&Value::Null), fields);
            delimited(out, num, &m);
        }
        Map | Quantities => {}
    }
}

/// Seconds since the Unix epoch of an RFC 3339 time (`2026-01-01T00:00:00Z`, fractions
/// dropped); `None` for anything else or a time before the epoch.
fn unix_seconds(s: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(s).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs())
}

/// `k8s\0` and the `runtime.Unknown` of a `v1` object of `kind` whose message is `raw`.
fn envelope(kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut type_meta = Vec::new();
    delimited(&mut type_meta, 1, b"v1");
    delimited(&mut type_meta, 2, kind.as_bytes());
    let mut out = Vec::with_capacity(raw.len() + 32);
    out.extend_from_slice(MAGIC);
    delimited(&mut out, 1, &type_meta);
    delimited(&mut out, 2, raw);
    delimited(&mut out, 3, b"");
    delimited(&mut out, 4, b"");
    out
}

/// The `v1.Pod` message of a pod's JSON (unparseable JSON reads as `{}`).
fn pod_message(json: &str) -> Vec<u8> {
    let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    let mut out = Vec::with_capacity(json.len() / 2);
    message(&mut out, &v, POD);
    out
}

/// A stored pod's `v1.Pod` message, encoded once per stored version (a stored pod never
/// changes: a write stores a new one), so that a list costs a copy, as in JSON.
fn stored_message(p: &StoredPod) -> &[u8] {
    p.protobuf.get_or_init(|| pod_message(&p.json))
}

/// A `Pod` response body.
pub(crate) fn pod(p: &StoredPod) -> Vec<u8> {
    envelope("Pod", stored_message(p))
}

/// A `PodList` response body: the list's `resourceVersion`, its `continue` token and
/// `remainingItemCount` when set, and the pods, in order.
pub(crate) fn pod_list(
    rv: u64,
    continue_token: Option<&str>,
    remaining: Option<usize>,
    items: &[Arc<StoredPod>],
) -> Vec<u8> {
    let meta = serde_json::json!({"resourceVersion": rv.to_string(),
        "continue": continue_token, "remainingItemCount": remaining});
    let mut list = Vec::new();
    let mut m = Vec::new();
    message(&mut m, &meta, LIST_META);
    delimited(&mut list, 1, &m);
    for p in items {
        delimited(&mut list, 2, stored_message(p));
    }
    envelope("PodList", &list)
}

/// A `Status` response body from the Status' JSON (as `ApiError::to_json` writes it).
pub(crate) fn status(json: &[u8]) -> Vec<u8> {
    let v: Value = serde_json::from_slice(json).unwrap_or(Value::Null);
    let mut out = Vec::new();
    message(&mut out, &v, STATUS);
    envelope("Status", &out)
}

/// The same body with an empty `typeMeta` (the `no-kind` fault); `None` when `body` is not
/// an envelope this module wrote.
pub(crate) fn without_kind(body: &[u8]) -> Option<Vec<u8>> {
    let rest = body.strip_prefix(MAGIC.as_slice())?;
    // Field 1 (tag 0x0a) comes first: skip it, keep the rest.
    let (&tag, mut rest) = rest.split_first()?;
    if tag != 0x0a {
        return None;
    }
    let mut len = 0usize;
    for shift in (0..35).step_by(7) {
        let (&b, r) = rest.split_first()?;
        rest = r;
        len |= usize::from(b & 0x7f) << shift;
        if b < 0x80 {
            let mut out = MAGIC.to_vec();
            delimited(&mut out, 1, &[]);
            out.extend_from_slice(rest.get(len..)?);
            return Some(out);
        }
    }
    None
}

/// Whether an `Accept` header picks Protobuf among what kube-apiserver serves for a built-in
/// kind (JSON, YAML, Protobuf, in that order): the rule of apiserver's
/// `negotiation.NegotiateMediaTypeOptions` over goautoneg's ordering of the clauses. An
/// empty header, `*/*` and `application/*` pick JSON; a clause asking for a conversion
/// (`as=Table`…) or a stream is not this module's to answer (Tables are JSON here).
pub(crate) fn accepted(accept: &str) -> bool {
    for c in clauses(accept) {
        let protobuf = (c.ty, c.sub) == ("application", "vnd.kubernetes.protobuf");
        let served = protobuf
            || (c.ty, c.sub) == ("application", "json")
            || (c.ty, c.sub) == ("application", "yaml")
            || (c.ty == "application" && c.sub == "*")
            || (c.ty, c.sub) == ("*", "*");
        if served {
            let plain = !c.params.iter().any(|(k, _)| *k == "as" || *k == "stream");
            return protobuf && plain;
        }
    }
    false
}

/// One clause of an `Accept` header.
struct Clause<'a> {
    q: f64,
    ty: &'a str,
    sub: &'a str,
    /// Its parameters other than `q`.
    params: Vec<(&'a str, &'a str)>,
}

impl Clause<'_> {
    /// goautoneg's `Less`: a higher `q`, or a concrete type before `*`, or a concrete
    /// subtype before `*` (not a strict order; its insertion sort is what counts).
    fn before(&self, other: &Clause<'_>) -> bool {
        self.q > other.q
            || (self.ty != "*" && other.ty == "*")
            || (self.sub != "*" && other.sub == "*")
    }
}

/// The clauses of an `Accept` header, ordered as goautoneg's `ParseAccept` orders them (an
/// insertion sort by [`Clause::before`]). As goautoneg does, a clause with `q=0` is kept and
/// an unparseable `q` reads as 0.
fn clauses(accept: &str) -> Vec<Clause<'_>> {
    let mut out: Vec<Clause<'_>> = Vec::new();
    for part in accept.split(',') {
        let mut it = part.trim_matches(' ').split(';');
        let media = it.next().unwrap_or("");
        let (ty, sub) = match media.split_once('/') {
            Some((t, s)) if !s.contains('/') => (t.trim_matches(' '), s.trim_matches(' ')),
            None if media.trim_matches(' ') == "*" => ("*", "*"),
            _ => continue,
        };
        let mut c = Clause {
            q: 1.0,
            ty,
            sub,
            params: Vec::new(),
        };
        for p in it {
            let Some((k, v)) = p.split_once('=').filter(|(_, v)| !v.contains('=')) else {
                continue;
            };
            match k.trim_matches(' ') {
                "q" => c.q = v.parse().unwrap_or(0.0),
                k => c.params.push((k, v.trim_matches(' '))),
            }
        }
        out.push(c);
    }
    for i in 1..out.len() {
        let mut j = i;
        while j > 0 && out[j].before(&out[j - 1]) {
            out.swap(j, j - 1);
            j -= 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_follows_kube_apiservers_order() {
        for (accept, protobuf) in [
            ("", false),
            ("application/json", false),
            (MEDIA_TYPE, true),
            (
                "application/vnd.kubernetes.protobuf, application/json;q=0.9",
                true,
            ),
            (
                "application/json, application/vnd.kubernetes.protobuf",
                false,
            ),
            (
                "application/json;q=0.5, application/vnd.kubernetes.protobuf",
                true,
            ),
            ("*/*", false),
            ("application/*", false),
            // goautoneg puts a concrete type before a wildcard whatever their q.
            ("*/*;q=1, application/vnd.kubernetes.protobuf;q=0.1", true),
            (
                "application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1",
                false,
            ),
            ("application/vnd.kubernetes.protobuf;stream=watch", false),
            ("text/html, application/vnd.kubernetes.protobuf", true),
        ] {
            assert_eq!(accepted(accept), protobuf, "{accept:?}");
        }
    }

    #[test]
    fn a_status_is_encoded_as_gogo_writes_it() {
        let json = br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"m","reason":"NotFound","details":{"name":"p","kind":"pods"},"code":404}"#;
        let details = [
            &b"\x0a\x01p\x12\x00\x1a\x04pods"[..],
            b"\x28\x00\x32\x00", // retryAfterSeconds 0, uid ""
        ]
        .concat();
        let raw = [
            &b"\x0a\x06\x0a\x00\x12\x00\x1a\x00"[..], // ListMeta: selfLink, rv, continue
            b"\x12\x07Failure\x1a\x01m\x22\x08NotFound",
            &[0x2a, details.len() as u8],
            &details,
            b"\x30\x94\x03", // code 404
        ]
        .concat();
        let want = [
            &b"k8s\0\x0a\x0c\x0a\x02v1\x12\x06Status\x12"[..],
            &[raw.len() as u8],
            &raw,
            b"\x1a\x00\x22\x00",
        ]
        .concat();
        assert_eq!(status(json), want);
    }

    #[test]
    fn times_ints_and_maps_are_written_as_kubernetes_does() {
        let mut out = Vec::new();
        let v = serde_json::json!({"creationTimestamp": "1970-01-01T00:02:08Z",
            "labels": {"b": "2", "a": "1"}});
        message(&mut out, &v, &OBJECT_META[6..11]);
        let want = [
            &b"\x38\x00"[..],                // generation 0, always written
            b"\x42\x05\x08\x80\x01\x10\x00", // 128 s, 0 ns
            b"\x5a\x06\x0a\x01a\x12\x011",   // labels in key order
            b"\x5a\x06\x0a\x01b\x12\x012",
        ]
        .concat();
        assert_eq!(out, want);
        let mut neg = Vec::new();
        one(&mut neg, 1, Int, Some(&serde_json::json!(-1)));
        assert_eq!(neg, [&[0x08][..], &[0xff; 9], &[0x01]].concat());
        let mut q = Vec::new();
        message(
            &mut q,
            &serde_json::json!({"requests": {"cpu": "1"}}),
            RESOURCES,
        );
        assert_eq!(q, b"\x12\x0a\x0a\x03cpu\x12\x03\x0a\x011");
    }

    #[test]
    fn no_kind_empties_the_type_meta_only() {
        let body = envelope("Pod", &pod_message(r#"{"metadata":{"name":"p"}}"#));
        let bare = without_kind(&body).unwrap();
        assert!(bare.starts_with(b"k8s\0\x0a\x00\x12"));
        assert_eq!(
            body.len() - bare.len(),
            9,
            "typeMeta {{v1, Pod}} is 9 bytes"
        );
        assert!(body.ends_with(&bare[6..]));
        assert_eq!(without_kind(b"{}"), None);
    }
}
