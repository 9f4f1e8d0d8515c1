//! A small HTTP/1.1 server side: request parsing with `httparse` (Content-Length and
//! chunked bodies, `Expect: 100-continue`, keep-alive, pipelining) and response writing
//! that buffers small bodies (sent with Content-Length) and streams large ones chunked,
//! gzipped above 128 KiB when the client accepts gzip, as kube-apiserver does; a watch
//! (`Body::Watch`) goes out chunked from the start, a chunk per flush, never gzipped.

use std::io::{self, Read, Write};

use flate2::write::GzEncoder;
use flate2::Compression;

use super::util::{http_date, parse_query, percent_decode};

/// Largest request head accepted (Go's default `MaxHeaderBytes` is 1 MiB).
const MAX_HEAD: usize = 1 << 20;
/// The apiserver's request body limit (3 MiB).
pub(crate) const MAX_BODY: usize = 3 * 1024 * 1024;
/// Bodies larger than this are gzipped when the client accepts it (apiserver's
/// `defaultGzipThresholdBytes`).
pub(crate) const GZIP_THRESHOLD: usize = 128 * 1024;
const MAX_HEADERS: usize = 128;

/// A parsed request.
#[derive(Debug)]
pub(crate) struct Request {
    pub method: String,
    /// Path without the query, still percent-encoded.
    pub path: String,
    /// Decoded query pairs, in order.
    pub query: Vec<(String, String)>,
    /// Headers with lower-cased names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// False for `Connection: close` or HTTP/1.0 without keep-alive.
    pub keep_alive: bool,
}

impl Request {
    /// The first header named `name` (lower case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The first query parameter named `name`.
    pub(crate) fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// True when `Accept-Encoding` lists gzip (with a non-zero q).
    pub(crate) fn accepts_gzip(&self) -> bool {
        self.headers
            .iter()
            .filter(|(k, _)| k == "accept-encoding")
            .flat_map(|(_, v)| v.split(','))
            .any(|enc| {
                let mut parts = enc.split(';').map(str::trim);
                let name = parts.next().unwrap_or("");
                let q_zero = parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.parse::<f32>().ok())
                        .is_some_and(|q| q == 0.0)
                });
                (name.eq_ignore_ascii_case("gzip") || name == "*") && !q_zero
            })
    }

    /// The path split on `/` and percent-decoded; `None` if an escape is malformed.
    pub(crate) fn segments(&self) -> Option<Vec<String>> {
        self.path
            .trim_start_matches('/')
            .split('/')
            .map(|s| percent_decode(s, false))
            .collect()
    }
}

/// Why no request could be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The socket failed or timed out.
    Io(io::Error),
    /// Malformed request: answer 400 and close.
    Bad(String),
    /// Head or body too large: answer with this code and close.
    TooLarge(u16),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// One connection's read side with its buffer of bytes read ahead.
pub(crate) struct Conn<S> {
    pub stream: S,
    buf: Vec<u8>,
}

impl<S: Read + Write> Conn<S> {
    pub(crate) fn new(stream: S) -> Self {
        Conn {
            stream,
            buf: Vec::with_capacity(8192),
        }
    }

