//! A JSON pod list, read while it arrives (`stream.rs`), through `serde_json`: the top-level
//! object key by key, and each pod of `items` decoded by serde_json into the `Raw*` structs
//! as soon as its last byte is in the buffer. Every value is checked as serde_json checks
//! it (what is skipped too, as `IgnoredAny`); escape-free strings are borrowed from the
//! buffer. Errors say where the fault is as `at byte N` of the body.

use std::io::Read;

use serde::de::{self, IgnoredAny, Visitor};
use std::fmt;

use super::stream::{Fail, Page, Sink, Stream};
use super::{check_kind, ListMeta, ListSource, RawPod, Str};

/// A value decoded only to learn that it is there (`spec.schedulingGates` entries, a
/// container's `state.running`), checked in full as serde_json checks what it skips.
pub(super) struct Checked;

impl<'de> de::Deserialize<'de> for Checked {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(d).map(|_| Checked)
    }
}

/// The most elements [`Capped`] takes.
pub(super) const MAX_LIST: usize = 10_000;

/// A list of at most [`MAX_LIST`] elements; more is an error. Memory for one pod then stays
/// bounded by its size times a small factor, whatever a hostile server sends (a 3-byte `[]`
/// decodes to a whole container status).
pub(super) struct Capped<T>(pub(super) Vec<T>);

impl<'a, T> IntoIterator for &'a Capped<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Capped<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: de::Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Capped<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a list of at most {MAX_LIST}")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut a: A) -> Result<Capped<T>, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = a.next_element()? {
                    if out.len() == MAX_LIST {
                        return Err(de::Error::custom(format_args!(
                            "a list of more than {MAX_LIST} containers or conditions in one pod"
                        )));
                    }
                    out.push(x);
                }
                Ok(Capped(out))
            }
        }
        d.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// A decode error of one value: serde_json's message without its line and column, the byte
/// (in the input given to [`from_prefix`]) where it was found, and whether the input ended
/// before the value did.
struct Error {
    message: String,
    offset: usize,
    eof: bool,
}

impl Error {
    fn of(e: &serde_json::Error, input: &[u8]) -> Self {
        let text = e.to_string();
        let message = match text.rfind(" at line ") {
            Some(i) => text[..i].to_string(),
            None => text,
        };
        // serde_json's line (1-based) and column (bytes into the line, the faulty one
        // included) as a byte offset.
        let line_start = match e.line() {
            0 | 1 => 0,
            l => (input.iter().enumerate())
                .filter(|(_, &b)| b == b'\n')
                .nth(l - 2)
                .map_or(input.len(), |(i, _)| i + 1),
        };
        Error {
            message,
            offset: (line_start + e.column()).saturating_sub(1).min(input.len()),
            eof: e.is_eof(),
        }
    }
}

/// Decodes one `T` from the start of `input` (no leading whitespace) with serde_json and
/// returns it with the number of bytes it took; what follows is only looked at for the end
/// of a number or literal.
fn from_prefix<'de, T: de::Deserialize<'de>>(input: &'de [u8]) -> Result<(T, usize), Error> {
    let mut values = serde_json::Deserializer::from_slice(input).into_iter::<T>();
    match values.next() {
        Some(Ok(v)) => Ok((v, values.byte_offset())),
        Some(Err(e)) => Err(Error::of(&e, input)),
        None => Err(Error {
            message: "EOF while parsing a value".to_string(),
            offset: input.len(),
            eof: true,
        }),
    }
}

