//! Kubernetes' Protobuf encoding of a pod list (`Accept: application/vnd.kubernetes.protobuf`,
//! what client-go's typed clients ask for built-in types), decoded into the same raw pod
//! values the JSON decoder makes, so that both go through one classification
//! (`Snapshot::add_pod`) and a pod reads the same whichever way it came.
//!
//! The wire format (kubernetes/apimachinery `pkg/runtime/serializer/protobuf/protobuf.go`):
//! the 4 bytes `k8s\0`, then a `runtime.Unknown` message (field 1 `typeMeta` {1 apiVersion,
//! 2 kind}, 2 `raw`, 3 `contentEncoding`, 4 `contentType`) whose `raw` is the `v1.PodList`
//! message (1 `metadata` ListMeta {2 resourceVersion, 3 continue}, 2 `items` Pod). The field
//! numbers below are those of `k8s.io/api/core/v1/generated.proto` and
//! `k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto` (unchanged since Kubernetes 1.30;
//! later versions only add fields, which are skipped).
//!
//! Only the fields the snapshot needs are read; every other field is skipped by its length
//! without being decoded (`managedFields`, the pod spec's bulk). Strings are borrowed from the
//! body. Proto2 writes non-pointer Go fields even when empty, where JSON leaves them out
//! (`omitempty`): an empty string here reads as absent, and a zero-length `Time` as no time
//! (apimachinery's `Time.ProtoTime`), so both encodings give the same values.
//!
//! The wire reading itself is `crate::wire::protobuf` (pure; the client reads error
//! `Status` bodies with it too).
//!
//! Errors (a string saying what and where): the prefix or envelope missing, a kind other than
//! `PodList`, a content encoding set, a truncated or overlong varint or length, wire types 3
//! and 4 (groups), a known field with the wrong wire type, a string that is not UTF-8, a label
//! or annotation key given twice, more than [`json::MAX_LIST`] containers or conditions in
//! one pod.

use super::json::{Capped, Checked, MAX_LIST};
use super::stream::{Fail, Page, Sink, Stream, MAX_VALUE};
use super::{
    OurAnnotations, OurLabels, Picked, RawCondition, RawContainer, RawContainerState,
    RawContainerStatus, RawMeta, RawPod, RawReason, RawSpec, RawStatus, RawTerminated, Stamp, Str,
};
use crate::wire::protobuf::{self as wire, bytes, each, number, text, Field};
use std::borrow::Cow;
use std::io::Read;

/// The string field `what`, borrowed; empty reads as absent (JSON's `omitempty`).
fn string<'a>(v: Field<'a>, what: &str) -> Result<Option<Str<'a>>, String> {
    let s = text(v, what)?;
    Ok((!s.is_empty()).then_some(Str(Cow::Borrowed(s))))
}

/// Decodes the length-delimited field `what` with `decode` and appends it to a capped list
/// (at most [`MAX_LIST`] elements, as the JSON decoder allows).
fn push<'a, T>(
    list: &mut Option<Capped<T>>,
    v: Field<'a>,
    decode: fn(&'a [u8]) -> Result<T, String>,
    what: &str,
) -> Result<(), String> {
    let x = decode(bytes(v, what)?)?;
    let l = list.get_or_insert_with(|| Capped(Vec::new()));
    if l.0.len() == MAX_LIST {
        return Err(format!("more than {MAX_LIST} {what} in one pod"));
    }
    l.0.push(x);
    Ok(())
}

/// Errors unless the envelope's kind is `PodList` (a Protobuf list is never kubectl's
/// `List`: that one is only ever a file, in JSON or YAML).
pub(super) fn check_kind(kind: Option<&str>) -> Result<(), String> {
    match kind {
        Some("PodList") => Ok(()),
        Some(k) => Err(format!(
            "kind is {:?}, expected \"PodList\"",
            super::clip(k)
        )),
        None => Err("no kind in the Protobuf envelope, expected \"PodList\"".into()),
    }
}

/// The `continue` token (field 3) of one `ListMeta` message: `None` when the message has
/// none, `Some(None)` when it is empty (the last page). A later `ListMeta` with a token
/// replaces an earlier one, as proto2 merges repeated messages.
pub(super) fn list_continue(buf: &[u8]) -> Result<Option<Option<Str<'_>>>, String> {
    let mut cont = None;
    each(buf, |n, v| {
        if n == 3 {
            cont = Some(string(v, "metadata.continue")?);
        }
        Ok(())
    })?;
    Ok(cont)
}

/// A `v1.Pod`: metadata 1 (exactly once), spec 2, status 3 (at most once each), nothing
/// else; only the fields the snapshot reads are decoded.
pub(super) fn pod(buf: &[u8]) -> Result<RawPod<'_>, String> {
    let mut p = RawPod::default();
    each(buf, |num, v| {
        let twice = match num {
            1 => p
                .metadata
                .replace(object_meta(bytes(v, "metadata")?)?)
                .is_some(),
            2 => p.spec.replace(spec(bytes(v, "spec")?)?).is_some(),
            3 => p.status.replace(status(bytes(v, "status")?)?).is_some(),
            n => {
                return Err(format!(
                    "a Pod has no field {n} (metadata 1, spec 2, status 3)"
                ))
            }
        };
        match twice {
            true => Err(format!("Pod field {num} given twice")),
            false => Ok(()),
        }
    })?;
    match p.metadata {
        Some(_) => Ok(p),
        None => Err("a Pod without metadata".to_string()),
    }
}