    /// Reads more bytes into the buffer; false at a clean end of stream.
    fn fill(&mut self) -> Result<bool, ReadError> {
        let mut tmp = [0u8; 16 * 1024];
        loop {
            match self.stream.read(&mut tmp) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&tmp[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
    }

    fn need(&mut self, n: usize) -> Result<(), ReadError> {
        while self.buf.len() < n {
            if !self.fill()? {
                return Err(ReadError::Bad("unexpected end of body".into()));
            }
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let rest = self.buf.split_off(n);
        std::mem::replace(&mut self.buf, rest)
    }

    fn read_line(&mut self) -> Result<String, ReadError> {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.take(i + 2);
                return String::from_utf8(line[..i].to_vec())
                    .map_err(|_| ReadError::Bad("bad chunk line".into()));
            }
            if self.buf.len() > 4096 {
                return Err(ReadError::Bad("chunk line too long".into()));
            }
            if !self.fill()? {
                return Err(ReadError::Bad("unexpected end of chunked body".into()));
            }
        }
    }

    /// Reads and parses a request head: method, target, HTTP minor version and headers
    /// (names lower-cased, values trimmed); `Ok(None)` when the peer closed between
    /// requests.
    fn read_head(&mut self) -> Result<Option<RequestHead>, ReadError> {
        let (head, head_len) = loop {
            if !self.buf.is_empty() {
                let mut hs = [httparse::EMPTY_HEADER; MAX_HEADERS];
                let mut req = httparse::Request::new(&mut hs);
                match req.parse(&self.buf) {
                    Ok(httparse::Status::Complete(n)) => {
                        let headers: Vec<(String, String)> = req
                            .headers
                            .iter()
                            .map(|h| {
                                (
                                    h.name.to_ascii_lowercase(),
                                    String::from_utf8_lossy(h.value).trim().to_string(),
                                )
                            })
                            .collect();
                        let head = RequestHead {
                            method: req.method.unwrap_or("").to_string(),
                            target: req.path.unwrap_or("").to_string(),
                            version: req.version.unwrap_or(1),
                            headers,
                        };
                        break (head, n);
                    }
                    Ok(httparse::Status::Partial) => {}
                    Err(httparse::Error::TooManyHeaders) => return Err(ReadError::TooLarge(431)),
                    Err(e) => return Err(ReadError::Bad(e.to_string())),
                }
                if self.buf.len() > MAX_HEAD {
                    return Err(ReadError::TooLarge(431));
                }
            }
            if !self.fill()? {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(ReadError::Bad("unexpected end of request head".into()));
            }
        };
        self.take(head_len);
        Ok(Some(head))
    }

    /// Reads a chunked body (chunk extensions and trailers are skipped), at most
    /// `MAX_BODY` bytes.
    fn read_chunked_body(&mut self) -> Result<Vec<u8>, ReadError> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line()?;
            let size_hex = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_hex, 16)
                .map_err(|_| ReadError::Bad("bad chunk size".into()))?;
            if size == 0 {
                while !self.read_line()?.is_empty() {}
                return Ok(body);
            }
            if body.len() + size > MAX_BODY {
                return Err(ReadError::TooLarge(413));
            }
            self.need(size + 2)?;
            let chunk = self.take(size + 2);
            body.extend_from_slice(&chunk[..size]);
        }
    }

    /// Reads the next request; `Ok(None)` when the peer closed between requests.
    pub(crate) fn read_request(&mut self) -> Result<Option<Request>, ReadError> {
        let Some(RequestHead {
            method,
            target,
            version,
            headers,
        }) = self.read_head()?
        else {
            return Ok(None);
        };
        let mut req = Request {
            method,
            path: String::new(),
            query: Vec::new(),
            headers,
            body: Vec::new(),
            keep_alive: true,
        };
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        req.path = path.to_string();
        req.query = parse_query(query);
        let connection = req.header("connection").unwrap_or("").to_ascii_lowercase();
        req.keep_alive = if version == 0 {
            connection.contains("keep-alive")
        } else {
            !connection.contains("close")
        };
        let chunked = req
            .header("transfer-encoding")
            .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
        let length = match req.header("content-length") {
            Some(v) if !chunked => Some(
                v.parse::<usize>()
                    .map_err(|_| ReadError::Bad("bad Content-Length".into()))?,
            ),
            _ => None,
        };
        if length.is_some_and(|n| n > MAX_BODY) {
            return Err(ReadError::TooLarge(413));
        }
        let has_body = chunked || length.is_some_and(|n| n > 0);
        let expects_continue = req
            .header("expect")
            .is_some_and(|e| e.eq_ignore_ascii_case("100-continue"));
        if has_body && expects_continue && self.buf.is_empty() {
            self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
            self.stream.flush()?;
        }
        if chunked {
            req.body = self.read_chunked_body()?;
        } else if let Some(n) = length {
            self.need(n)?;
            req.body = self.take(n);
        }
        Ok(Some(req))
    }
}