impl<R: Read> Stream<R> {
    /// The next byte that is not JSON whitespace, not consumed; `None` at the end of the body.
    fn peek(&mut self) -> Result<Option<u8>, Fail> {
        loop {
            let ws = (self.rest().iter()).position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
            match ws {
                Some(i) => {
                    self.start += i;
                    return Ok(Some(self.rest()[0]));
                }
                None => self.start += self.rest().len(),
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// Consumes the next non-whitespace byte, which must be one of `wanted`.
    fn expect(&mut self, wanted: &[u8], what: &str) -> Result<u8, Fail> {
        match self.peek()? {
            Some(b) if wanted.contains(&b) => {
                self.start += 1;
                Ok(b)
            }
            Some(_) => Err(Fail::Bad(format!("expected {what} at byte {}", self.at()))),
            None => Err(Fail::Bad(format!(
                "EOF while parsing the list, expected {what} at byte {}",
                self.at()
            ))),
        }
    }

    /// Decodes the next JSON value with `parse`, which gets the unconsumed bytes and returns
    /// the result and how many bytes the value took (see [`from_prefix`]). An error that says
    /// the input ended early is retried with more of the body. A number or literal that ends
    /// at the end of the buffer is retried too (`12` may be `1234`); objects, arrays and
    /// strings end with their own closing byte, so `parse` runs to success at most once.
    fn value<U>(
        &mut self,
        mut parse: impl FnMut(&[u8]) -> Result<(U, usize), Error>,
    ) -> Result<U, Fail> {
        self.peek()?;
        loop {
            let s = self.rest();
            let delimited = matches!(s.first(), Some(b'{' | b'[' | b'"'));
            let len = s.len();
            let retry = match parse(s) {
                Ok((u, n)) if delimited || n < len || self.eof => {
                    self.start += n;
                    return Ok(u);
                }
                Ok(_) => true,
                // A value cut by the end of the buffer fails with "EOF", or, for a number cut
                // after `-`, `.` or `e`, with an error at its last byte: read more and retry.
                Err(e) if !self.eof && (e.eof || e.offset + 2 >= len) => true,
                Err(e) => {
                    let at = self.at() + e.offset as u64;
                    return Err(Fail::Bad(format!("{} at byte {at}", e.message)));
                }
            };
            if retry && !self.fill()? {
                // The body ended: one more try reports the real error.
                continue;
            }
        }
    }
}

/// Reads a JSON page from `s` into `page` and `sink`, and checks that it is a pod list
/// (`offline`: kubectl's `List` with `items` is one too).
pub(super) fn page<R: Read>(
    s: &mut Stream<R>,
    page: &mut Page,
    sink: &mut dyn Sink,
    offline: bool,
) -> Result<(), Fail> {
    match s.peek()? {
        None => return Err(Fail::Bad("the input is empty".to_string())),
        Some(b'{') => s.start += 1,
        Some(_) => return Err(Fail::Bad("expected a JSON object".to_string())),
    }
    if s.peek()? == Some(b'}') {
        s.start += 1;
    } else {
        loop {
            field(s, page, sink)?;
            if s.expect(b",}", "`,` or `}`")? == b'}' {
                break;
            }
        }
    }
    if s.peek()?.is_some() {
        return Err(Fail::Bad(format!("trailing characters at byte {}", s.at())));
    }
    let source = match offline {
        true => ListSource::Offline,
        false => ListSource::ApiServer,
    };
    let kind = page.kind.clone().flatten();
    check_kind(kind.as_deref(), page.items == Some(true), source).map_err(Fail::Bad)
}

/// One `"key": value` of the top-level object.
fn field<R: Read>(s: &mut Stream<R>, page: &mut Page, sink: &mut dyn Sink) -> Result<(), Fail> {
    if s.peek()? != Some(b'"') {
        return Err(Fail::Bad(format!(
            "key must be a string at byte {}",
            s.at()
        )));
    }
    let key = s.value(|b| from_prefix::<Str<'_>>(b).map(|(k, n)| (k.into_owned(), n)))?;
    s.expect(b":", "`:`")?;
    let duplicate = |name: &str| Fail::Bad(format!("duplicate field `{name}`"));
    match key.as_str() {
        "kind" if page.kind.is_some() => return Err(duplicate("kind")),
        "kind" => {
            let kind = s.value(|b| {
                from_prefix::<Option<Str<'_>>>(b).map(|(k, n)| (k.map(Str::into_owned), n))
            })?;
            page.kind = Some(kind);
        }
        "metadata" if page.cont.is_some() => return Err(duplicate("metadata")),
        "metadata" => {
            let cont = s.value(|b| {
                from_prefix::<Option<ListMeta<'_>>>(b)
                    .map(|(m, n)| (m.and_then(|m| m.cont).map(Str::into_owned), n))
            })?;
            page.cont = Some(cont);
        }
        "items" if page.items.is_some() => return Err(duplicate("items")),
        "items" => items(s, page, sink)?,
        _ => s.value(|b| from_prefix::<IgnoredAny>(b)).map(drop)?,
    }
    Ok(())
}

/// The value of `items`: an array read pod by pod; `null` or anything else as a whole
/// (anything but `null` is then an error).
fn items<R: Read>(s: &mut Stream<R>, page: &mut Page, sink: &mut dyn Sink) -> Result<(), Fail> {
    if s.peek()? != Some(b'[') {
        // `null`, or an error (an array would have begun with `[`).
        s.value(|b| from_prefix::<Option<Vec<IgnoredAny>>>(b))?;
        page.items = Some(false);
        return Ok(());
    }
    s.start += 1;
    page.items = Some(true);
    if s.peek()? == Some(b']') {
        s.start += 1;
        return Ok(());
    }
    loop {
        // A pod borrows the buffer: it goes to the sink before the buffer moves on.
        s.value(|b| from_prefix::<RawPod<'_>>(b).map(|(pod, n)| (sink.pod(pod), n)))?;
        if s.expect(b",]", "`,` or `]`")? == b']' {
            return Ok(());
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::stream::tests::{
        check_agrees, failed_reads_add_nothing, read_sized, Trickle, SIZES,
    };
    use super::super::stream::MAX_VALUE;
    use super::super::{check_kind, For, ListSource, PodListPage, Snapshot, SnapshotError};
    use super::*;

    /// `PROPTEST_CASES` when set (`scripts/fuzz.sh` sets it), else `default`.
    pub(in crate::engine::snapshot) fn cases(default: u32) -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    /// App `app-1`, each pod's first container as the executor's.
    const APP1: For<'static> = For {
        app_id: "app-1",
        container: None,
        source: ListSource::ApiServer,
    };

    const OURS: &str = r#"{"spark-app-selector":"app-1","spark-role":"executor","spark-exec-id":"#;

    fn pod(id: &str, extra: &str) -> String {
        format!(
            r#"{{"metadata":{{"name":"p-{id}","uid":"u\u002d{id}","resourceVersion":"12","labels":{OURS}"{id}","x":"y"}},"annotations":{{"controller.kubernetes.io/pod-deletion-cost":"-3"}}}},
            "spec":{{"nodeName":"n1","containers":[{{"name":"c","image":"i","env":[{{"name":"A","value":"\"q\" \u00e9 é"}}],"args":[1,2.5e3,-0,true,false,null]}}]}},
            "status":{{"phase":"Failed","conditions":[{{"type":"PodScheduled","status":"True"}}],
            "containerStatuses":[{{"restartCount":3,"state":{{"terminated":{{"exitCode":137,"reason":"OOMKilled"}}}}}}]{extra}}}}}"#
        )
    }

    fn bodies() -> Vec<String> {
        let pods: Vec<String> = (1..=12).map(|i| pod(&i.to_string(), "")).collect();
        let all = pods.join(",\n ");
        vec![
            format!(r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"9","continue":"tok\u0021"}},"items":[{all}]}}"#),
            format!("  {{ \"items\" : [ {all} ] , \"n\": 123456, \"kind\" : \"PodList\", \"metadata\": {{\"continue\": \"\"}} }}\n"),
            format!(r#"{{"kind":"List","items":[{all}]}}"#),
            format!(r#"{{"kind":"PodList","items":[{}, {}]}}"#, pod("4", ""), pod("4", "")),
            format!(r#"{{"kind":"PodList","items":[{}]}}"#, pod("7", r#","reason":"Evicted""#)),
            r#"{"kind":"PodList","items":null,"x":[1,{"a":null}],"y":-1.5e-7}"#.to_string(),
            r#"{"kind":"PodList"}"#.to_string(),
            r#"{"kind":"PodList","items":[]}"#.to_string(),
            r#"{"kind":"PodList","items":{}}"#.to_string(),
            r#"{"kind":"PodList","items":[null]}"#.to_string(),
            r#"{"kind":"PodList","items":[1]}"#.to_string(),
            r#"{"kind":"PodList","items":[],"items":[]}"#.to_string(),
            r#"{"kind":"PodList","kind":"PodList"}"#.to_string(),
            r#"{"kind":"PodList","metadata":{"continue":"a","continue":"b"}}"#.to_string(),
            format!(r#"{{"kind":"PodList","items":[{}]"#, pod("1", "")),
            format!(r#"{{"kind":"PodList","items":[{}]}} x"#, pod("1", "")),
            format!(r#"{{"kind":"PodList","items":[{},]}}"#, pod("1", "")),
            format!(r#"{{"kind":"Status","items":[{}]}}"#, pod("1", "")),
            r#"{"kind":"PodList","items":[],}"#.to_string(),
            r#"{"kind":"PodList",}"#.to_string(),
            r#"{"kind":"PodList" "items":[]}"#.to_string(),
            r#"{kind:"PodList"}"#.to_string(),
            r#"{"kind":"PodList","n":12"#.to_string(),
            r#"{"kind":"PodList","s":"\ud800"}"#.to_string(),
            "{\"kind\":\"PodList\",\"s\":\"\x01\"}".to_string(),
            r#"{"kind":"PodList","items":[{"metadata":{"labels":{"a":"1","a":"2"}}}]}"#.to_string(),
            r#"{}"#.to_string(),
            r#"[]"#.to_string(),
            String::new(),
            "   ".to_string(),
            r#"{"kind":"List"}"#.to_string(),
        ]
    }

    /// A page reads the same at every buffer size and read size, from both sources.
    #[test]
    fn every_buffer_and_read_size_reads_the_same() {
        for (i, body) in bodies().iter().enumerate() {
            for source in [ListSource::ApiServer, ListSource::Offline] {
                for sizes in SIZES {
                    let of = APP1.source(source);
                    check_agrees(body.as_bytes(), of, sizes, &format!("body {i}"));
                }
            }
        }
    }

    /// A whole page decoded by serde_json in one piece (the `Raw*` structs, `IgnoredAny` for
    /// the rest) and classified: the reference the streamed reader is held to.
    fn with_serde_json(body: &[u8], source: ListSource) -> Result<Snapshot, ()> {
        let lead = body.iter().find(|b| !b.is_ascii_whitespace());
        let page: PodListPage<'_> = match lead {
            Some(b'{') => serde_json::from_slice(body).map_err(drop)?,
            _ => return Err(()),
        };
        let kind = page.kind.as_deref();
        check_kind(kind, matches!(page.items, Some(Some(_))), source).map_err(drop)?;
        let mut snap = Snapshot::default();
        for pod in page.items.flatten().into_iter().flatten() {
            snap.add_pod(pod, "app-1", None).map_err(drop)?;
        }
        Ok(snap)
    }

    /// Applies `edits` to `body`: each (where, as a fraction of the length; 0 replace, 1
    /// insert, 2 remove; the byte).
    pub(in crate::engine::snapshot) fn mangle(body: &mut Vec<u8>, edits: &[(f64, u8, u8)]) {
        for &(at, op, byte) in edits {
            let i = ((body.len() as f64) * at) as usize;
            match op {
                0 if i < body.len() => body[i] = byte,
                1 => body.insert(i, byte),
                _ if i < body.len() => {
                    body.remove(i);
                }
                _ => {}
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(cases(3000)))]
        /// Against serde_json reading the whole page on mutated pages: the streamed reader
        /// (through a small buffer) decodes exactly the pages serde_json decodes, to the same
        /// snapshot. (serde_json checks the grammar of what it skips: so does the reader.)
        #[test]
        fn streamed_reads_as_serde_json_reads_the_whole_page(
            which in 0usize..31,
            edits in proptest::collection::vec((0.0f64..1.0, 0u8..3, proptest::sample::select(b"\"\\{}[],:0-e.tnu \x01\xc3\xa9x".to_vec())), 1..4),
        ) {
            let mut body = bodies()[which].clone().into_bytes();
            mangle(&mut body, &edits);
            let theirs = with_serde_json(&body, ListSource::ApiServer);
            let mut streamed = Snapshot::default();
            let ours = read_sized(&mut streamed, &body, APP1, (64, 64)).map(|_| streamed);
            match (&theirs, &ours) {
                (Ok(want), Ok(got)) => proptest::prop_assert_eq!(got, want),
                // A duplicate id is a page serde_json reads and the snapshot refuses.
                (Err(()), Err(_)) | (Ok(_), Err(SnapshotError::DuplicateId { .. })) => {}
                _ => proptest::prop_assert!(false, "{theirs:?} vs {ours:?}"),
            }
        }
    }

    #[test]
    fn a_failed_read_adds_nothing() {
        let body = bodies().swap_remove(0);
        let mut s = Snapshot::default();
        s.add_page(
            format!(r#"{{"kind":"PodList","items":[{}]}}"#, pod("99", "")).as_bytes(),
            "app-1",
        )
        .unwrap();
        let fail_ats = [0, 1, 100, body.len() / 2, body.len() - 1];
        failed_reads_add_nothing(&mut s, body.as_bytes(), APP1, 50, &fail_ats);
        let before = s.clone();
        // A duplicate of an id from an earlier page adds nothing of the page either.
        let dup = format!(
            r#"{{"kind":"PodList","items":[{},{}]}}"#,
            pod("1", ""),
            pod("99", "")
        );
        let e = s.read_page(dup.as_bytes(), APP1).unwrap_err();
        assert!(
            matches!(e, SnapshotError::DuplicateId { id: 99, .. }),
            "{e:?}"
        );
        assert_eq!(s, before);
    }

    #[test]
    fn one_value_over_the_cap_is_an_error() {
        let mut body = br#"{"kind":"PodList","x":""#.to_vec();
        body.resize(body.len() + MAX_VALUE + 10, b'a');
        body.extend_from_slice(br#""}"#);
        let e = Snapshot::default().read_page(&body[..], APP1).unwrap_err();
        assert!(e.to_string().contains("is over 16 MiB"), "{e}");
    }

    /// The buffer grows to the largest single value, not to the page.
    #[test]
    fn memory_is_one_value_not_the_page() {
        struct Count(usize);
        impl Sink for Count {
            fn pod(&mut self, _: crate::engine::snapshot::RawPod<'_>) {
                self.0 += 1;
            }
        }
        let pods: Vec<String> = (1..=2000).map(|i| pod(&i.to_string(), "")).collect();
        let body = format!(r#"{{"kind":"PodList","items":[{}]}}"#, pods.join(","));
        let mut stream = Stream::new(Trickle::new(body.as_bytes(), 4096), 4096);
        let mut count = Count(0);
        assert!(page(&mut stream, &mut Page::default(), &mut count, false).is_ok());
        assert_eq!(count.0, 2000);
        assert!(body.len() > 1_000_000);
        assert_eq!(stream.buf.len(), 4096, "a pod of ~900 bytes fits in 4 KiB");
    }

    /// Errors name the byte of the body where the fault is, however the body was cut into
    /// reads.
    #[test]
    fn errors_name_the_byte_in_the_body() {
        let body = br#"{"kind":"PodList","items":[{"metadata":{"name":"a",}}]}"#;
        let theirs = serde_json::from_slice::<serde_json::Value>(body).unwrap_err();
        let at = format!("at byte {}", theirs.column() - 1);
        for sizes in SIZES {
            let e = read_sized(&mut Snapshot::default(), body, APP1, sizes).unwrap_err();
            assert!(e.to_string().contains(&at), "{sizes:?}: {e} ({at})");
        }
    }
}