/// One `Pod` object (`GET …/pods/NAME` in Protobuf, prefix included). Errors: see
/// [`pod`]; an envelope that is not exactly one `Pod`.
pub(super) fn pod_object(body: &[u8]) -> Result<RawPod<'_>, String> {
    let (kind, raw) = wire::envelope(body)?;
    match kind {
        Some("Pod") => pod(raw),
        k => Err(format!(
            "kind is {:?}, expected \"Pod\"",
            super::clip(k.unwrap_or(""))
        )),
    }
}

/// A `meta.v1.Time` (seconds 1, nanos 2) as ms since the Unix epoch; `None` for the zero
/// time (a 0-length message) or a time before the epoch.
fn time_ms(buf: &[u8]) -> Result<Option<u64>, String> {
    let (mut secs, mut nanos) = (0i64, 0i64);
    each(buf, |num, v| {
        match num {
            1 => secs = number(v, "Time.seconds")? as i64,
            2 => nanos = i64::from(number(v, "Time.nanos")? as i32),
            _ => {}
        }
        Ok(())
    })?;
    if buf.is_empty() || secs < 0 {
        return Ok(None);
    }
    let ms = (secs as u64)
        .checked_mul(1000)
        .map(|m| m + (nanos.max(0) as u64) / 1_000_000);
    Ok(ms)
}

/// A `meta.v1.ObjectMeta`: name 1, uid 5, resourceVersion 6, creationTimestamp 8,
/// deletionTimestamp 9, deletionGracePeriodSeconds 10, labels 11, annotations 12.
fn object_meta(buf: &[u8]) -> Result<RawMeta<'_>, String> {
    let mut m = RawMeta::default();
    let (mut labels, mut annotations) = (OurLabels::default(), OurAnnotations::default());
    let (mut label_keys, mut annotation_keys) = (Vec::new(), Vec::new());
    each(buf, |num, v| {
        match num {
            1 => m.name = string(v, "metadata.name")?,
            5 => m.uid = string(v, "metadata.uid")?,
            6 => m.resource_version = string(v, "metadata.resourceVersion")?,
            8 => m.creation_ms = time_ms(bytes(v, "metadata.creationTimestamp")?)?,
            9 => m.deletion_timestamp = Some(Stamp(time_ms(bytes(v, "deletionTimestamp")?)?)),
            10 => m.deletion_grace_period_seconds = Some(number(v, "deletionGracePeriod")? as i64),
            11 => label_keys.push(pick(&mut labels, bytes(v, "metadata.labels")?, "label")?),
            12 => annotation_keys.push(pick(
                &mut annotations,
                bytes(v, "metadata.annotations")?,
                "annotation",
            )?),
            _ => {}
        }
        Ok(())
    })?;
    unique(label_keys, "label")?;
    unique(annotation_keys, "annotation")?;
    m.labels = Some(labels);
    m.annotations = Some(annotations);
    Ok(m)
}

/// Errors when a map's `keys` hold one twice (the API server never sends that; the JSON
/// decoder refuses it too, so a pod never reads differently between two clients).
fn unique(mut keys: Vec<&[u8]>, what: &str) -> Result<(), String> {
    keys.sort_unstable();
    match keys.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(format!(
            "{what} {:?} given twice",
            super::clip(&String::from_utf8_lossy(w[0]))
        )),
        None => Ok(()),
    }
}

/// One `map<string, string>` entry (key 1, value 2): its value goes into `picked` when its
/// key is one of `K::KEYS`. Returns the key.
fn pick<'a, const N: usize, K: super::Keys<N>>(
    picked: &mut Picked<'a, N, K>,
    entry: &'a [u8],
    what: &str,
) -> Result<&'a [u8], String> {
    let (mut key, mut value) = (&[][..], None);
    each(entry, |num, v| {
        match num {
            1 => key = bytes(v, what)?,
            2 => value = string(v, what)?,
            _ => {}
        }
        Ok(())
    })?;
    if let Some(i) = K::KEYS.iter().position(|want| want.as_bytes() == key) {
        // An empty value is a value (`spark-exec-id=""` is a bad id, not a missing label).
        picked.0[i] = Some(value.unwrap_or(Str(Cow::Borrowed(""))));
    }
    Ok(key)
}

/// The message `T` of `buf`: each field (its number and value) goes to `field`, which
/// skips the numbers it does not read ([`each`] still checks them).
fn message<'a, T: Default>(
    buf: &'a [u8],
    mut field: impl FnMut(&mut T, u64, Field<'a>) -> Result<(), String>,
) -> Result<T, String> {
    let mut t = T::default();
    each(buf, |num, v| field(&mut t, num, v))?;
    Ok(t)
}

/// A `v1.PodSpec`: containers 2, nodeName 10, initContainers 20, schedulingGates 38.
fn spec(buf: &[u8]) -> Result<RawSpec<'_>, String> {
    message(buf, |s: &mut RawSpec<'_>, num, v| {
        match num {
            2 => push(&mut s.containers, v, container, "containers")?,
            10 => s.node_name = string(v, "spec.nodeName")?,
            20 => push(&mut s.init_containers, v, container, "initContainers")?,
            38 => push(
                &mut s.scheduling_gates,
                v,
                |_| Ok(Checked),
                "schedulingGates",
            )?,
            _ => {}
        }
        Ok(())
    })
}