/// A parsed request head.
struct RequestHead {
    method: String,
    /// The request target: path and query.
    target: String,
    /// The HTTP minor version (0 for HTTP/1.0).
    version: u8,
    headers: Vec<(String, String)>,
}

/// Writes a streamed body.
pub(crate) type BodyFn = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + Send>;

/// A response body: bytes, or a writer run as the body streams out.
pub(crate) enum Body {
    Bytes(Vec<u8>),
    /// Buffered up to the gzip threshold, then chunked (see [`write_response`]).
    Stream(BodyFn),
    /// A stream of events (a watch): the head goes out at once, chunked and never gzipped,
    /// and every `flush()` of the writer sends what was written since as one chunk.
    Watch(BodyFn),
}

impl Body {
    /// The whole body in memory; `None` for a watch, which may never end.
    pub(crate) fn into_bytes(self) -> io::Result<Option<Vec<u8>>> {
        match self {
            Body::Bytes(b) => Ok(Some(b)),
            Body::Stream(f) => {
                let mut b = Vec::new();
                f(&mut b)?;
                Ok(Some(b))
            }
            Body::Watch(_) => Ok(None),
        }
    }
}

/// A response to write.
pub(crate) struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body,
}

impl Response {
    /// A JSON response.
    pub(crate) fn json(status: u16, body: Vec<u8>) -> Self {
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: Body::Bytes(body),
        }
    }

    /// A plain-text response.
    pub(crate) fn text(status: u16, body: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: Body::Bytes(body.as_bytes().to_vec()),
        }
    }
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        410 => "Gone",
        413 => "Request Entity Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

enum Framing {
    Length(usize),
    Chunked,
}

struct Head<'a> {
    status: u16,
    content_type: &'static str,
    headers: &'a [(&'static str, String)],
    keep_alive: bool,
}

fn write_head(w: &mut dyn Write, h: &Head<'_>, framing: Framing, gzip: bool) -> io::Result<()> {
    let mut s = format!(
        "HTTP/1.1 {} {}\r\nAudit-Id: {}\r\nCache-Control: no-cache, private\r\nContent-Type: {}\r\nDate: {}\r\n",
        h.status,
        reason_phrase(h.status),
        audit_id(),
        h.content_type,
        http_date(std::time::SystemTime::now())
    );
    for (k, v) in h.headers {
        s.push_str(&format!("{k}: {v}\r\n"));
    }
    if gzip {
        s.push_str("Content-Encoding: gzip\r\nVary: Accept-Encoding\r\n");
    }
    match framing {
        Framing::Length(n) => s.push_str(&format!("Content-Length: {n}\r\n")),
        Framing::Chunked => s.push_str("Transfer-Encoding: chunked\r\n"),
    }
    if !h.keep_alive {
        s.push_str("Connection: close\r\n");
    }
    s.push_str("\r\n");
    w.write_all(s.as_bytes())
}

fn audit_id() -> String {
    thread_local! {
        static RNG: std::cell::RefCell<super::util::SplitMix64> =
            std::cell::RefCell::new(super::util::SplitMix64::from_entropy());
    }
    RNG.with(|r| super::util::uuid_v4(&mut r.borrow_mut()))
}

/// Writes `buf` as one chunk of chunked transfer encoding (nothing when empty) and empties it.
fn write_chunk(out: &mut dyn Write, buf: &mut Vec<u8>) -> io::Result<()> {
    if !buf.is_empty() {
        write!(out, "{:x}\r\n", buf.len())?;
        out.write_all(buf)?;
        out.write_all(b"\r\n")?;
        buf.clear();
    }
    Ok(())
}

/// Chunked transfer encoding with its own 32 KiB buffer, so chunks are not tiny.
struct Chunked<'a> {
    out: &'a mut dyn Write,
    buf: Vec<u8>,
}

