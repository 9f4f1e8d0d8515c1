//! A page read while it arrives: the one way a pod list is decoded, whatever its encoding
//! ([`read`]: a body that begins `k8s\0` is Protobuf, `proto.rs`; anything else JSON,
//! `json.rs`).
//!
//! The body is read through one refill buffer (`START_BUFFER` to start), and decoded one
//! value at a time: each pod is decoded as soon as its last byte is in the buffer, then its
//! bytes are dropped. So memory is one buffer that grows only to hold the largest single value
//! (one pod), whatever the page holds: a server that ignores `limit` (kube-apiserver does for
//! a `resourceVersion=0` list served from its watch cache) may send 50,000 pods in one 275 MB
//! body, and the decode still needs a few hundred KiB beyond the snapshot itself. (A hostile
//! pod is bounded too: its bytes by `MAX_VALUE`, its decoded container and condition lists by
//! 10,000 entries each.) A whole body already in memory is read the same way (`&[u8]` is a
//! reader): there is no second decoder to keep in step.
//!
//! Each pod goes to a [`Sink`] as soon as it is decoded: one app's page, or the split of a
//! namespace-wide list by app. A page that fails adds nothing: the sink keeps the page's
//! pods apart until the whole body has been read.

use std::io::Read;

use super::{excerpt, RawPod, SnapshotError};

/// The refill buffer's first size. It doubles only when a single value (one pod, the list
/// metadata) does not fit.
pub(super) const START_BUFFER: usize = 256 * 1024;

/// The most one value (one pod, the list metadata, another top-level field) may take. etcd
/// refuses objects over 1.5 MiB (its default `--max-request-bytes`), so a real pod is far
/// below this; a larger value is a broken or hostile server, and memory stays bounded.
pub(super) const MAX_VALUE: usize = 16 * 1024 * 1024;

/// How many bytes of the body's head are kept for error messages (see `excerpt`).
const HEAD: usize = 320;

/// Why reading stopped.
pub(super) enum Fail {
    /// Not a PodList: why, without the excerpt.
    Bad(String),
    /// The reader failed (connection, gzip, body limit).
    Read(std::io::Error),
}

