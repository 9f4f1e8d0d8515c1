//! Decoding a PodList page while it arrives: [`Snapshot::add_page_reader`].
//!
//! The body is read through one refill buffer (`START_BUFFER` to start), and decoded one
//! JSON value at a time: each top-level field's value, and each pod of `items`, is handed to
//! serde_json as soon as its last byte is in the buffer, then its bytes are dropped. So memory
//! is one buffer that grows only to hold the largest single value (one pod), whatever the
//! page holds: a server that ignores `limit` (kube-apiserver does for a `resourceVersion=0`
//! list served from its watch cache) may send 50,000 pods in one 275 MB body, and the decode
//! still needs a few hundred KiB beyond the snapshot itself. (A hostile pod is bounded too:
//! its JSON by `MAX_VALUE`, its decoded container and condition lists by 10,000 entries each.)
//!
//! A Protobuf page (`k8s\0`, then a `runtime.Unknown` whose `raw` is the `v1.PodList`) streams
//! the same way: the envelope is read field by field, and inside `raw` each length-prefixed
//! item (one pod) is decoded by the same `proto` functions as a whole page once its bytes are
//! in the buffer. The list's `metadata` (field 1) comes before the items, so the continue
//! token is known from the page's first bytes.
//!
//! Every value is still decoded by serde_json into the same structs as [`Snapshot::add_page`],
//! which validates what it skips the same way, so a body decodes here exactly when it decodes
//! there, to the same snapshot. Error messages differ only in where they say the fault is:
//! `at byte N` of the body instead of serde_json's line and column.

use std::io::Read;

use serde::de::IgnoredAny;

use super::json;
use super::{check_kind, excerpt, ListMeta, ListSource, RawPod, Snapshot, SnapshotError, Str};
use crate::kube::protowire;

/// The refill buffer's first size. It doubles only when a single value (one pod, the list
/// metadata) does not fit.
pub(super) const START_BUFFER: usize = 256 * 1024;

/// The most one value (one pod, the list metadata, another top-level field) may take. etcd
/// refuses objects over 1.5 MiB (its default `--max-request-bytes`), so a real pod's JSON is
/// far below this; a larger value is a broken or hostile server, and memory stays bounded.
pub(super) const MAX_VALUE: usize = 16 * 1024 * 1024;

/// How many bytes of the body's head are kept for error messages (see `excerpt`).
const HEAD: usize = 320;

/// Why reading stopped.
enum Fail {
    /// Not a PodList: why, without the excerpt.
    Bad(String),
    /// The reader failed (connection, gzip, body limit).
    Read(std::io::Error),
}

/// The body, read into a refill buffer.
struct Stream<R> {
    reader: R,
    /// Bytes `start..end` are read and not yet consumed.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The reader returned 0.
    eof: bool,
    /// Bytes consumed before `buf[start]`, for positions in messages.
    dropped: u64,
    /// The body's first bytes.
    head: Vec<u8>,
}

impl<R: Read> Stream<R> {
    fn new(reader: R, buffer: usize) -> Self {
        Stream {
            reader,
            buf: vec![0; buffer.max(1)],
            start: 0,
            end: 0,
            eof: false,
            dropped: 0,
            head: Vec::with_capacity(HEAD),
        }
    }