/// A `v1.Container`: name 1, restartPolicy 24.
fn container(buf: &[u8]) -> Result<RawContainer<'_>, String> {
    message(buf, |c: &mut RawContainer<'_>, num, v| {
        match num {
            1 => c.name = string(v, "container name")?,
            24 => c.restart_policy = string(v, "container restartPolicy")?,
            _ => {}
        }
        Ok(())
    })
}

/// A `v1.PodStatus`: phase 1, conditions 2, reason 4, containerStatuses 8,
/// initContainerStatuses 10.
fn status(buf: &[u8]) -> Result<RawStatus<'_>, String> {
    message(buf, |s: &mut RawStatus<'_>, num, v| {
        match num {
            1 => s.phase = string(v, "status.phase")?,
            2 => push(&mut s.conditions, v, condition, "conditions")?,
            4 => s.reason = string(v, "status.reason")?,
            8 => push(
                &mut s.container_statuses,
                v,
                container_status,
                "containerStatuses",
            )?,
            10 => push(
                &mut s.init_container_statuses,
                v,
                container_status,
                "initContainerStatuses",
            )?,
            _ => {}
        }
        Ok(())
    })
}

/// A `v1.PodCondition`: type 1, status 2, reason 5.
fn condition(buf: &[u8]) -> Result<RawCondition<'_>, String> {
    message(buf, |c: &mut RawCondition<'_>, num, v| {
        match num {
            1 => c.kind = string(v, "condition type")?,
            2 => c.status = string(v, "condition status")?,
            5 => c.reason = string(v, "condition reason")?,
            _ => {}
        }
        Ok(())
    })
}

/// A `v1.ContainerStatus`: name 1, state 2, restartCount 5 (int32), image 6.
fn container_status(buf: &[u8]) -> Result<RawContainerStatus<'_>, String> {
    message(buf, |c: &mut RawContainerStatus<'_>, num, v| {
        match num {
            1 => c.name = string(v, "container status name")?,
            2 => c.state = Some(container_state(bytes(v, "container state")?)?),
            5 => c.restart_count = Some(i64::from(number(v, "restartCount")? as i32)),
            6 => c.image = string(v, "container status image")?,
            _ => {}
        }
        Ok(())
    })
}

/// A `v1.ContainerState`: waiting 1 {reason 1}, running 2, terminated 3 {exitCode 1 (int32),
/// reason 3}; only the one set is on the wire.
fn container_state(buf: &[u8]) -> Result<RawContainerState<'_>, String> {
    message(buf, |s: &mut RawContainerState<'_>, num, v| {
        match num {
            1 => {
                let mut w = RawReason::default();
                each(bytes(v, "waiting")?, |n, v| {
                    if n == 1 {
                        w.reason = string(v, "waiting reason")?;
                    }
                    Ok(())
                })?;
                s.waiting = Some(w);
            }
            2 => {
                bytes(v, "running")?;
                s.running = Some(Checked);
            }
            3 => {
                let mut t = RawTerminated::default();
                each(bytes(v, "terminated")?, |n, v| {
                    match n {
                        1 => t.exit_code = Some(i64::from(number(v, "exitCode")? as i32)),
                        3 => t.reason = string(v, "terminated reason")?,
                        _ => {}
                    }
                    Ok(())
                })?;
                s.terminated = Some(t);
            }
            _ => {}
        }
        Ok(())
    })
}

impl<R: Read> Stream<R> {
    /// A Protobuf varint, which must end within the next `left` bytes of the message.
    fn varint(&mut self, left: u64) -> Result<u64, Fail> {
        let want = left.min(10) as usize;
        self.need(want)?;
        let have = self.rest();
        let mut pos = 0;
        let v = wire::varint(&have[..have.len().min(want)], &mut pos).map_err(Fail::Bad)?;
        self.start += pos;
        Ok(v)
    }

    /// The next `len` bytes, which must lie within the next `left` bytes of the message and
    /// be at most [`MAX_VALUE`]: one item, the list metadata, a small envelope field.
    fn take(&mut self, len: u64, left: u64, num: u64) -> Result<&[u8], Fail> {
        if len > left {
            return Err(past(num, len));
        }
        if len > MAX_VALUE as u64 {
            return Err(Fail::Bad(format!(
                "field {num} at byte {} is over {} MiB (etcd stores objects of at most 1.5 MiB)",
                self.at(),
                MAX_VALUE >> 20
            )));
        }
        let len = len as usize;
        if !self.need(len)? {
            return Err(past(num, len as u64));
        }
        self.start += len;
        Ok(&self.buf[self.start - len..self.start])
    }

    /// The length of a length-delimited field `num` (its key read) that must end within the
    /// next `left` bytes of its message. Errors: another wire type, a length past the message.
    fn len_of(&mut self, num: u64, wire: u64, left: u64, what: &str) -> Result<u64, Fail> {
        match wire {
            2 => {}
            0 | 1 | 5 => {
                return Err(Fail::Bad(format!(
                    "{what} field {num} is not length-delimited"
                )))
            }
            w => {
                return Err(Fail::Bad(format!(
                    "field {num}: wire type {w} is not used by Kubernetes"
                )))
            }
        }
        let at = self.at();
        let len = self.varint(left)?;
        match len > left - (self.at() - at) {
            true => Err(past(num, len)),
            false => Ok(len),
        }
    }
}

/// A field's value that runs past its message or the body.
fn past(num: u64, len: u64) -> Fail {
    Fail::Bad(format!("field {num}: length {len} runs past the message"))
}