impl Chunked<'_> {
    fn flush_chunk(&mut self) -> io::Result<()> {
        write_chunk(self.out, &mut self.buf)
    }

    fn finish(mut self) -> io::Result<()> {
        self.flush_chunk()?;
        self.out.write_all(b"0\r\n\r\n")
    }
}

impl Write for Chunked<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 32 * 1024 {
            self.flush_chunk()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Stage<'a> {
    Buffering(Vec<u8>),
    Plain(Chunked<'a>),
    Gzip(Box<GzEncoder<Chunked<'a>>>),
    Switching,
}

/// Buffers the body until it passes the gzip threshold, then commits the head and
/// streams (chunked, gzipped if accepted).
struct BodyWriter<'a, 'h> {
    out: Option<&'a mut dyn Write>,
    head: Head<'h>,
    gzip_ok: bool,
    stage: Stage<'a>,
}

impl<'a> BodyWriter<'a, '_> {
    fn start_streaming(&mut self) -> io::Result<()> {
        let Stage::Buffering(buf) = std::mem::replace(&mut self.stage, Stage::Switching) else {
            return Ok(());
        };
        let Some(out) = self.out.take() else {
            return Err(io::Error::other("response already started"));
        };
        write_head(out, &self.head, Framing::Chunked, self.gzip_ok)?;
        let chunked = Chunked {
            out,
            buf: Vec::with_capacity(40 * 1024),
        };
        if self.gzip_ok {
            let mut gz = GzEncoder::new(chunked, Compression::fast());
            gz.write_all(&buf)?;
            self.stage = Stage::Gzip(Box::new(gz));
        } else {
            let mut c = chunked;
            c.write_all(&buf)?;
            self.stage = Stage::Plain(c);
        }
        Ok(())
    }

    fn finish(mut self) -> io::Result<()> {
        match std::mem::replace(&mut self.stage, Stage::Switching) {
            Stage::Buffering(buf) => {
                let Some(out) = self.out.take() else {
                    return Err(io::Error::other("response already started"));
                };
                write_head(out, &self.head, Framing::Length(buf.len()), false)?;
                out.write_all(&buf)
            }
            Stage::Plain(c) => c.finish(),
            Stage::Gzip(gz) => gz.finish()?.finish(),
            Stage::Switching => Err(io::Error::other("response in a broken state")),
        }
    }
}

impl Write for BodyWriter<'_, '_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match &mut self.stage {
            Stage::Buffering(buf) => {
                buf.extend_from_slice(data);
                if buf.len() > GZIP_THRESHOLD {
                    self.start_streaming()?;
                }
            }
            Stage::Plain(c) => c.write_all(data)?,
            Stage::Gzip(gz) => gz.write_all(data)?,
            Stage::Switching => return Err(io::Error::other("response in a broken state")),
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A chunk per `flush()`: what a watch writes goes out as soon as it flushes, as Go's
/// `http.Flusher` does under the apiserver's watch handler.
struct FlushingChunked<'a> {
    out: &'a mut dyn Write,
    buf: Vec<u8>,
}

impl Write for FlushingChunked<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        write_chunk(self.out, &mut self.buf)?;
        self.out.flush()
    }
}

/// Writes a watch: the head at once (chunked), then the events as `f` flushes them, then
/// the last chunk when `f` returns.
fn write_watch(out: &mut dyn Write, head: &Head<'_>, f: BodyFn) -> io::Result<()> {
    write_head(out, head, Framing::Chunked, false)?;
    out.flush()?;
    let mut w = FlushingChunked {
        out,
        buf: Vec::new(),
    };
    f(&mut w)?;
    w.flush()?;
    w.out.write_all(b"0\r\n\r\n")?;
    w.out.flush()
}