    /// Reads more: moves the unconsumed bytes to the front, doubles the buffer when they fill
    /// it, then reads until the buffer is full or the body ends. `false` at the end of the body.
    fn fill(&mut self) -> Result<bool, Fail> {
        if self.eof {
            return Ok(false);
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.dropped += self.start as u64;
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            if self.buf.len() >= MAX_VALUE {
                return Err(Fail::Bad(format!(
                    "one value at byte {} is over {} MiB (etcd stores objects of at most \
                     1.5 MiB)",
                    self.at(),
                    MAX_VALUE >> 20
                )));
            }
            self.buf.resize((self.buf.len() * 2).min(MAX_VALUE), 0);
        }
        let before = self.end;
        while self.end < self.buf.len() {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => {
                    if self.head.len() < HEAD {
                        let take = n.min(HEAD - self.head.len());
                        self.head
                            .extend_from_slice(&self.buf[self.end..self.end + take]);
                    }
                    self.end += n;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Fail::Read(e)),
            }
        }
        Ok(self.end > before)
    }

    /// The next byte that is not JSON whitespace, not consumed; `None` at the end of the body.
    fn peek(&mut self) -> Result<Option<u8>, Fail> {
        loop {
            while self.start < self.end {
                match self.buf[self.start] {
                    b' ' | b'\t' | b'\n' | b'\r' => self.start += 1,
                    b => return Ok(Some(b)),
                }
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// The position of `buf[start]` in the body.
    fn at(&self) -> u64 {
        self.dropped + self.start as u64
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
    /// the result and how many bytes the value took. An error that says the input ended
    /// early is retried with more of the body. A number or literal that ends at the end of
    /// the buffer is retried too (`12` may be `1234`); objects, arrays and strings end with
    /// their own closing byte, so `parse` runs to success at most once.
    fn value<U>(
        &mut self,
        mut parse: impl FnMut(&[u8]) -> Result<(U, usize), json::Error>,
    ) -> Result<U, Fail> {
        self.peek()?;
        loop {
            let s = &self.buf[self.start..self.end];
            let delimited = matches!(s.first(), Some(b'{' | b'[' | b'"'));
            let retry = match parse(s) {
                Ok((u, n)) if delimited || n < s.len() || self.eof => {
                    self.start += n;
                    return Ok(u);
                }
                Ok(_) => true,
                // A value cut by the end of the buffer fails with "EOF", or, for a number cut
                // after `-`, `.` or `e`, with an error at its last byte: read more and retry.
                Err(e) if !self.eof && (e.is_eof() || e.offset() + 2 >= s.len()) => true,
                Err(e) => return Err(Fail::Bad(self.message(&e))),
            };
            if retry && !self.fill()? {
                // The body ended: one more try reports the real error.
                continue;
            }
        }
    }

    /// The decoder's message for a value starting at `buf[start]`, with its position in the
    /// whole body.
    fn message(&self, e: &json::Error) -> String {
        format!("{} at byte {}", e.message(), self.at() + e.offset() as u64)
    }
}

/// What the top level of a page held.
#[derive(Default)]
struct Page {
    kind: Option<Option<String>>,
    cont: Option<Option<String>>,
    /// `None`: no `items` key; `Some(false)`: `"items": null`; `Some(true)`: an array.
    items: Option<bool>,
    part: Snapshot,
    /// The first duplicate id inside the page, reported once the page has decoded.
    duplicate: Option<SnapshotError>,
}

impl Page {
    fn pod(&mut self, pod: RawPod<'_>, app: For<'_>) {
        if let Err(e) = self.part.add_pod(pod, app.app_id, app.container) {
            self.duplicate.get_or_insert(e);
        }
    }
}

/// Decodes a whole page from `s` into `page` (see the module doc).
/// Whose pods a page is decoded for: the app id and its executor container (see
/// [`Snapshot::from_pod_list_for`]).
#[derive(Clone, Copy)]
struct For<'a> {
    app_id: &'a str,
    container: Option<&'a str>,
}

fn decode<R: Read>(s: &mut Stream<R>, page: &mut Page, app: For<'_>) -> Result<(), Fail> {
    match s.peek()? {
        None => return Err(Fail::Bad("the input is empty".to_string())),
        Some(b'{') => s.start += 1,
        Some(_) => return Err(Fail::Bad("expected a JSON object".to_string())),
    }
    if s.peek()? == Some(b'}') {
        s.start += 1;
    } else {
        loop {
            field(s, page, app)?;
            if s.expect(b",}", "`,` or `}`")? == b'}' {
                break;
            }
        }
    }
    match s.peek()? {
        None => Ok(()),
        Some(_) => Err(Fail::Bad(format!("trailing characters at byte {}", s.at()))),
    }
}

/// One `"key": value` of the top-level object.
fn field<R: Read>(s: &mut Stream<R>, page: &mut Page, app: For<'_>) -> Result<(), Fail> {
    if s.peek()? != Some(b'"') {
        return Err(Fail::Bad(format!(
            "key must be a string at byte {}",
            s.at()
        )));
    }
    let key = s.value(|b| json::from_prefix::<Str<'_>>(b).map(|(k, n)| (k.into_owned(), n)))?;
    s.expect(b":", "`:`")?;
    let duplicate = |name: &str| Fail::Bad(format!("duplicate field `{name}`"));
    match key.as_str() {
        "kind" => {
            if page.kind.is_some() {
                return Err(duplicate("kind"));
            }
            let kind = s.value(|b| {
                json::from_prefix::<Option<Str<'_>>>(b).map(|(k, n)| (k.map(Str::into_owned), n))
            })?;
            page.kind = Some(kind);
        }
        "metadata" => {
            if page.cont.is_some() {
                return Err(duplicate("metadata"));
            }
            let cont = s.value(|b| {
                json::from_prefix::<Option<ListMeta<'_>>>(b)
                    .map(|(m, n)| (m.and_then(|m| m.cont).map(Str::into_owned), n))
            })?;
            page.cont = Some(cont);
        }
        "items" => {
            if page.items.is_some() {
                return Err(duplicate("items"));
            }
            items(s, page, app)?;
        }
        _ => {
            s.value(|b| json::from_prefix::<IgnoredAny>(b))?;
        }
    }
    Ok(())
}

/// The value of `items`: an array decoded pod by pod; anything else as a whole.
fn items<R: Read>(s: &mut Stream<R>, page: &mut Page, app: For<'_>) -> Result<(), Fail> {
    if s.peek()? != Some(b'[') {
        let pods = s.value(|b| {
            json::from_prefix::<Option<Vec<RawPod<'_>>>>(b).map(|(pods, n)| {
                let array = pods.is_some();
                for pod in pods.into_iter().flatten() {
                    page.pod(pod, app);
                }
                (array, n)
            })
        })?;
        page.items = Some(pods);
        return Ok(());
    }
    s.start += 1;
    page.items = Some(true);
    if s.peek()? == Some(b']') {
        s.start += 1;
        return Ok(());
    }
    loop {
        // A pod borrows the buffer: it is added inside, before the buffer moves on.
        s.value(|b| {
            json::from_prefix::<RawPod<'_>>(b).map(|(pod, n)| {
                page.pod(pod, app);
                ((), n)
            })
        })?;
        if s.expect(b",]", "`,` or `]`")? == b']' {
            return Ok(());
        }
    }
}