/// What a Protobuf page's envelope held (see [`page`]).
#[derive(Default)]
struct Envelope {
    /// `typeMeta.kind`, when given.
    kind: Option<String>,
    /// Which of fields 1–4 were given.
    seen: [bool; 5],
}

/// Reads a Protobuf page (its `k8s\0` prefix consumed) from `s`: the envelope
/// (`runtime.Unknown`) field by field, and inside its `raw` message ([`raw`]) each item as
/// soon as its bytes are in, into `sink`. See the module doc for what is refused.
pub(super) fn page<R: Read>(
    s: &mut Stream<R>,
    page: &mut Page,
    sink: &mut dyn Sink,
) -> Result<(), Fail> {
    let mut env = Envelope::default();
    while s.need(1)? {
        let key = s.varint(u64::MAX)?;
        let (num, wire) = (key >> 3, key & 7);
        if !(1..=4).contains(&num) {
            return Err(Fail::Bad(format!(
                "the envelope (runtime.Unknown) has no field {num}"
            )));
        }
        if std::mem::replace(&mut env.seen[num as usize], true) {
            return Err(Fail::Bad(format!("envelope field {num} given twice")));
        }
        let len = s.len_of(num, wire, u64::MAX, "envelope")?;
        match num {
            1 => {
                let mut kind = None;
                wire::type_meta_kind(s.take(len, len, num)?, &mut kind).map_err(Fail::Bad)?;
                env.kind = kind.map(str::to_string);
            }
            2 => raw(s, len, page, sink)?,
            3 => {
                let v = s.take(len, len, num)?;
                let text = String::from_utf8_lossy(v).into_owned();
                wire::no_content_encoding(&text).map_err(Fail::Bad)?;
            }
            _ => {
                if !s.skip(len)? {
                    return Err(past(num, len));
                }
            }
        }
    }
    check_kind(env.kind.as_deref()).map_err(Fail::Bad)?;
    match env.seen[2] {
        true => Ok(()),
        false => Err(Fail::Bad("no PodList (raw) in the envelope".to_string())),
    }
}

/// The envelope's `raw` message of `len` bytes, a `v1.PodList` (metadata 1, items 2): its
/// pods go to `sink` one by one.
fn raw<R: Read>(
    s: &mut Stream<R>,
    len: u64,
    page: &mut Page,
    sink: &mut dyn Sink,
) -> Result<(), Fail> {
    let end = s.at().saturating_add(len);
    while s.at() < end {
        let key = s.varint(end - s.at())?;
        let (num, wire) = (key >> 3, key & 7);
        if !matches!(num, 1 | 2) {
            return Err(Fail::Bad(format!(
                "a PodList has no field {num} (metadata 1, items 2)"
            )));
        }
        let len = s.len_of(num, wire, end - s.at(), "PodList")?;
        let left = end - s.at();
        let v = s.take(len, left, num)?;
        if num == 1 {
            if page.cont.is_some() {
                return Err(Fail::Bad("PodList metadata given twice".to_string()));
            }
            let cont = list_continue(v).map_err(Fail::Bad)?;
            page.cont = Some(cont.flatten().map(Str::into_owned));
        } else {
            sink.pod(pod(v).map_err(Fail::Bad)?);
        }
    }
    Ok(())
}
#[cfg(test)]
pub(super) mod tests {
    use super::super::json::tests::{cases, mangle};
    use super::super::stream::tests::{check_agrees, failed_reads_add_nothing, Trickle, SIZES};
    use super::super::stream::{Page, Sink, Stream, START_BUFFER};
    use super::super::{ExecutorState, For, RawPod, Snapshot};
    use proptest::prelude::*;

    /// A field for the test encoder.
    pub(in crate::engine::snapshot) enum V<'a> {
        S(&'a str),
        N(u64),
        M(Vec<u8>),
    }

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// A message of `fields` (number, value), as gogo's generated code writes them.
    pub(in crate::engine::snapshot) fn msg(fields: Vec<(u64, V<'_>)>) -> Vec<u8> {
        let mut out = Vec::new();
        for (n, v) in fields {
            let (wire, payload) = match v {
                V::N(x) => (0, {
                    let mut b = Vec::new();
                    varint(x, &mut b);
                    b
                }),
                V::S(s) => (2, s.as_bytes().to_vec()),
                V::M(m) => (2, m),
            };
            varint(n << 3 | wire, &mut out);
            if wire == 2 {
                varint(payload.len() as u64, &mut out);
            }
            out.extend(payload);
        }
        out
    }

    fn entry(k: &str, v: &str) -> V<'static> {
        V::M(msg(vec![(1, V::S(k)), (2, V::S(v))]))
    }