/// Writes `resp`. Bodies up to 128 KiB go out with Content-Length; larger ones are
/// chunked, and gzipped when `gzip_ok`. A watch streams chunk by chunk, never gzipped.
pub(crate) fn write_response(
    out: &mut dyn Write,
    resp: Response,
    keep_alive: bool,
    gzip_ok: bool,
) -> io::Result<()> {
    let head = Head {
        status: resp.status,
        content_type: resp.content_type,
        headers: &resp.headers,
        keep_alive,
    };
    let body = match resp.body {
        Body::Watch(f) => return write_watch(out, &head, f),
        b => b,
    };
    let mut w = BodyWriter {
        out: Some(out),
        head,
        gzip_ok,
        stage: Stage::Buffering(Vec::new()),
    };
    match body {
        Body::Bytes(b) => w.write_all(&b)?,
        Body::Stream(f) => f(&mut w)?,
        Body::Watch(_) => return Err(io::Error::other("a watch is written by write_watch")),
    }
    w.finish()
}

/// Writes `resp` cut short: the head announces the full body with Content-Length (and
/// `Connection: close`), but only the first half of the body follows. The caller then
/// closes the connection.
pub(crate) fn write_truncated(out: &mut dyn Write, resp: Response) -> io::Result<()> {
    let body = write_whole_length_head(out, resp)?;
    out.write_all(&body[..body.len() / 2])?;
    out.flush()
}

/// Writes the head of `resp` with the whole body's `Content-Length` (no gzip, `Connection:
/// close`) and returns the body, for the faults that then send less of it or send it slowly.
/// Errors: a watch response (it has no length), or the write's.
fn write_whole_length_head(out: &mut dyn Write, resp: Response) -> io::Result<Vec<u8>> {
    let Some(body) = resp.body.into_bytes()? else {
        return Err(io::Error::other("a watch cannot be cut short or trickled"));
    };
    let head = Head {
        status: resp.status,
        content_type: resp.content_type,
        headers: &resp.headers,
        keep_alive: false,
    };
    write_head(out, &head, Framing::Length(body.len()), false)?;
    Ok(body)
}

/// Writes the head (with the full `Content-Length`, no gzip) at once, then the body one
/// byte every `every` (fault `trickle`). Stops at the first write error (the client gave up).
pub(crate) fn write_trickled(
    out: &mut dyn Write,
    resp: Response,
    every: std::time::Duration,
) -> io::Result<()> {
    let body = write_whole_length_head(out, resp)?;
    out.flush()?;
    for b in &body {
        std::thread::sleep(every);
        out.write_all(std::slice::from_ref(b))?;
        out.flush()?;
    }
    Ok(())
}