/// Where the pods of a page go, one at a time, while the page is read.
pub(super) trait Sink {
    /// One pod of the page.
    fn pod(&mut self, pod: RawPod<'_>);
}

/// What the top level of a page held besides its pods.
#[derive(Default)]
pub(super) struct Page {
    /// `kind` (JSON; a Protobuf envelope's is checked where it is read).
    pub(super) kind: Option<Option<String>>,
    /// `metadata.continue`: `None` when the page has no list metadata, `Some(None)` when
    /// it has no token.
    pub(super) cont: Option<Option<String>>,
    /// `None`: no `items` key; `Some(false)`: `"items": null`; `Some(true)`: an array.
    pub(super) items: Option<bool>,
}

/// The body, read into a refill buffer.
pub(super) struct Stream<R> {
    reader: R,
    /// Bytes `start..end` are read and not yet consumed.
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    end: usize,
    /// The reader returned 0.
    pub(super) eof: bool,
    /// Bytes consumed before `buf[start]`, for positions in messages.
    dropped: u64,
    /// The body's first bytes.
    head: Vec<u8>,
}

impl<R: Read> Stream<R> {
    pub(super) fn new(reader: R, buffer: usize) -> Self {
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
    pub(super) fn fill(&mut self) -> Result<bool, Fail> {
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

    /// The unconsumed bytes in the buffer.
    pub(super) fn rest(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Makes at least `n` unconsumed bytes available (growing the buffer to hold them, up to
    /// [`MAX_VALUE`]); `false` when the body ends first.
    pub(super) fn need(&mut self, n: usize) -> Result<bool, Fail> {
        while self.end - self.start < n {
            if !self.fill()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The position of `buf[start]` in the body.
    pub(super) fn at(&self) -> u64 {
        self.dropped + self.start as u64
    }

    /// Consumes the next `n` bytes without holding them (one buffer at a time, however
    /// large). `false` when the body ends first.
    pub(super) fn skip(&mut self, mut n: u64) -> Result<bool, Fail> {
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
}

/// Reads one page from `reader` into `sink` (see the module doc) and returns what its top
/// level held; `offline`: a file given offline, where kubectl's `List` is a pod list too.
///
/// Errors: [`SnapshotError::Read`] when `reader` fails, [`SnapshotError::Malformed`] (quoting
/// the body's first bytes) for a body that is not a pod list.
pub(super) fn read<R: Read>(
    reader: R,
    sink: &mut dyn Sink,
    offline: bool,
    buffer: usize,
) -> Result<Page, SnapshotError> {
    let mut s = Stream::new(reader, buffer);
    let mut page = Page::default();
    let done = s.need(4).and_then(|_| {
        if s.rest().starts_with(crate::wire::protobuf::MAGIC) {
            s.start += 4;
            super::proto::page(&mut s, &mut page, sink)
        } else {
            super::json::page(&mut s, &mut page, sink, offline)
        }
    });
    match done {
        Ok(()) => Ok(page),
        Err(Fail::Read(e)) => Err(SnapshotError::Read(e.to_string())),
        Err(Fail::Bad(why)) => Err(SnapshotError::Malformed(format!(
            "{why}; the body begins: {}",
            excerpt(&s.head)
        ))),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{For, ListSource, Snapshot};
    use super::*;

    /// Hands out at most `step` bytes per read, then fails after `fail_at` bytes if set.
    pub(in crate::engine::snapshot) struct Trickle<'a> {
        pub(in crate::engine::snapshot) data: &'a [u8],
        pub(in crate::engine::snapshot) step: usize,
        pub(in crate::engine::snapshot) fail_at: Option<usize>,
        pub(in crate::engine::snapshot) pos: usize,
    }

    impl<'a> Trickle<'a> {
        /// `data`, `step` bytes a read.
        pub(in crate::engine::snapshot) fn new(data: &'a [u8], step: usize) -> Self {
            Trickle {
                data,
                step,
                fail_at: None,
                pos: 0,
            }
        }
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

    /// The buffer and read sizes [`check_agrees`] runs each body at.
    pub(in crate::engine::snapshot) const SIZES: [(usize, usize); 5] =
        [(1, 1), (3, 2), (64, 7), (700, 4096), (START_BUFFER, 1)];

    /// `body` read through a first buffer of `buffer` bytes, `step` bytes a read.
    pub(in crate::engine::snapshot) fn read_sized(
        snap: &mut Snapshot,
        body: &[u8],
        of: For<'_>,
        sizes: (usize, usize),
    ) -> Result<Option<String>, SnapshotError> {
        snap.read_sized(Trickle::new(body, sizes.1), of, sizes.0)
    }

    /// `body` reads the same at buffer and read sizes `sizes` as in one read into the
    /// default buffer: the same snapshot and continue token, or both an error of one kind; a
    /// failed page adds nothing either way.
    pub(in crate::engine::snapshot) fn check_agrees(
        body: &[u8],
        of: For<'_>,
        sizes: (usize, usize),
        what: &str,
    ) {
        let mut whole = Snapshot::default();
        let want = whole.read_page(body, of);
        let mut streamed = Snapshot::default();
        let got = read_sized(&mut streamed, body, of, sizes);
        let ctx = format!("{what} {of:?} sizes {sizes:?}: {got:?} vs {want:?}");
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

    /// Reading `body` into `s`, `step` bytes at a time, fails at each of `fail_ats` with the
    /// reader's error, and leaves `s` as it was.
    pub(in crate::engine::snapshot) fn failed_reads_add_nothing(
        s: &mut Snapshot,
        body: &[u8],
        of: For<'_>,
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
            let e = s.read_sized(reader, of, 64).unwrap_err();
            assert!(
                matches!(e, SnapshotError::Read(ref m) if m == "reset"),
                "{fail_at}: {e:?}"
            );
            assert_eq!(*s, before);
        }
    }

    /// A body shorter than the Protobuf prefix is JSON (or nothing) and still reads.
    #[test]
    fn bodies_shorter_than_four_bytes_are_read_as_json() {
        let of = For::app("app-1").source(ListSource::ApiServer);
        for (body, why) in [
            (&b""[..], "the input is empty"),
            (b"k8", "expected a JSON object"),
            (b"{}", "no \"kind\""),
        ] {
            let e = Snapshot::default().read_page(body, of).unwrap_err();
            assert!(e.to_string().contains(why), "{why}: {e}");
        }
    }
}