    /// An executor pod the way kube-apiserver encodes one: "always" fields written even when
    /// empty (nodeName, status.reason, an empty creationTimestamp on a deleted one's lastState).
    pub(in crate::engine::snapshot) fn pod(
        id: &str,
        phase: &str,
        terminated: Option<(i64, &str)>,
        deleting: bool,
    ) -> Vec<u8> {
        let mut meta = vec![
            (
                1,
                V::S(Box::leak(format!("app-exec-{id}").into_boxed_str())),
            ),
            (2, V::S("")),
            (3, V::S("ns")),
            (5, V::S("uid-1")),
            (6, V::S("42")),
            (7, V::N(0)),
            (8, V::M(msg(vec![(1, V::N(1_767_225_600))]))),
        ];
        if deleting {
            meta.push((9, V::M(msg(vec![(1, V::N(1_767_225_660))]))));
            meta.push((10, V::N(30)));
        }
        meta.push((11, entry("spark-app-selector", "app")));
        meta.push((11, entry("spark-exec-id", id)));
        meta.push((11, entry("spark-role", "executor")));
        meta.push((
            12,
            entry("controller.kubernetes.io/pod-deletion-cost", "-5"),
        ));
        meta.push((17, V::M(b"{\"f:metadata\":{}}".to_vec())));
        let container = msg(vec![(1, V::S("executor")), (2, V::S("img"))]);
        let spec = msg(vec![(2, V::M(container)), (10, V::S("node-1"))]);
        let state = match terminated {
            Some((code, reason)) => msg(vec![(
                3,
                V::M(msg(vec![
                    (1, V::N(code as u64)),
                    (2, V::N(0)),
                    (3, V::S(reason)),
                ])),
            )]),
            None => msg(vec![(2, V::M(msg(vec![(1, V::M(Vec::new()))])))]),
        };
        let cs = msg(vec![
            (1, V::S("executor")),
            (2, V::M(state)),
            (3, V::M(Vec::new())),
            (4, V::N(0)),
            (5, V::N(2)),
            (6, V::S("img")),
        ]);
        let cond = msg(vec![
            (1, V::S("PodScheduled")),
            (2, V::S("True")),
            (5, V::S("")),
        ]);
        let status = msg(vec![
            (1, V::S(phase)),
            (2, V::M(cond)),
            (3, V::S("")),
            (4, V::S("")),
            (8, V::M(cs)),
        ]);
        msg(vec![
            (1, V::M(msg(meta))),
            (2, V::M(spec)),
            (3, V::M(status)),
        ])
    }