/// What a Protobuf page's envelope held so far (see [`protobuf`]).
#[derive(Default)]
struct Envelope {
    /// `typeMeta.kind`, the last one given (as [`protowire::envelope`] reads it).
    kind: Option<String>,
    /// `contentEncoding`, the last one given.
    encoding: String,
    /// The first fault inside the current `raw` message: reported once the body has been
    /// read, unless a later `raw` replaces this one (the whole-page decoder reads only the
    /// last `raw`, as proto2 does; kube-apiserver writes one).
    fault: Option<String>,
}

impl<R: Read> Stream<R> {
    /// Makes at least `n` unconsumed bytes available (growing the buffer to hold them, up to
    /// [`MAX_VALUE`]); `false` when the body ends first.
    fn need(&mut self, n: usize) -> Result<bool, Fail> {
        while self.end - self.start < n {
            if !self.fill()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A Protobuf varint, which must end within the next `left` bytes of the message.
    fn varint(&mut self, left: u64) -> Result<u64, Fail> {
        let want = left.min(10) as usize;
        self.need(want)?;
        let have = &self.buf[self.start..self.end];
        let mut pos = 0;
        let v = protowire::varint(&have[..have.len().min(want)], &mut pos).map_err(Fail::Bad)?;
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

    /// Consumes the next `n` bytes without holding them (one buffer at a time, however
    /// large). `false` when the body ends first.
    fn skip(&mut self, mut n: u64) -> Result<bool, Fail> {
        loop {
            let k = ((self.end - self.start) as u64).min(n);
            self.start += k as usize;
            n -= k;
            if n == 0 {
                return Ok(true);
            }
            if !self.fill()? {
                return Ok(false);
            }
        }
    }

    /// Skips one value of wire type `wire` (field `num`), which must end within the next
    /// `left` bytes of its message (as [`protowire::each`] reads one).
    fn skip_value(&mut self, num: u64, wire: u64, left: u64) -> Result<(), Fail> {
        let n = match wire {
            0 => return self.varint(left).map(drop),
            2 => {
                let at = self.at();
                let len = self.varint(left)?;
                if len > left - (self.at() - at) {
                    return Err(past(num, len));
                }
                len
            }
            1 => 8,
            5 => 4,
            w => {
                return Err(Fail::Bad(format!(
                    "field {num}: wire type {w} is not used by Kubernetes"
                )))
            }
        };
        if n > left || !self.skip(n)? {
            return Err(past(num, n));
        }
        Ok(())
    }
}

/// A field's value that runs past its message or the body.
fn past(num: u64, len: u64) -> Fail {
    Fail::Bad(format!("field {num}: length {len} runs past the message"))
}

/// Decodes a Protobuf page (its `k8s\0` prefix consumed) while it arrives: the envelope
/// (`runtime.Unknown`, see [`protowire::envelope`]) field by field, and inside its `raw`
/// message ([`raw`]) each item as soon as its bytes are in. Accepts and refuses exactly what
/// `proto::decode_page` does on the whole body, except a single field over [`MAX_VALUE`]
/// (one pod, the list metadata), which etcd could not have stored.
fn protobuf<R: Read>(s: &mut Stream<R>, page: &mut Page, app: For<'_>) -> Result<(), Fail> {
    let mut env = Envelope::default();
    while s.need(1)? {
        let key = s.varint(u64::MAX)?;
        let (num, wire) = (key >> 3, key & 7);
        match (num, wire) {
            (1, 2) => {
                let len = s.varint(u64::MAX)?;
                let mut kind = env.kind.as_deref();
                let meta = s.take(len, u64::MAX, num)?;
                protowire::type_meta_kind(meta, &mut kind).map_err(Fail::Bad)?;
                env.kind = kind.map(str::to_string);
            }
            (2, 2) => {
                let len = s.varint(u64::MAX)?;
                raw(s, len, page, &mut env, app)?;
            }
            (3, 2) => {
                let len = s.varint(u64::MAX)?;
                let v = s.take(len, u64::MAX, num)?;
                let text = std::str::from_utf8(v)
                    .map_err(|_| Fail::Bad("contentEncoding is not UTF-8".to_string()))?;
                env.encoding = text.to_string();
            }
            (1..=3, w) => {
                s.skip_value(num, w, u64::MAX)?;
                return Err(Fail::Bad(format!(
                    "envelope field {num} is not length-delimited"
                )));
            }
            (_, w) => s.skip_value(num, w, u64::MAX)?,
        }
    }
    protowire::no_content_encoding(&env.encoding).map_err(Fail::Bad)?;
    super::proto::check_kind(env.kind.as_deref()).map_err(Fail::Bad)?;
    match env.fault {
        Some(why) => Err(Fail::Bad(why)),
        None => Ok(()),
    }
}

/// The envelope's `raw` message of `len` bytes, a `v1.PodList` (metadata 1, items 2): its
/// pods go into `page` one by one. A fault inside it is kept in `env` and the rest of the
/// message skipped; a body that ends inside it is an error at once.
fn raw<R: Read>(
    s: &mut Stream<R>,
    len: u64,
    page: &mut Page,
    env: &mut Envelope,
    app: For<'_>,
) -> Result<(), Fail> {
    // Only the last `raw` counts.
    page.part = Snapshot::default();
    page.duplicate = None;
    page.cont = None;
    env.fault = None;
    let end = s.at().saturating_add(len);
    while s.at() < end {
        match list_field(s, end, page, app) {
            Ok(()) => {}
            Err(Fail::Bad(why)) => {
                env.fault = Some(why);
                if !s.skip(end.saturating_sub(s.at()))? {
                    return Err(past(2, len));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One field of the `v1.PodList` that ends at byte `end` of the body.
fn list_field<R: Read>(
    s: &mut Stream<R>,
    end: u64,
    page: &mut Page,
    app: For<'_>,
) -> Result<(), Fail> {
    let key = s.varint(end - s.at())?;
    let (num, wire) = (key >> 3, key & 7);
    if !matches!(num, 1 | 2) || wire != 2 {
        s.skip_value(num, wire, end - s.at())?;
        return match num {
            1 | 2 => Err(Fail::Bad(format!(
                "PodList field {num} is not length-delimited"
            ))),
            _ => Ok(()),
        };
    }
    let len = s.varint(end - s.at())?;
    let left = end - s.at();
    let v = s.take(len, left, num)?;
    if num == 1 {
        if let Some(c) = super::proto::list_continue(v).map_err(Fail::Bad)? {
            page.cont = Some(c.map(Str::into_owned));
        }
    } else {
        let pod = super::proto::pod(v).map_err(Fail::Bad)?;
        page.pod(pod, app);
    }
    Ok(())
}

/// Reads until `buf` is full or the body ends; how many bytes were read.
fn read_up_to<R: Read>(reader: &mut R, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match reader.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl Snapshot {
    /// [`Snapshot::add_page_from`] for a body read from `reader` while it arrives: each pod
    /// is decoded as soon as it is complete and its bytes are dropped, so memory stays at one
    /// buffer of `START_BUFFER` (256 KiB; more only for a single pod larger than that) plus the
    /// snapshot, however large the page. Returns the page's `metadata.continue` as
    /// [`Snapshot::add_page`] does; a page that fails adds nothing.
    ///
    /// A body that begins `k8s\0` is Protobuf and streams the same way: its pods are
    /// length-prefixed items of one message, each decoded once its bytes are in.
    ///
    /// Errors: [`SnapshotError::Read`] when `reader` fails (the connection, gzip, a body
    /// limit), else those of [`Snapshot::add_page_from`]. When a page has several duplicate
    /// ids, which pair is named may differ from `add_page_from`; a single value over
    /// 16 MiB (one pod, which etcd could not store) is malformed here only.
    pub fn add_page_reader<R: Read>(
        &mut self,
        reader: R,
        app_id: &str,
        executor_container: Option<&str>,
        source: ListSource,
    ) -> Result<Option<String>, SnapshotError> {
        let app = For {
            app_id,
            container: executor_container,
        };
        self.read_page(reader, app, source, START_BUFFER)
    }

    /// [`Snapshot::add_page_reader`] with a first buffer of `buffer` bytes.
    fn read_page<R: Read>(
        &mut self,
        reader: R,
        app: For<'_>,
        source: ListSource,
        buffer: usize,
    ) -> Result<Option<String>, SnapshotError> {
        let mut reader = reader;
        let mut first = [0u8; 4];
        let n =
            read_up_to(&mut reader, &mut first).map_err(|e| SnapshotError::Read(e.to_string()))?;
        let mut s = Stream::new(std::io::Read::chain(&first[..n], reader), buffer);
        let mut page = Page::default();
        let checked = if first[..n] == super::proto::MAGIC[..] {
            s.need(n).and_then(|_| {
                s.start = n;
                protobuf(&mut s, &mut page, app)
            })
        } else {
            decode(&mut s, &mut page, app).and_then(|()| {
                let kind = page.kind.clone().flatten();
                check_kind(kind.as_deref(), page.items == Some(true), source).map_err(Fail::Bad)
            })
        };
        match checked {
            Ok(()) => {}
            Err(Fail::Read(e)) => return Err(SnapshotError::Read(e.to_string())),
            Err(Fail::Bad(why)) => {
                return Err(SnapshotError::Malformed(format!(
                    "{why}; the body begins: {}",
                    excerpt(&s.head)
                )))
            }
        }
        if let Some(e) = page.duplicate {
            return Err(e);
        }
        self.merge(page.part)?;
        Ok(page.cont.flatten().filter(|c| !c.is_empty()))
    }

    /// Adds the pods of `part` (one page), or none of them when one's id is already here.
    pub(super) fn merge(&mut self, part: Snapshot) -> Result<(), SnapshotError> {
        if let Some((id, pod)) = part
            .executors
            .iter()
            .find(|(id, _)| self.executors.contains_key(id))
        {
            return Err(SnapshotError::DuplicateId {
                id: *id,
                first: self.executors[id].name.clone(),
                second: pod.name.clone(),
            });
        }
        if self.executors.is_empty() {
            self.executors = part.executors;
        } else {
            self.executors.extend(part.executors);
        }
        self.warnings.extend(part.warnings);
        self.foreign += part.foreign;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// App `app-1`, each pod's first container as the executor's.
    const APP1: For<'static> = For {
        app_id: "app-1",
        container: None,
    };
    use super::*;

    /// Hands out at most `step` bytes per read, then fails after `fail_at` bytes if set.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
        fail_at: Option<usize>,
        pos: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.fail_at.is_some_and(|f| self.pos >= f) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "reset",
                ));
            }
            let mut n = self.step.min(buf.len()).min(self.data.len() - self.pos);
            if let Some(f) = self.fail_at {
                n = n.min(f - self.pos);
            }
            buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

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

    /// Whole-page decoding and streamed decoding agree on `body` from `source`, read through a
    /// buffer of `buffer` bytes `step` bytes at a time: the same snapshot and continue token,
    /// or both an error of one kind; a failed page adds nothing either way.
    fn check_agrees(
        body: &[u8],
        app: For<'_>,
        source: ListSource,
        sizes: (usize, usize),
        what: &str,
    ) {
        let (buffer, step) = sizes;
        let mut whole = Snapshot::default();
        let want = whole.add_page_from(body, app.app_id, None, source);
        let mut streamed = Snapshot::default();
        let reader = Trickle {
            data: body,
            step,
            fail_at: None,
            pos: 0,
        };
        let got = streamed.read_page(reader, app, source, buffer);
        let ctx = format!("{what} {source:?} buffer {buffer} step {step}: {got:?} vs {want:?}");
        match (&want, &got) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{ctx}"),
            (Err(SnapshotError::Malformed(_)), Err(SnapshotError::Malformed(m))) => {
                assert!(m.contains("the body begins: "), "{ctx}")
            }
            (Err(a @ SnapshotError::DuplicateId { .. }), Err(b)) => assert_eq!(a, b, "{ctx}"),
            _ => panic!("{ctx}"),
        }
        match got {
            Ok(_) => assert_eq!(whole, streamed, "{ctx}"),
            Err(_) => {
                assert_eq!(streamed, Snapshot::default(), "{ctx}");
                assert_eq!(whole, Snapshot::default(), "{ctx}");
            }
        }
    }

    /// The buffer and read sizes [`check_agrees`] runs each body at.
    const SIZES: [(usize, usize); 5] = [(1, 1), (3, 2), (64, 7), (700, 4096), (START_BUFFER, 1)];

    /// Whole-page decoding and streamed decoding agree on every body, at every buffer size
    /// and read size.
    #[test]
    fn streaming_agrees_with_the_whole_page() {
        for (i, body) in bodies().iter().enumerate() {
            for source in [ListSource::ApiServer, ListSource::Offline] {
                for sizes in SIZES {
                    check_agrees(body.as_bytes(), APP1, source, sizes, &format!("body {i}"));
                }
            }
        }
    }

    /// [`Snapshot::add_page_from`] with serde_json as the reader, as podalloc decoded before
    /// it had its own (see the `json` module).
    fn with_serde_json(body: &[u8], source: ListSource) -> Result<Snapshot, ()> {
        let lead = body.iter().find(|b| !b.is_ascii_whitespace());
        let page: super::super::PodListPage<'_> = match lead {
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
    fn mangle(body: &mut Vec<u8>, edits: &[(f64, u8, u8)]) {
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
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            crate::engine::snapshot::json::tests::cases(3000)
        ))]
        /// Against serde_json on mutated pages: every page it decodes decodes here to the same
        /// snapshot, streamed or whole; a page refused here is refused there too, unless the
        /// only fault is the order of tokens inside a skipped value (see the `json` module).
        #[test]
        fn never_stricter_than_serde_json(
            which in 0usize..31,
            edits in proptest::collection::vec((0.0f64..1.0, 0u8..3, proptest::sample::select(b"\"\\{}[],:0-e.tnu \x01\xc3\xa9x".to_vec())), 1..4),
        ) {
            let mut body = bodies()[which].clone().into_bytes();
            mangle(&mut body, &edits);
            let theirs = with_serde_json(&body, ListSource::ApiServer);
            let mut whole = Snapshot::default();
            let ours = whole.add_page_from(&body, "app-1", None, ListSource::ApiServer).map(|_| whole);
            let mut streamed = Snapshot::default();
            let stream = streamed.read_page(&body[..], APP1, ListSource::ApiServer, 64).map(|_| streamed);
            if let Ok(want) = &theirs {
                proptest::prop_assert_eq!(ours.as_ref().ok(), Some(want));
                proptest::prop_assert_eq!(stream.as_ref().ok(), Some(want));
            }
            proptest::prop_assert_eq!(ours.is_ok(), stream.is_ok());
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
        let before = s.clone();
        let fail_ats = [0, 1, 100, body.len() / 2, body.len() - 1];
        failed_reads_add_nothing(&mut s, body.as_bytes(), APP1, 50, &fail_ats);
        // A duplicate of an id from an earlier page adds nothing of the page either.
        let dup = format!(
            r#"{{"kind":"PodList","items":[{},{}]}}"#,
            pod("1", ""),
            pod("99", "")
        );
        let e = s
            .add_page_reader(dup.as_bytes(), "app-1", None, ListSource::ApiServer)
            .unwrap_err();
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
        let e = Snapshot::default()
            .read_page(&body[..], APP1, ListSource::ApiServer, START_BUFFER)
            .unwrap_err();
        assert!(e.to_string().contains("is over 16 MiB"), "{e}");
    }

    /// The buffer grows to the largest single value, not to the page.
    #[test]
    fn memory_is_one_value_not_the_page() {
        let pods: Vec<String> = (1..=2000).map(|i| pod(&i.to_string(), "")).collect();
        let body = format!(r#"{{"kind":"PodList","items":[{}]}}"#, pods.join(","));
        let mut stream = Stream::new(body.as_bytes(), 4096);
        let mut page = Page::default();
        assert!(decode(&mut stream, &mut page, APP1).is_ok());
        assert_eq!(page.part.executors.len(), 2000);
        assert!(body.len() > 1_000_000);
        assert_eq!(stream.buf.len(), 4096, "a pod of ~900 bytes fits in 4 KiB");
    }

    use super::super::proto::tests::{list, msg, pod as pb_pod, CASES, V};

    /// App `app`, the app of the `proto` tests' pods.
    const APP: For<'static> = For {
        app_id: "app",
        container: None,
    };

    /// The four executor pods of the `proto` tests, as kube-apiserver encodes them, in one
    /// page whose continue token is `next`.
    fn pb_page() -> Vec<u8> {
        let items: Vec<_> = CASES.iter().map(|c| pb_pod(c.0, c.1, c.2, c.3)).collect();
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
            l.push((2, V::M(pb_pod(id, "Running", None, false))));
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
                        (2, V::M(pb_pod("5", "Running", None, false))),
                        (1, V::M(msg(vec![(3, V::S("late"))]))),
                        (1, V::M(msg(vec![(2, V::S("9"))]))),
                        (9, V::N(3)),
                    ])),
                ),
            ]),
            // Two raw messages: only the last counts, a fault in the first included.
            envelope(vec![
                (1, tm("PodList")),
                (2, V::M(b"\x12\x05\xff".to_vec())),
                (2, pod_list(&["6"], "b")),
            ]),
            envelope(vec![
                (1, tm("PodList")),
                (2, pod_list(&["6"], "b")),
                (2, V::M(b"\x12\x05\xff".to_vec())),
            ]),
            // Kinds: wrong, none, given twice (the last counts), emptied.
            envelope(vec![(1, tm("Status")), (2, pod_list(&["1"], ""))]),
            envelope(vec![(2, pod_list(&["1"], ""))]),
            envelope(vec![
                (1, tm("Status")),
                (1, tm("PodList")),
                (2, pod_list(&[], "")),
            ]),
            envelope(vec![
                (1, tm("PodList")),
                (1, tm("")),
                (2, pod_list(&[], "")),
            ]),
            // A content encoding; skipped fields of every wire type, one larger than a buffer.
            envelope(vec![
                (1, tm("PodList")),
                (2, pod_list(&["1"], "")),
                (3, V::S("gzip")),
            ]),
            [
                envelope(vec![
                    (1, tm("PodList")),
                    (2, pod_list(&["1"], "")),
                    (4, V::S(big)),
                ]),
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

    /// A Protobuf page streams to exactly what it decodes to whole, at every buffer and read
    /// size (one byte at a time included).
    #[test]
    fn protobuf_streaming_agrees_with_the_whole_page() {
        for (i, body) in pb_bodies().iter().enumerate() {
            for sizes in SIZES {
                check_agrees(body, APP, ListSource::ApiServer, sizes, &format!("pb {i}"));
            }
        }
        let mut s = Snapshot::default();
        let page = pb_page();
        let cont = s.read_page(
            Trickle {
                data: &page,
                step: 1,
                fail_at: None,
                pos: 0,
            },
            APP,
            ListSource::ApiServer,
            1,
        );
        assert_eq!(cont.unwrap().as_deref(), Some("next"));
        assert_eq!(s.executors.len(), 4);
    }

    /// A page cut anywhere streams as it decodes whole; cut inside `raw` (mid-item
    /// included) it is an error and adds nothing.
    #[test]
    fn a_truncated_protobuf_page_agrees_and_fails_inside_raw() {
        let page = pb_page();
        // `k8s\0`, typeMeta (key, one-byte length, message), then raw; the envelope ends with
        // two empty fields (contentEncoding, contentType), 2 bytes each.
        let raw_start = 6 + usize::from(page[5]);
        let raw_end = page.len() - 4;
        for cut in 0..=page.len() {
            let body = &page[..cut];
            for sizes in [(1, 1), (64, 7), (START_BUFFER, 4096)] {
                check_agrees(
                    body,
                    APP,
                    ListSource::ApiServer,
                    sizes,
                    &format!("cut {cut}"),
                );
            }
            if raw_start < cut && cut < raw_end {
                let mut s = Snapshot::default();
                let got = s.add_page_reader(body, "app", None, ListSource::ApiServer);
                assert!(
                    got.is_err() && s == Snapshot::default(),
                    "cut {cut}: {got:?}"
                );
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            crate::engine::snapshot::json::tests::cases(2000)
        ))]
        /// Mangled Protobuf pages (bytes changed, inserted, removed, the end cut) stream to
        /// exactly what they decode to whole, at any buffer and read size.
        #[test]
        fn mangled_protobuf_pages_stream_as_they_decode_whole(
            which in 0usize..24,
            edits in proptest::collection::vec((0.0f64..1.0, 0u8..3, proptest::prelude::any::<u8>()), 0..4),
            cut in 0.0f64..1.2,
            size in 0usize..5,
        ) {
            let mut body = pb_bodies().swap_remove(which);
            mangle(&mut body, &edits);
            body.truncate(((body.len() as f64) * cut) as usize);
            check_agrees(&body, APP, ListSource::ApiServer, SIZES[size], "mangled");
        }
    }

    /// Streaming a Protobuf page holds one item, not the page: a buffer of 4 KiB decodes
    /// 2,000 pods and skips a 1 MiB envelope field without growing.
    #[test]
    fn protobuf_memory_is_one_item_not_the_page() {
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
        let mut page = Page::default();
        assert!(protobuf(&mut stream, &mut page, APP).is_ok());
        assert_eq!(page.part.executors.len(), 2000);
        assert_eq!(stream.buf.len(), 4096, "a pod of ~400 bytes fits in 4 KiB");
    }

    /// A read that fails anywhere in a Protobuf page adds nothing of it.
    #[test]
    fn a_failed_read_of_a_protobuf_page_adds_nothing() {
        let body = pb_page();
        let mut s = Snapshot::default();
        s.add_page(&list(&[pb_pod("99", "Running", None, false)], ""), "app")
            .unwrap();
        let fail_ats = [0, 3, 4, 10, body.len() / 2, body.len() - 5, body.len() - 1];
        failed_reads_add_nothing(&mut s, &body, APP, 9, &fail_ats);
    }

    /// Reading `body` into `s`, `step` bytes at a time, fails at each of `fail_ats` with the
    /// reader's error, and leaves `s` as it was.
    fn failed_reads_add_nothing(
        s: &mut Snapshot,
        body: &[u8],
        app: For<'_>,
        step: usize,
        fail_ats: &[usize],
    ) {
        let before = s.clone();
        for &fail_at in fail_ats {
            let reader = Trickle {
                data: body,
                step,
                fail_at: Some(fail_at),
                pos: 0,
            };
            let e = s
                .read_page(reader, app, ListSource::ApiServer, 64)
                .unwrap_err();
            assert!(
                matches!(e, SnapshotError::Read(ref m) if m == "reset"),
                "{fail_at}: {e:?}"
            );
            assert_eq!(*s, before);
        }
    }
}