/// The answer to a request that could not be parsed (what Go's server sends).
pub(crate) fn write_plain_error(out: &mut dyn Write, code: u16) -> io::Result<()> {
    let body = format!("{code} {}", reason_phrase(code));
    write!(
        out,
        "HTTP/1.1 {code} {}\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        reason_phrase(code),
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A fake socket: reads from `input`, collects writes.
    struct Fake {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Fake {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            // Dribble one byte at a time to exercise partial parses.
            let n = b.len().min(1);
            self.input.read(&mut b[..n])
        }
    }

    impl Write for Fake {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn conn(input: &str) -> Conn<Fake> {
        Conn::new(Fake {
            input: Cursor::new(input.as_bytes().to_vec()),
            output: Vec::new(),
        })
    }

    #[test]
    fn parses_pipelined_requests_with_both_body_framings() {
        let mut c = conn(concat!(
            "POST /a?x=1&y=a+b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
            "DELETE /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n",
            "2\r\nhi\r\n3;ext=1\r\n!!!\r\n0\r\n\r\n",
            "GET /c HTTP/1.0\r\n\r\n"
        ));
        let a = c.read_request().unwrap().unwrap();
        assert_eq!((a.method.as_str(), a.path.as_str()), ("POST", "/a"));
        assert_eq!(a.param("y"), Some("a b"));
        assert_eq!(a.body, b"abc");
        assert!(a.keep_alive);
        let b = c.read_request().unwrap().unwrap();
        assert_eq!(b.body, b"hi!!!");
        assert!(String::from_utf8_lossy(&c.stream.output).contains("100 Continue"));
        let g = c.read_request().unwrap().unwrap();
        assert!(!g.keep_alive);
        assert!(c.read_request().unwrap().is_none());
    }

    #[test]
    fn rejects_garbage_and_huge_bodies() {
        assert!(matches!(
            conn("NOT A REQUEST\r\n\r\n").read_request(),
            Err(ReadError::Bad(_))
        ));
        assert!(matches!(
            conn("POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n").read_request(),
            Err(ReadError::TooLarge(413))
        ));
    }

    fn split_response(raw: &[u8]) -> (String, Vec<u8>) {
        let i = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        (
            String::from_utf8(raw[..i].to_vec()).unwrap(),
            raw[i + 4..].to_vec(),
        )
    }

    fn dechunk(mut b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let i = b.windows(2).position(|w| w == b"\r\n").unwrap();
            let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap(), 16).unwrap();
            b = &b[i + 2..];
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&b[..n]);
            b = &b[n + 2..];
        }
    }

    #[test]
    fn small_bodies_have_a_length_and_large_ones_are_gzipped() {
        let mut raw = Vec::new();
        write_response(&mut raw, Response::json(200, b"{}".to_vec()), true, true).unwrap();
        let (head, body) = split_response(&raw);
        assert!(head.contains("Content-Length: 2"));
        assert!(!head.contains("gzip"));
        assert_eq!(body, b"{}");

        let big: Vec<u8> = (0..GZIP_THRESHOLD + 10)
            .map(|i| b'a' + (i % 26) as u8)
            .collect();
        let expect = big.clone();
        let mut raw = Vec::new();
        let resp = Response {
            status: 200,
            content_type: "application/json",
            headers: Vec::new(),
            body: Body::Stream(Box::new(move |w: &mut dyn Write| {
                for c in big.chunks(1000) {
                    w.write_all(c)?;
                }
                Ok(())
            })),
        };
        write_response(&mut raw, resp, false, true).unwrap();
        let (head, body) = split_response(&raw);
        assert!(head.contains("Content-Encoding: gzip"));
        assert!(head.contains("Vary: Accept-Encoding"));
        assert!(head.contains("Transfer-Encoding: chunked"));
        assert!(head.contains("Connection: close"));
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&dechunk(&body)[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert_eq!(plain, expect);

        let mut raw = Vec::new();
        let exact = vec![b'x'; GZIP_THRESHOLD];
        write_response(&mut raw, Response::json(200, exact), true, true).unwrap();
        assert!(split_response(&raw)
            .0
            .contains(&format!("Content-Length: {GZIP_THRESHOLD}")));
    }

    /// Records what was written and how much of it at each flush.
    #[derive(Default)]
    struct Recorder {
        data: Vec<u8>,
        flushed_at: Vec<usize>,
    }

    impl Write for Recorder {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.data.extend_from_slice(b);
            Ok(b.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            self.flushed_at.push(self.data.len());
            Ok(())
        }
    }

    #[test]
    fn a_watch_goes_out_a_chunk_per_flush_and_never_gzipped() {
        let resp = Response {
            status: 200,
            content_type: "application/json",
            headers: Vec::new(),
            body: Body::Watch(Box::new(|w: &mut dyn Write| {
                w.write_all(b"a\n")?;
                w.flush()?;
                w.write_all(b"bc")?;
                w.write_all(b"\n")?;
                w.flush()
            })),
        };
        let mut out = Recorder::default();
        write_response(&mut out, resp, true, true).unwrap();
        let (head, body) = split_response(&out.data);
        assert!(head.contains("Transfer-Encoding: chunked"), "{head}");
        assert!(
            !head.contains("Content-Length") && !head.contains("gzip"),
            "{head}"
        );
        assert_eq!(body, b"2\r\na\n\r\n3\r\nbc\n\r\n0\r\n\r\n");
        // The head went out before any event, and each event as soon as it was flushed.
        let head_len = head.len() + 4;
        let after: Vec<usize> = out.flushed_at.iter().map(|n| n - head_len).collect();
        assert_eq!(after, [0, 7, 15, 15, 20]);
    }
}