    /// The same pod as the API server writes it in JSON (empty fields left out).
    fn pod_json(id: &str, phase: &str, terminated: Option<(i64, &str)>, deleting: bool) -> String {
        let state = match terminated {
            Some((c, r)) => format!(r#"{{"terminated":{{"exitCode":{c},"reason":"{r}"}}}}"#),
            None => r#"{"running":{}}"#.to_string(),
        };
        let del = match deleting {
            true => {
                r#","deletionTimestamp":"2026-01-01T00:01:00Z","deletionGracePeriodSeconds":30"#
            }
            false => "",
        };
        format!(
            r#"{{"metadata":{{"name":"app-exec-{id}","namespace":"ns","uid":"uid-1","resourceVersion":"42","creationTimestamp":"2026-01-01T00:00:00Z"{del},"labels":{{"spark-app-selector":"app","spark-exec-id":"{id}","spark-role":"executor"}},"annotations":{{"controller.kubernetes.io/pod-deletion-cost":"-5"}}}},"spec":{{"containers":[{{"name":"executor","image":"img"}}],"nodeName":"node-1"}},"status":{{"phase":"{phase}","conditions":[{{"type":"PodScheduled","status":"True"}}],"containerStatuses":[{{"name":"executor","state":{state},"lastState":{{}},"ready":false,"restartCount":2,"image":"img"}}]}}}}"#
        )
    }

    pub(in crate::engine::snapshot) fn list(items: &[Vec<u8>], cont: &str) -> Vec<u8> {
        let mut l = vec![(
            1,
            V::M(msg(vec![(1, V::S("")), (2, V::S("7")), (3, V::S(cont))])),
        )];
        l.extend(items.iter().map(|i| (2, V::M(i.clone()))));
        let tm = msg(vec![(1, V::S("v1")), (2, V::S("PodList"))]);
        let unknown = msg(vec![
            (1, V::M(tm)),
            (2, V::M(msg(l))),
            (3, V::S("")),
            (4, V::S("")),
        ]);
        [b"k8s\0".to_vec(), unknown].concat()
    }

    pub(in crate::engine::snapshot) type Case = (
        &'static str,
        &'static str,
        Option<(i64, &'static str)>,
        bool,
    );
    pub(in crate::engine::snapshot) const CASES: [Case; 4] = [
        ("1", "Running", None, false),
        ("2", "Failed", Some((137, "OOMKilled")), false),
        ("3", "Running", Some((-1, "Error")), false),
        ("4", "Running", None, true),
    ];

    #[test]
    fn a_protobuf_page_reads_as_its_json_twin() {
        let items: Vec<_> = CASES.iter().map(|c| pod(c.0, c.1, c.2, c.3)).collect();
        let jsons: Vec<_> = CASES.iter().map(|c| pod_json(c.0, c.1, c.2, c.3)).collect();
        let json = format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"7","continue":"next"}},"items":[{}]}}"#,
            jsons.join(",")
        );
        let (mut a, mut b) = (Snapshot::default(), Snapshot::default());
        let ca = a.add_page(&list(&items, "next"), "app").unwrap();
        let cb = b.add_page(json.as_bytes(), "app").unwrap();
        assert_eq!(ca.as_deref(), Some("next"));
        assert_eq!(ca, cb);
        assert_eq!(a, b);
        assert_eq!(a.executors.len(), 4);
        assert_eq!(a.executors[&3].reason.as_deref(), Some("exit code -1"));
        assert_eq!(a.executors[&4].deletion_grace_ms, Some(30_000));
        assert_eq!(a.executors[&1].created_ms, Some(1_767_225_600_000));
    }

    #[test]
    fn a_protobuf_page_read_as_it_arrives_reads_as_a_whole_one() {
        let items: Vec<_> = CASES.iter().map(|c| pod(c.0, c.1, c.2, c.3)).collect();
        let body = list(&items, "next");
        let (mut a, mut b) = (Snapshot::default(), Snapshot::default());
        let ca = a.read_page(Trickle::new(&body, 1), APP).unwrap();
        let cb = b.add_page(&body, "app").unwrap();
        assert_eq!((ca, &a), (cb, &b));
        assert_eq!(a.executors.len(), 4);
        // And a JSON page still streams after the four bytes peeked at.
        let mut c = Snapshot::default();
        let json = br#"{"kind":"PodList","items":[]}"#;
        assert_eq!(c.read_page(Trickle::new(json, 1), APP).unwrap(), None);
        let short = c.read_page(Trickle::new(b"k8", 1), APP).unwrap_err();
        assert!(short.to_string().contains("JSON"), "{short}");
    }

    #[test]
    fn an_empty_last_page_has_no_continue_token() {
        let mut s = Snapshot::default();
        assert_eq!(s.add_page(&list(&[], ""), "app").unwrap(), None);
        assert!(s.executors.is_empty());
    }

    #[test]
    fn wrong_kinds_envelopes_and_duplicate_labels_are_malformed() {
        let status = {
            let tm = msg(vec![(1, V::S("v1")), (2, V::S("Status"))]);
            [
                b"k8s\0".to_vec(),
                msg(vec![(1, V::M(tm)), (2, V::M(Vec::new()))]),
            ]
            .concat()
        };
        let mut twice = pod("1", "Running", None, false);
        let extra = msg(vec![(
            1,
            V::M(msg(vec![
                (11, entry("team", "a")),
                (11, entry("team", "b")),
            ])),
        )]);
        twice.extend(extra);
        for (body, why) in [
            (status, "kind is \"Status\""),
            (b"k8s\0\x0a\x05".to_vec(), "runs past"),
            (b"k8s\0\x0b".to_vec(), "wire type 3"),
            (list(&[twice], ""), "label \"team\" given twice"),
            (list(&[b"\x0a\x02\xff\xff".to_vec()], ""), "runs past"),
        ] {
            let err = Snapshot::default()
                .add_page(&body, "app")
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    proptest! {
        /// Any byte changed and the page cut anywhere: it decodes or fails with an error, never
        /// a panic, and never yields more executors than the page holds.
        #[test]
        fn mangled_pages_never_panic(cut in 0usize..2000, at in 0usize..2000, byte in any::<u8>()) {
            let items: Vec<_> = CASES.iter().map(|c| pod(c.0, c.1, c.2, c.3)).collect();
            let mut body = list(&items, "next");
            let at = at % body.len();
            body[at] = byte;
            body.truncate(body.len() - cut % body.len());
            let mut s = Snapshot::default();
            if s.add_page(&body, "app").is_ok() {
                prop_assert!(s.executors.len() <= 4);
            }
        }
    }

    /// App `app`, the app of these tests' pods.
    const APP: For<'static> = For {
        app_id: "app",
        container: None,
        source: super::super::ListSource::ApiServer,
    };

    /// R8: one changed byte in a Protobuf list (the tag of the envelope's `raw`, made an
    /// unknown field's and skipped) read six running pods as none, and five more were
    /// created. Now any one byte changed (each bit of each byte flipped in turn) gives an
    /// error, or a page that still reads at least five of the six pods, five of them running:
    /// one byte can spoil one pod, never the list.
    #[test]
    fn one_changed_byte_never_reads_six_pods_as_fewer_than_five() {
        let ids = ["1", "2", "3", "4", "5", "6"];
        let items: Vec<_> = ids
            .iter()
            .map(|id| pod(id, "Running", None, false))
            .collect();
        let body = list(&items, "");
        let mut whole = Snapshot::default();
        whole.add_page(&body, "app").unwrap();
        assert_eq!(whole.count(ExecutorState::Running), 6);
        let raw_tag = 6 + usize::from(body[5]);
        assert_eq!(body[raw_tag], 0x12, "raw is field 2, length-delimited");
        let mut refused = 0;
        for at in 0..body.len() {
            for bit in 0..8 {
                let mut b = body.clone();
                b[at] ^= 1 << bit;
                let mut s = Snapshot::default();
                match s.add_page(&b, "app") {
                    Ok(_) => assert!(
                        s.executors.len() >= 5 && s.count(ExecutorState::Running) >= 5,
                        "byte {at} bit {bit}: {:?}",
                        s.executors.values().map(|p| p.state).collect::<Vec<_>>()
                    ),
                    Err(_) => refused += 1,
                }
            }
        }
        assert!(refused > 0);
        // The report's byte: `raw` (0x12) as field 5 (0x2a) or contentType (0x22).
        for tag in [0x2a, 0x22, 0x1a] {
            let mut b = body.clone();
            b[raw_tag] = tag;
            let e = Snapshot::default().add_page(&b, "app").unwrap_err();
            assert!(e.to_string().contains("not a PodList"), "{tag:#x}: {e}");
        }
    }

    /// A list whose shape is not exactly a `PodList` is refused, not read short.
    #[test]
    fn fields_outside_the_list_shapes_are_errors() {
        let one = || pod_list(&["1"], "");
        for (body, why) in [
            (envelope(vec![(1, tm("PodList"))]), "no PodList (raw)"),
            (
                envelope(vec![(1, tm("PodList")), (2, one()), (5, V::S(""))]),
                "has no field 5",
            ),
            (
                envelope(vec![(1, tm("PodList")), (2, one()), (2, one())]),
                "field 2 given twice",
            ),
            (
                envelope(vec![
                    (1, tm("PodList")),
                    (2, V::M(msg(vec![(3, V::S("x"))]))),
                ]),
                "a PodList has no field 3",
            ),
            (
                envelope(vec![
                    (1, tm("PodList")),
                    (2, V::M(msg(vec![(2, V::M(msg(vec![(4, V::S("x"))])))]))),
                ]),
                "a Pod has no field 4",
            ),
            (
                envelope(vec![
                    (1, tm("PodList")),
                    (2, V::M(msg(vec![(2, V::M(Vec::new()))]))),
                ]),
                "a Pod without metadata",
            ),
        ] {
            let e = Snapshot::default().add_page(&body, "app").unwrap_err();
            assert!(e.to_string().contains(why), "{why}: {e}");
        }
    }

    /// One Pod object (a GET by name) in Protobuf reads as its list twin.
    #[test]
    fn a_protobuf_pod_object_reads_as_a_listed_pod() {
        let tm = msg(vec![(1, V::S("v1")), (2, V::S("Pod"))]);
        let one = pod("2", "Failed", Some((137, "OOMKilled")), false);
        let body = [
            b"k8s\0".to_vec(),
            msg(vec![(1, V::M(tm)), (2, V::M(one.clone()))]),
        ]
        .concat();
        let mut a = Snapshot::default();
        a.read_pod(&body, APP).unwrap();
        let mut b = Snapshot::default();
        b.add_page(&list(&[one], ""), "app").unwrap();
        assert_eq!(a, b);
        let e = Snapshot::default()
            .read_pod(&list(&[], ""), APP)
            .unwrap_err();
        assert!(e.to_string().contains("expected \"Pod\""), "{e}");
    }

    /// The four executor pods of these tests, as kube-apiserver encodes them, in one page
    /// whose continue token is `next`.
    fn pb_page() -> Vec<u8> {
        let items: Vec<_> = CASES.iter().map(|c| pod(c.0, c.1, c.2, c.3)).collect();
        list(&items, "next")
    }

    /// A Protobuf body of the given envelope fields (typeMeta, raw, …).
    fn envelope(fields: Vec<(u64, V<'_>)>) -> Vec<u8> {
        [b"k8s\0".to_vec(), msg(fields)].concat()
    }

    /// `typeMeta` with kind `kind`.
    fn tm(kind: &'static str) -> V<'static> {
        V::M(msg(vec![(1, V::S("v1")), (2, V::S(kind))]))
    }

    /// A `v1.PodList` message of `items`, continue token `cont`.
    fn pod_list(items: &[&str], cont: &'static str) -> V<'static> {
        let mut l = vec![(1, V::M(msg(vec![(3, V::S(cont))])))];
        for id in items {
            l.push((2, V::M(pod(id, "Running", None, false))));
        }
        V::M(msg(l))
    }

    /// Protobuf pages the envelope reader has to get right: field order, repeated fields,
    /// skipped ones of every wire type, faults inside and outside `raw`.
    fn pb_bodies() -> Vec<Vec<u8>> {
        let big = "x".repeat(70_000);
        let big: &'static str = Box::leak(big.into_boxed_str());
        vec![
            pb_page(),
            list(&[], ""),
            envelope(vec![(1, tm("PodList")), (2, pod_list(&["4", "4"], ""))]),
            // raw before typeMeta; metadata after the items; metadata twice.
            envelope(vec![(2, pod_list(&["1", "2"], "a")), (1, tm("PodList"))]),
            envelope(vec![
                (1, tm("PodList")),
                (
                    2,
                    V::M(msg(vec![
                        (2, V::M(pod("5", "Running", None, false))),
                        (1, V::M(msg(vec![(3, V::S("late"))]))),
                    ])),
                ),
            ]),
            envelope(vec![
                (1, tm("PodList")),
                (
                    2,
                    V::M(msg(vec![
                        (1, V::M(msg(vec![(3, V::S("late"))]))),
                        (1, V::M(msg(vec![(2, V::S("9"))]))),
                    ])),
                ),
            ]),
            // Two raw messages.
            envelope(vec![
                (1, tm("PodList")),
                (2, V::M(b"\x12\x05\xff".to_vec())),
                (2, pod_list(&["6"], "b")),
            ]),
            // Kinds: wrong, none, given twice, emptied.
            envelope(vec![(1, tm("Status")), (2, pod_list(&["1"], ""))]),
            envelope(vec![(2, pod_list(&["1"], ""))]),
            envelope(vec![
                (1, tm("Status")),
                (1, tm("PodList")),
                (2, pod_list(&[], "")),
            ]),
            envelope(vec![(1, tm("")), (2, pod_list(&[], ""))]),
            // A content encoding; a content type larger than a buffer; fields of every wire
            // type after the envelope.
            envelope(vec![
                (1, tm("PodList")),
                (2, pod_list(&["1"], "")),
                (3, V::S("gzip")),
            ]),
            envelope(vec![
                (1, tm("PodList")),
                (2, pod_list(&["1"], "")),
                (4, V::S(big)),
            ]),
            [
                envelope(vec![(1, tm("PodList")), (2, pod_list(&["1"], ""))]),
                b"\x29\x01\x02\x03\x04\x05\x06\x07\x08\x35\x01\x02\x03\x04\x30\x96\x01".to_vec(),
            ]
            .concat(),
            envelope(vec![(1, tm("PodList")), (2, V::N(5))]),
            envelope(vec![(1, V::N(5)), (2, pod_list(&[], ""))]),
            envelope(vec![(1, tm("PodList")), (2, V::M(msg(vec![(2, V::N(1))])))]),
            envelope(vec![(1, tm("PodList")), (2, V::M(msg(vec![(1, V::N(1))])))]),
            envelope(vec![(1, tm("PodList")), (2, V::M(b"\x0b".to_vec()))]),
            envelope(vec![(1, tm("PodList")), (2, V::M(b"\x12\x80".to_vec()))]),
            b"k8s\0\x0b".to_vec(),
            b"k8s\0\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01".to_vec(),
            b"k8s\0\x12\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01".to_vec(),
            b"k8s\0".to_vec(),
            b"k8s".to_vec(),
        ]
    }

    /// A Protobuf page reads the same at every buffer and read size (one byte at a time
    /// included).
    #[test]
    fn protobuf_pages_read_the_same_at_every_buffer_size() {
        let pb = pb_bodies();
        let ok = |i: usize| Snapshot::default().add_page(&pb[i], "app").is_ok();
        assert!(ok(0) && ok(1) && ok(3) && ok(4) && ok(12));
        assert!(!ok(5) && !ok(6) && !ok(7) && !ok(9) && !ok(10) && !ok(13));
        for (i, body) in pb.iter().enumerate() {
            for sizes in SIZES {
                check_agrees(body, APP, sizes, &format!("pb {i}"));
            }
        }
        let mut s = Snapshot::default();
        let page = pb_page();
        let cont = s.read_sized(Trickle::new(&page, 1), APP, 1);
        assert_eq!(cont.unwrap().as_deref(), Some("next"));
        assert_eq!(s.executors.len(), 4);
    }

    /// A page cut anywhere reads the same at every buffer size; cut inside `raw` (mid-item
    /// included) or after it, it is an error and adds nothing.
    #[test]
    fn a_truncated_protobuf_page_is_an_error() {
        let page = pb_page();
        // `k8s\0`, typeMeta (key, one-byte length, message), then raw; the envelope ends with
        // two empty fields (contentEncoding, contentType), 2 bytes each.
        let raw_start = 6 + usize::from(page[5]);
        for cut in 0..=page.len() {
            let body = &page[..cut];
            for sizes in [(1, 1), (64, 7), (START_BUFFER, 4096)] {
                check_agrees(body, APP, sizes, &format!("cut {cut}"));
            }
            if raw_start < cut && cut < page.len() - 4 {
                let mut s = Snapshot::default();
                let got = s.read_page(body, APP);
                assert!(
                    got.is_err() && s == Snapshot::default(),
                    "cut {cut}: {got:?}"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases(2000)))]
        /// Mangled Protobuf pages (bytes changed, inserted, removed, the end cut) read the
        /// same at any buffer and read size, and never panic.
        #[test]
        fn mangled_protobuf_pages_read_the_same_at_every_buffer_size(
            which in 0usize..25,
            edits in proptest::collection::vec((0.0f64..1.0, 0u8..3, any::<u8>()), 0..4),
            cut in 0.0f64..1.2,
            size in 0usize..5,
        ) {
            let mut body = pb_bodies().swap_remove(which);
            mangle(&mut body, &edits);
            body.truncate(((body.len() as f64) * cut) as usize);
            check_agrees(&body, APP, SIZES[size], "mangled");
        }
    }

    /// Reading a Protobuf page holds one item, not the page: a buffer of 4 KiB decodes
    /// 2,000 pods and skips a 1 MiB envelope field without growing.
    #[test]
    fn protobuf_memory_is_one_item_not_the_page() {
        struct Count(usize);
        impl Sink for Count {
            fn pod(&mut self, _: RawPod<'_>) {
                self.0 += 1;
            }
        }
        let ids: Vec<String> = (1..=2000).map(|i| i.to_string()).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let filler: &'static str = Box::leak("y".repeat(1 << 20).into_boxed_str());
        let body = envelope(vec![
            (1, tm("PodList")),
            (2, pod_list(&ids, "")),
            (4, V::S(filler)),
        ]);
        assert!(body.len() > 1_500_000);
        let mut stream = Stream::new(&body[..], 4096);
        assert!(stream.need(4).is_ok_and(|full| full));
        stream.start = 4;
        let mut count = Count(0);
        assert!(super::page(&mut stream, &mut Page::default(), &mut count).is_ok());
        assert_eq!(count.0, 2000);
        assert_eq!(stream.buf.len(), 4096, "a pod of ~400 bytes fits in 4 KiB");
    }

    /// A read that fails anywhere in a Protobuf page adds nothing of it.
    #[test]
    fn a_failed_read_of_a_protobuf_page_adds_nothing() {
        let body = pb_page();
        let mut s = Snapshot::default();
        s.add_page(&list(&[pod("99", "Running", None, false)], ""), "app")
            .unwrap();
        let fail_ats = [0, 3, 4, 10, body.len() / 2, body.len() - 5, body.len() - 1];
        failed_reads_add_nothing(&mut s, &body, APP, 9, &fail_ats);
    }
}
