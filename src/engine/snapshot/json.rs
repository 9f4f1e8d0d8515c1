//! The JSON reader under the pod list decoder: a serde [`Deserializer`](de::Deserializer) over
//! a byte slice, for the `Raw*` structs of the snapshot.
//!
//! Why our own reader. A realistic executor pod is about 5.5 KB of JSON, of which the snapshot
//! keeps about 300 bytes (names, labels, phase, a few container states). serde_json's
//! `IgnoredAny` tokenises every skipped byte, and that skip was most of a tick's CPU. This
//! reader decodes the values the snapshot reads exactly as serde_json does (the same grammar,
//! escapes, numbers and recursion limit of 128; escape-free strings are borrowed from the
//! input), and skips every other array and object by its structure alone, 64 bytes at a time
//! (simdjson's stage-one method: quotes, backslashes and brackets as bit masks, with SSE2 on
//! x86-64 and a byte loop elsewhere).
//!
//! **What a skipped value is checked for**, as serde_json checks a value it skips: every
//! string is closed, holds no raw control character (U+0000–U+001F) and only valid escapes
//! (`\"` `\\` `\/` `\b` `\f` `\n` `\r` `\t` `\uXXXX`; the text of a skipped string is not
//! checked to be UTF-8, as serde_json does not); brackets balance and match (`[` with `]`,
//! `{` with `}`); no byte outside a string is 0x80 or above. A scalar skipped on its own (a
//! number, a literal) is checked for its grammar; a number is not checked to fit an `f64`,
//! as serde_json's skip does not check it either.
//!
//! **Not checked** inside a skipped array or object: the tokens between the strings and
//! brackets (commas, colons, the spelling of numbers and of `true`, `false`, `null`, or any
//! other ASCII byte there). A field whose mere presence decides something
//! (`metadata.deletionTimestamp`, a container's `state.running`) is not skipped but read as
//! [`Checked`], in full. So every body serde_json accepts decodes here to the same snapshot (a property
//! test checks it on mutated pages), and a body whose only fault is such a token inside a
//! field the snapshot does not read decodes here too. simdjson's On-Demand API makes the same
//! trade (its documentation, `doc/basics.md`: an object or array is checked as it is read,
//! not as a whole): the values a program reads are validated, the ones it skips only for
//! their structure.
//!
//! Errors carry the byte position where they were found and whether the input ended first
//! (the streaming decoder then reads more of the body and tries again).

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// serde_json's limit on nested arrays and objects in a decoded value.
const RECURSION_LIMIT: u8 = 128;

/// A value decoded only to learn that it is there, and checked in full as serde_json would
/// check it (unlike `IgnoredAny`, which this reader skips by structure): for fields whose
/// presence decides something, such as `metadata.deletionTimestamp`.
pub(super) struct Checked;

impl<'de> de::Deserialize<'de> for Checked {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        deserialize_checked(d)
    }
}

impl KeptOfAny for Checked {
    fn of_str(_: &str) -> Self {
        Checked
    }
    fn other() -> Self {
        Checked
    }
}

/// What a value decoded as [`Checked`] is (checked in full) keeps of itself: something of
/// a string, the same thing of any other value.
pub(super) trait KeptOfAny: Sized {
    /// What a string value keeps.
    fn of_str(s: &str) -> Self;
    /// What any other value (a number, a bool, null, a list, an object) keeps.
    fn other() -> Self;
}

/// Decodes any value, checked in full as serde_json would check it (the elements of a list
/// and the entries of an object as [`Checked`]), into `T` ([`KeptOfAny`]).
pub(super) fn deserialize_checked<'de, D: de::Deserializer<'de>, T: KeptOfAny>(
    d: D,
) -> Result<T, D::Error> {
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: KeptOfAny> Visitor<'de> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<T, E> {
            Ok(T::other())
        }
        fn visit_i64<E>(self, _: i64) -> Result<T, E> {
            Ok(T::other())
        }
        fn visit_u64<E>(self, _: u64) -> Result<T, E> {
            Ok(T::other())
        }
        fn visit_f64<E>(self, _: f64) -> Result<T, E> {
            Ok(T::other())
        }
        fn visit_str<E>(self, v: &str) -> Result<T, E> {
            Ok(T::of_str(v))
        }
        fn visit_unit<E>(self) -> Result<T, E> {
            Ok(T::other())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<T, A::Error> {
            while a.next_element::<Checked>()?.is_some() {}
            Ok(T::other())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<T, A::Error> {
            while a.next_entry::<Checked, Checked>()?.is_some() {}
            Ok(T::other())
        }
    }
    d.deserialize_any(V(std::marker::PhantomData))
}

/// The most elements [`Capped`] takes.
pub(super) const MAX_LIST: usize = 10_000;

/// A list of at most [`MAX_LIST`] elements; more is an error. Memory for one pod then stays
/// bounded by its JSON's size times a small factor, whatever a hostile server sends (a
/// 3-byte `[]` decodes to a whole container status).
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
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Capped<T>, A::Error> {
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

/// A decode error: the message, the byte where it was found (`None` for an error raised by a
/// visitor, placed by [`from_prefix`]) and whether the input ended early.
#[derive(Debug)]
pub(super) struct Error {
    msg: String,
    pos: Option<usize>,
    eof: bool,
}

impl Error {
    fn at(msg: impl Into<String>, pos: usize) -> Self {
        Error {
            msg: msg.into(),
            pos: Some(pos),
            eof: false,
        }
    }

    /// The input ended before the value did.
    pub(super) fn is_eof(&self) -> bool {
        self.eof
    }

    /// The byte offset (in the input given to [`from_prefix`]) where the error was found.
    pub(super) fn offset(&self) -> usize {
        self.pos.unwrap_or(0)
    }

    /// The message without a position.
    pub(super) fn message(&self) -> &str {
        &self.msg
    }

    /// `message at line L column C` of `input` (1-based, as serde_json words it).
    pub(super) fn with_line(&self, input: &[u8]) -> String {
        let pos = self.offset().min(input.len());
        let before = &input[..pos];
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        let column = pos
            - before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1)
            + 1;
        format!("{} at line {line} column {column}", self.msg)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.pos {
            Some(p) => write!(f, "{} at byte {p}", self.msg),
            None => f.write_str(&self.msg),
        }
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error {
            msg: msg.to_string(),
            pos: None,
            eof: false,
        }
    }
}

/// Decodes one `T` from the start of `input` (leading whitespace allowed) and returns it with
/// the number of bytes it took; what follows is not looked at. Errors: see [`Error`].
pub(super) fn from_prefix<'de, T: de::Deserialize<'de>>(
    input: &'de [u8],
) -> Result<(T, usize), Error> {
    let mut r = Reader::new(input);
    match T::deserialize(&mut r) {
        Ok(v) => Ok((v, r.pos)),
        Err(mut e) => {
            e.pos.get_or_insert(r.pos);
            Err(e)
        }
    }
}

/// Decodes `input` as exactly one `T` (whitespace around it allowed). Errors: see [`Error`];
/// anything after the value is "trailing characters".
pub(super) fn from_slice<'de, T: de::Deserialize<'de>>(input: &'de [u8]) -> Result<T, Error> {
    let (v, n) = from_prefix(input)?;
    match input[n..].iter().position(|b| !is_ws(*b)) {
        None => Ok(v),
        Some(i) => Err(Error::at("trailing characters", n + i)),
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// A string as read: borrowed from the input when it has no escape, else decoded.
enum Text<'de> {
    Borrowed(&'de str),
    Owned(String),
}

enum Number {
    U(u64),
    I(i64),
    F(f64),
}

/// The reader: `s[pos..]` is still to be read.
pub(super) struct Reader<'de> {
    s: &'de [u8],
    pos: usize,
    /// Nested arrays and objects still allowed (see [`RECURSION_LIMIT`]).
    depth_left: u8,
    /// While skipping: the open arrays and objects.
    closers: Open,
}

impl<'de> Reader<'de> {
    fn new(s: &'de [u8]) -> Self {
        Reader {
            s,
            pos: 0,
            depth_left: RECURSION_LIMIT,
            closers: Open::default(),
        }
    }

    fn eof(&self) -> Error {
        Error {
            msg: "EOF while parsing a value".to_string(),
            pos: Some(self.s.len()),
            eof: true,
        }
    }

    fn err(&self, msg: &str) -> Error {
        Error::at(msg, self.pos)
    }

    /// The next byte that is not whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        while let Some(&b) = self.s.get(self.pos) {
            if !is_ws(b) {
                return Some(b);
            }
            self.pos += 1;
        }
        None
    }

    /// Consumes `want` after whitespace, or fails with `msg`.
    fn expect(&mut self, want: u8, msg: &str) -> Result<(), Error> {
        match self.peek() {
            Some(b) if b == want => {
                self.pos += 1;
                Ok(())
            }
            Some(_) => Err(self.err(msg)),
            None => Err(self.eof()),
        }
    }

    /// Consumes the literal `word` (`null`, `true`, `false`) at `pos`.
    fn literal(&mut self, word: &[u8]) -> Result<(), Error> {
        for &w in word {
            match self.s.get(self.pos) {
                Some(&b) if b == w => self.pos += 1,
                Some(_) => return Err(self.err("expected ident")),
                None => return Err(self.eof()),
            }
        }
        Ok(())
    }

    /// A string whose opening quote is at `pos - 1`; `pos` ends after the closing quote.
    fn string(&mut self) -> Result<Text<'de>, Error> {
        let start = self.pos;
        let (end, high) = special(self.s, start).ok_or_else(|| self.eof())?;
        if self.s[end] == b'"' {
            self.pos = end + 1;
            return text(&self.s[start..end], !high, start).map(Text::Borrowed);
        }
        let mut out: Vec<u8> = Vec::with_capacity(end - start + 16);
        let mut at = start;
        loop {
            let (i, high) = special(self.s, at).ok_or_else(|| self.eof())?;
            // Escapes are ASCII, so a character never spans one: each run between them is
            // checked on its own, and an error names its byte in the input.
            out.extend_from_slice(text(&self.s[at..i], !high, at)?.as_bytes());
            match self.s[i] {
                b'"' => {
                    self.pos = i + 1;
                    return String::from_utf8(out)
                        .map(Text::Owned)
                        .map_err(|_| Error::at("invalid unicode code point", start));
                }
                b'\\' => at = self.unescape(i + 1, &mut out)?,
                _ => {
                    return Err(Error::at(
                        "control character (\\u0000-\\u001F) found while parsing a string",
                        i,
                    ))
                }
            }
        }
    }

    /// Decodes the escape whose letter is at `i` into `out`; returns the index after it.
    fn unescape(&self, i: usize, out: &mut Vec<u8>) -> Result<usize, Error> {
        let c = *self.s.get(i).ok_or_else(|| self.eof())?;
        let simple = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 8,
            b'f' => 12,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => return self.unicode_escape(i + 1, out),
            _ => return Err(Error::at("invalid escape", i)),
        };
        out.push(simple);
        Ok(i + 1)
    }

    /// `\uXXXX` (and the `\uXXXX` of a surrogate pair's second half) with the hex digits at
    /// `i`: the character into `out`; returns the index after it. A surrogate that is not
    /// half of a pair is an error, as serde_json has it.
    fn unicode_escape(&self, i: usize, out: &mut Vec<u8>) -> Result<usize, Error> {
        let hi = self.hex4(i)?;
        let (code, next) = match hi {
            0xD800..=0xDBFF => {
                match (self.s.get(i + 4), self.s.get(i + 5)) {
                    (Some(b'\\'), Some(b'u')) => {}
                    (None, _) | (Some(b'\\'), None) => return Err(self.eof()),
                    _ => return Err(Error::at("lone leading surrogate in hex escape", i + 4)),
                }
                let lo = self.hex4(i + 6)?;
                if !(0xDC00..=0xDFFF).contains(&lo) {
                    return Err(Error::at("lone leading surrogate in hex escape", i + 6));
                }
                let code = 0x10000 + ((u32::from(hi) - 0xD800) << 10) + (u32::from(lo) - 0xDC00);
                (code, i + 10)
            }
            0xDC00..=0xDFFF => {
                return Err(Error::at("lone leading surrogate in hex escape", i));
            }
            _ => (u32::from(hi), i + 4),
        };
        let ch = char::from_u32(code).ok_or_else(|| Error::at("invalid unicode code point", i))?;
        out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
        Ok(next)
    }

    /// Four hex digits at `i`.
    fn hex4(&self, i: usize) -> Result<u16, Error> {
        let digits = self.s.get(i..i + 4).ok_or_else(|| self.eof())?;
        let mut v: u16 = 0;
        for (k, &d) in digits.iter().enumerate() {
            let x = (d as char)
                .to_digit(16)
                .ok_or_else(|| Error::at("invalid escape", i + k))?;
            v = (v << 4) | x as u16;
        }
        Ok(v)
    }

    /// A number at `pos` (JSON's grammar: `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`):
    /// an integer that fits `u64` (or `i64` when negative) as one, else an `f64`.
    fn number(&mut self) -> Result<Number, Error> {
        let start = self.pos;
        let (neg, int_end, float) = self.number_grammar()?;
        // The grammar checked makes this ASCII.
        let text = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
        if !float {
            let digits = &text[usize::from(neg)..int_end - start];
            if let Ok(u) = digits.parse::<u64>() {
                if neg && u == 0 {
                    // As serde_json: `-0` keeps its sign as a float.
                    return Ok(Number::F(-0.0));
                }
                if !neg {
                    return Ok(Number::U(u));
                }
                if let Ok(i) = i64::try_from(u).map(|i| -i) {
                    return Ok(Number::I(i));
                }
                if u == 1 << 63 {
                    return Ok(Number::I(i64::MIN));
                }
            }
        }
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Number::F(f)),
            _ => Err(Error::at("number out of range", start)),
        }
    }

    /// Moves past a number's text, checking its grammar only (as serde_json skips one: a
    /// number too large for an `f64` is fine when it is not read). Returns whether it is
    /// negative, where its integer part ends and whether it has a fraction or exponent.
    fn number_grammar(&mut self) -> Result<(bool, usize, bool), Error> {
        let neg = self.s.get(self.pos) == Some(&b'-');
        if neg {
            self.pos += 1;
        }
        match self.s.get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            Some(_) => return Err(self.err("invalid number")),
            None => return Err(self.eof()),
        }
        let int_end = self.pos;
        let mut float = false;
        if self.s.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            self.at_least_one_digit()?;
            float = true;
        }
        if matches!(self.s.get(self.pos), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.s.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            self.at_least_one_digit()?;
            float = true;
        }
        Ok((neg, int_end, float))
    }

    fn digits(&mut self) {
        while matches!(self.s.get(self.pos), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
    }

    fn at_least_one_digit(&mut self) -> Result<(), Error> {
        match self.s.get(self.pos) {
            Some(b'0'..=b'9') => {
                self.digits();
                Ok(())
            }
            Some(_) => Err(self.err("invalid number")),
            None => Err(self.eof()),
        }
    }

    /// Skips one value (see the module doc for what is checked).
    fn skip(&mut self) -> Result<(), Error> {
        match self.peek() {
            None => Err(self.eof()),
            Some(b'{' | b'[') => self.skip_container(),
            Some(b'"') => {
                self.pos = skip_string(self.s, self.pos + 1)?;
                Ok(())
            }
            Some(b'n') => self.literal(b"null"),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'-' | b'0'..=b'9') => self.number_grammar().map(drop),
            Some(_) => Err(self.err("expected value")),
        }
    }

    /// Skips the array or object that opens at `pos`, by its strings and brackets, 64 bytes
    /// at a time (see [`skip_blocks`]).
    fn skip_container(&mut self) -> Result<(), Error> {
        let end = skip_blocks(self.s, self.pos, &mut self.closers)?;
        self.pos = end;
        Ok(())
    }

    /// Moves to the next element of an array or member of an object (`close` is its `]` or
    /// `}`): past the `,` unless it is the `first`, which is then cleared. `false` at the
    /// closing bracket (not consumed).
    fn next_item(&mut self, first: &mut bool, close: u8) -> Result<bool, Error> {
        match self.peek() {
            Some(b) if b == close => return Ok(false),
            Some(b',') if !*first => {
                self.pos += 1;
                match self.peek() {
                    Some(b) if b == close => return Err(self.err("trailing comma")),
                    None => return Err(self.eof()),
                    _ => {}
                }
            }
            Some(_) if *first => {}
            Some(_) if close == b']' => return Err(self.err("expected `,` or `]`")),
            Some(_) => return Err(self.err("expected `,` or `}`")),
            None => return Err(self.eof()),
        }
        *first = false;
        Ok(true)
    }

    /// After a visited array: its `]`.
    fn end_seq(&mut self) -> Result<(), Error> {
        match self.peek() {
            Some(b']') => {
                self.pos += 1;
                Ok(())
            }
            Some(b',') => {
                self.pos += 1;
                match self.peek() {
                    Some(b']') => Err(self.err("trailing comma")),
                    _ => Err(self.err("trailing characters")),
                }
            }
            Some(_) => Err(self.err("trailing characters")),
            None => Err(self.eof()),
        }
    }

    /// After a visited object: its `}`.
    fn end_map(&mut self) -> Result<(), Error> {
        match self.peek() {
            Some(b'}') => {
                self.pos += 1;
                Ok(())
            }
            Some(b',') => Err(self.err("trailing comma")),
            Some(_) => Err(self.err("trailing characters")),
            None => Err(self.eof()),
        }
    }

    /// An array or object opening at `pos`: `visit` reads its items, `end` its closing
    /// bracket; counted against the recursion limit.
    fn nested<T>(
        &mut self,
        visit: impl FnOnce(&mut Self) -> Result<T, Error>,
        end: fn(&mut Self) -> Result<(), Error>,
    ) -> Result<T, Error> {
        self.enter()?;
        let value = visit(self);
        self.depth_left += 1;
        let value = value?;
        end(self)?;
        Ok(value)
    }

    /// Enters an array or object, counting against the recursion limit.
    fn enter(&mut self) -> Result<(), Error> {
        self.depth_left = (self.depth_left.checked_sub(1))
            .filter(|d| *d > 0)
            .ok_or_else(|| self.err("recursion limit exceeded"))?;
        self.pos += 1;
        Ok(())
    }
}

/// The index of the first `"`, `\` or control character (below U+0020) in `s[i..]`, checked
/// eight bytes at a time, and whether a byte before it is not ASCII; `None` when there is none.
fn special(s: &[u8], mut i: usize) -> Option<(usize, bool)> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    #[cfg(target_arch = "x86_64")]
    while let Some(chunk) = s.get(i..i + 16) {
        let (hits, high) = special16(chunk);
        if hits != 0 {
            let k = hits.trailing_zeros() as usize;
            return Some((i + k, high & ((1 << k) - 1) != 0));
        }
        if high != 0 {
            // Rare (text that is not ASCII): the byte loop below tells where.
            break;
        }
        i += 16;
    }
    let mut seen: u64 = 0;
    while let Some(chunk) = s.get(i..i + 8) {
        let w = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let q = w ^ (LO * u64::from(b'"'));
        let b = w ^ (LO * u64::from(b'\\'));
        // A byte is flagged when it is zero after the xor (equal to `"` or `\`), or below
        // 0x20. Borrows can only flag bytes above the first true hit, so the lowest flag is
        // exact.
        let hits = ((q.wrapping_sub(LO) & !q)
            | (b.wrapping_sub(LO) & !b)
            | (w.wrapping_sub(LO * 0x20) & !w))
            & HI;
        if hits != 0 {
            let k = hits.trailing_zeros() as usize / 8;
            let before = w & ((1u64 << (8 * k)) - 1);
            return Some((i + k, (seen | before) & HI != 0));
        }
        seen |= w;
        i += 8;
    }
    let k = (i..s.len()).find(|&k| matches!(s[k], b'"' | b'\\' | 0..=0x1f))?;
    Some((k, seen & HI != 0 || !s[i..k].is_ascii()))
}

/// [`special`] for the 16 bytes of `chunk` with SSE2: the bits of the bytes that are `"`, `\\`
/// or below 0x20, and of those that are 0x80 or above.
#[cfg(target_arch = "x86_64")]
fn special16(chunk: &[u8]) -> (u32, u32) {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    assert!(chunk.len() >= 16);
    // SAFETY: SSE2 is part of the x86-64 baseline; `chunk` has 16 readable bytes and the
    // load is unaligned.
    unsafe {
        let x = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
        let quote = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8));
        // Signed: bytes of 0x80 and above are negative, so below 0x20 too.
        let low = _mm_cmplt_epi8(x, _mm_set1_epi8(0x20));
        let high = _mm_movemask_epi8(x) as u32;
        let hits = _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), low)) as u32;
        (hits & !high, high)
    }
}

/// `s` as text: checked only when `ascii` is false (the scan that found its end saw every
/// byte below 0x80 otherwise). Errors: the first byte that is not UTF-8, as `base + offset`.
fn text(s: &[u8], ascii: bool, base: usize) -> Result<&str, Error> {
    if ascii {
        debug_assert!(s.is_ascii());
        // SAFETY: every byte is below 0x80 (see `special`), and ASCII is UTF-8.
        return Ok(unsafe { std::str::from_utf8_unchecked(s) });
    }
    std::str::from_utf8(s)
        .map_err(|e| Error::at("invalid unicode code point", base + e.valid_up_to()))
}

/// Skips the rest of a string whose opening quote is at `i - 1`; returns the index after its
/// closing quote. Checked as serde_json checks a string it skips: no control character, and
/// escapes valid (`\u` needs four hex digits; surrogates are not paired up, and the text is
/// not checked to be UTF-8).
fn skip_string(s: &[u8], mut i: usize) -> Result<usize, Error> {
    let eof = || Error {
        msg: "EOF while parsing a string".to_string(),
        pos: Some(s.len()),
        eof: true,
    };
    loop {
        i = special(s, i).ok_or_else(eof)?.0;
        match s[i] {
            b'"' => return Ok(i + 1),
            b'\\' => i = skip_escape(s, i + 1)?.ok_or_else(eof)?,
            _ => {
                return Err(Error::at(
                    "control character (\\u0000-\\u001F) found while parsing a string",
                    i,
                ))
            }
        }
    }
}

/// The escape whose letter is at `s[i]` (after a backslash) in a skipped string, checked as
/// serde_json checks one it skips (`\u` needs four hex digits; surrogates are not paired
/// up): the index after it, or `None` when the input ends inside it.
fn skip_escape(s: &[u8], i: usize) -> Result<Option<usize>, Error> {
    match s.get(i) {
        None => Ok(None),
        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(Some(i + 1)),
        Some(b'u') => match s.get(i + 1..i + 5) {
            None => Ok(None),
            Some(hex) => match hex.iter().position(|d| !d.is_ascii_hexdigit()) {
                Some(k) => Err(Error::at("invalid escape", i + 1 + k)),
                None => Ok(Some(i + 5)),
            },
        },
        Some(_) => Err(Error::at("invalid escape", i)),
    }
}

/// The kinds of the brackets open in a skip, innermost last: a bit each (1 for `{`), 64 to a
/// word, so a skip allocates only past 64 levels.
#[derive(Default)]
struct Open {
    top: u64,
    spill: Vec<u64>,
    depth: usize,
}

impl Open {
    fn clear(&mut self) {
        self.top = 0;
        self.spill.clear();
        self.depth = 0;
    }

    fn push(&mut self, brace: bool) {
        if self.depth > 0 && self.depth.is_multiple_of(64) {
            self.spill.push(self.top);
            self.top = 0;
        }
        self.top = (self.top << 1) | u64::from(brace);
        self.depth += 1;
    }

    /// Closes the innermost bracket: whether it was of the kind `brace`; `false` when none
    /// is open.
    fn pop(&mut self, brace: bool) -> bool {
        if self.depth == 0 {
            return false;
        }
        let matched = (self.top & 1 == 1) == brace;
        self.top >>= 1;
        self.depth -= 1;
        if self.depth > 0 && self.depth.is_multiple_of(64) {
            self.top = self.spill.pop().unwrap_or(0);
        }
        matched
    }

    fn is_empty(&self) -> bool {
        self.depth == 0
    }
}

/// The bytes of one 64-byte block that matter to a skip, one bit per byte (bit `k` is byte
/// `k`).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Masks {
    quote: u64,
    backslash: u64,
    /// `{` or `[`.
    open: u64,
    /// `}` or `]`.
    close: u64,
    /// Below 0x20.
    control: u64,
    /// 0x80 and above.
    high: u64,
}

impl Masks {
    /// Byte by byte: the reference the SIMD version is tested against, and the version other
    /// architectures run.
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    fn scalar(block: &[u8; 64]) -> Masks {
        let mut m = Masks {
            quote: 0,
            backslash: 0,
            open: 0,
            close: 0,
            control: 0,
            high: 0,
        };
        for (k, &b) in block.iter().enumerate() {
            let bit = 1u64 << k;
            match b {
                b'"' => m.quote |= bit,
                b'\\' => m.backslash |= bit,
                b'{' | b'[' => m.open |= bit,
                b'}' | b']' => m.close |= bit,
                0..=0x1f => m.control |= bit,
                0x80.. => m.high |= bit,
                _ => {}
            }
        }
        m
    }

    /// With SSE2, which every x86-64 processor has: 16 bytes per compare.
    #[cfg(target_arch = "x86_64")]
    fn simd(block: &[u8; 64]) -> Masks {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_loadu_si128, _mm_movemask_epi8,
            _mm_or_si128, _mm_set1_epi8,
        };
        let mut m = Masks {
            quote: 0,
            backslash: 0,
            open: 0,
            close: 0,
            control: 0,
            high: 0,
        };
        for (k, chunk) in block.chunks_exact(16).enumerate() {
            // SAFETY: SSE2 is part of the x86-64 baseline, so these instructions exist on
            // every processor this code is built for; `chunk` is 16 readable bytes and the
            // load is unaligned.
            unsafe {
                let x = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
                let bits = |v: __m128i| u64::from(_mm_movemask_epi8(v) as u16) << (16 * k);
                // `{` 0x7B and `[` 0x5B differ in bit 0x20 only, as do `}` 0x7D and `]` 0x5D.
                let folded = _mm_or_si128(x, _mm_set1_epi8(0x20));
                let high = bits(x);
                m.quote |= bits(_mm_cmpeq_epi8(x, _mm_set1_epi8(b'"' as i8)));
                m.backslash |= bits(_mm_cmpeq_epi8(x, _mm_set1_epi8(b'\\' as i8)));
                m.open |= bits(_mm_cmpeq_epi8(folded, _mm_set1_epi8(b'{' as i8)));
                m.close |= bits(_mm_cmpeq_epi8(folded, _mm_set1_epi8(b'}' as i8)));
                // Signed: bytes of 0x80 and above are negative, so below 0x20 too.
                m.control |= bits(_mm_cmplt_epi8(x, _mm_set1_epi8(0x20))) & !high;
                m.high |= high;
            }
        }
        m
    }

    fn of(block: &[u8; 64]) -> Masks {
        #[cfg(target_arch = "x86_64")]
        return Masks::simd(block);
        #[cfg(not(target_arch = "x86_64"))]
        return Masks::scalar(block);
    }
}

/// The bytes escaped by a backslash (an odd run of backslashes before them), as simdjson finds
/// them; `carry` is 1 when the block before ended in an unfinished escape, and is updated.
fn escaped(backslash: u64, carry: &mut u64) -> u64 {
    const EVEN: u64 = 0x5555_5555_5555_5555;
    let backslash = backslash & !*carry;
    let follows = (backslash << 1) | *carry;
    let odd_starts = backslash & !EVEN & !follows;
    let (even_runs, overflow) = odd_starts.overflowing_add(backslash);
    *carry = u64::from(overflow);
    (EVEN ^ (even_runs << 1)) & follows
}

/// Bit `k` is the xor of bits `0..=k`: inside a string from its opening quote to just before
/// its closing one.
fn prefix_xor(mut x: u64) -> u64 {
    for shift in [1, 2, 4, 8, 16, 32] {
        x ^= x << shift;
    }
    x
}

/// Skips the array or object opening at `s[start]` (see the module doc for what is checked)
/// and returns the index after its closing bracket. `closers` is scratch space.
///
/// simdjson's stage-one method over 64-byte blocks: the quote, backslash and bracket bytes
/// as bit masks, escaped quotes dropped, string interiors found by a prefix xor of the
/// quotes, then the brackets outside strings matched one by one.
fn skip_blocks(s: &[u8], start: usize, closers: &mut Open) -> Result<usize, Error> {
    let eof = || Error {
        msg: "EOF while parsing a value".to_string(),
        pos: Some(s.len()),
        eof: true,
    };
    closers.clear();
    let mut carry = 0u64; // an escape open at the end of the last block
    let mut in_string = 0u64; // all ones when the last block ended inside a string
    let mut at = start;
    loop {
        let mut pad = [b' '; 64];
        let block: &[u8; 64] = match s.get(at..at + 64) {
            Some(b) => b.try_into().map_err(|_| eof())?,
            None if at < s.len() => {
                pad[..s.len() - at].copy_from_slice(&s[at..]);
                &pad
            }
            None => return Err(eof()),
        };
        let m = Masks::of(block);
        let esc = escaped(m.backslash, &mut carry);
        let inside = prefix_xor(m.quote & !esc) ^ in_string;
        in_string = ((inside as i64) >> 63) as u64;
        // The block up to the container's end (all of it when it does not end here).
        let mut brackets = (m.open | m.close) & !inside;
        let mut upto = u64::MAX;
        while brackets != 0 {
            let k = brackets.trailing_zeros() as usize;
            brackets &= brackets - 1;
            // `{` 0x7B and `}` 0x7D have bit 0x20 set, `[` 0x5B and `]` 0x5D do not.
            let brace = block[k] & 0x20 != 0;
            if m.open & (1 << k) != 0 {
                closers.push(brace);
            } else if !closers.pop(brace) {
                upto = (1u64 << k) - 1;
                check_block(s, at, &m, esc, inside, upto)?;
                return Err(Error::at("mismatched bracket", at + k));
            } else if closers.is_empty() {
                upto = u64::MAX >> (63 - k);
                break;
            }
        }
        check_block(s, at, &m, esc, inside, upto)?;
        if upto != u64::MAX || closers.is_empty() {
            return Ok(at + 64 - upto.leading_zeros() as usize);
        }
        at += 64;
    }
}

/// The faults a skip checks for in the 64-byte block at `s[at..]`, bits under `upto`: a control
/// character in a string, a byte of 0x80 or more or a backslash outside strings, an escape
/// that is not one of JSON's.
fn check_block(
    s: &[u8],
    at: usize,
    m: &Masks,
    esc: u64,
    inside: u64,
    upto: u64,
) -> Result<(), Error> {
    let bad = ((m.control & inside) | ((m.high | m.backslash) & !inside)) & upto;
    let first = |mask: u64| (mask != 0).then(|| mask.trailing_zeros() as usize);
    let mut escapes = esc & inside & upto;
    while escapes != 0 {
        let k = escapes.trailing_zeros() as usize;
        escapes &= escapes - 1;
        if first(bad).is_some_and(|b| b < k) {
            break;
        }
        // An escape cut by the end of the input is fine here: the skip reports the EOF.
        skip_escape(s, at + k)?;
    }
    match first(bad) {
        None => Ok(()),
        Some(k) if m.control & (1 << k) != 0 => Err(Error::at(
            "control character (\\u0000-\\u001F) found while parsing a string",
            at + k,
        )),
        Some(k) => Err(Error::at("expected value", at + k)),
    }
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.peek() {
            None => Err(self.eof()),
            Some(b'n') => self.literal(b"null").and_then(|()| v.visit_unit()),
            Some(b't') => self.literal(b"true").and_then(|()| v.visit_bool(true)),
            Some(b'f') => self.literal(b"false").and_then(|()| v.visit_bool(false)),
            Some(b'"') => {
                self.pos += 1;
                match self.string()? {
                    Text::Borrowed(s) => v.visit_borrowed_str(s),
                    Text::Owned(s) => v.visit_string(s),
                }
            }
            Some(b'-' | b'0'..=b'9') => match self.number()? {
                Number::U(u) => v.visit_u64(u),
                Number::I(i) => v.visit_i64(i),
                Number::F(f) => v.visit_f64(f),
            },
            Some(b'[') => self.nested(|r| v.visit_seq(Seq { r, first: true }), Reader::end_seq),
            Some(b'{') => self.nested(|r| v.visit_map(Map { r, first: true }), Reader::end_map),
            Some(_) => Err(self.err("expected value")),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.peek() {
            Some(b'n') => self.literal(b"null").and_then(|()| v.visit_none()),
            _ => v.visit_some(self),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.skip()?;
        v.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        v: V,
    ) -> Result<V::Value, Error> {
        v.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct enum identifier
    }
}

/// The elements of an array being visited.
struct Seq<'a, 'de> {
    r: &'a mut Reader<'de>,
    first: bool,
}

impl<'de> SeqAccess<'de> for Seq<'_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if !self.r.next_item(&mut self.first, b']')? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.r).map(Some)
    }
}

/// The members of an object being visited.
struct Map<'a, 'de> {
    r: &'a mut Reader<'de>,
    first: bool,
}

impl<'de> MapAccess<'de> for Map<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if !self.r.next_item(&mut self.first, b'}')? {
            return Ok(None);
        }
        if self.r.peek() != Some(b'"') {
            return Err(self.r.err("key must be a string"));
        }
        seed.deserialize(&mut *self.r).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        self.r.expect(b':', "expected `:`")?;
        seed.deserialize(&mut *self.r)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::de::IgnoredAny;

    /// Bytes where JSON's special characters are common.
    fn jsonish() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => prop::sample::select(b"\"\\{}[]:,0123456789-.eE+ntrufalsbx \n\t/".to_vec()),
            1 => any::<u8>(),
        ];
        proptest::collection::vec(byte, 0..300)
    }

    /// Any JSON value, with escapes, non-ASCII text and deep nesting.
    fn value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let text = "[a-z\"\\\\/\u{8}\u{c}\n\r\t\u{1}\u{1f}é€😀 ]{0,12}";
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            text.prop_map(Value::String),
        ];
        leaf.prop_recursive(8, 200, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(text, inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The byte-by-byte skip the block skip must agree with: the index after the value, or
    /// an error (`true`: the input ended first).
    fn skip_by_bytes(s: &[u8], start: usize) -> Result<usize, bool> {
        let mut closers = Vec::new();
        let mut i = start;
        loop {
            let b = *s.get(i).ok_or(true)?;
            i += 1;
            match b {
                b'"' => loop {
                    let c = *s.get(i).ok_or(true)?;
                    i += 1;
                    match c {
                        b'"' => break,
                        b'\\' => match *s.get(i).ok_or(true)? {
                            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 1,
                            b'u' => {
                                let hex = s.get(i + 1..i + 5).ok_or(true)?;
                                if !hex.iter().all(u8::is_ascii_hexdigit) {
                                    return Err(false);
                                }
                                i += 5;
                            }
                            _ => return Err(false),
                        },
                        0..=0x1f => return Err(false),
                        _ => {}
                    }
                },
                b'{' => closers.push(b'}'),
                b'[' => closers.push(b']'),
                b'}' | b']' if closers.pop() != Some(b) => return Err(false),
                b'}' | b']' if closers.is_empty() => return Ok(i),
                b'\\' | 0x80.. => return Err(false),
                _ => {}
            }
        }
    }

    /// `PROPTEST_CASES` when set (`scripts/fuzz.sh` sets it), else `default`.
    pub(in crate::engine::snapshot) fn cases(default: u32) -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases(2000)))]

        /// SSE2 finds the same bytes as the byte loop.
        #[test]
        fn masks_agree(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            let block: [u8; 64] = bytes.try_into().unwrap();
            prop_assert_eq!(Masks::of(&block), Masks::scalar(&block));
        }

        /// The escaped bytes are those after an odd run of backslashes, across blocks.
        #[test]
        fn escapes_across_blocks(blocks in proptest::collection::vec(any::<u64>(), 1..4), dense in any::<bool>()) {
            let masks: Vec<u64> = blocks.iter().map(|&b| if dense { b | b.rotate_left(7) } else { b }).collect();
            let mut carry = 0;
            let mut run = 0u32; // backslashes in a row before the current bit
            for m in &masks {
                let got = escaped(*m, &mut carry);
                for k in 0..64 {
                    let want = run % 2 == 1;
                    prop_assert_eq!(got >> k & 1 == 1, want);
                    run = if m >> k & 1 == 1 && !want { run + 1 } else if m >> k & 1 == 1 { 1 } else { 0 };
                    if want && m >> k & 1 == 1 { run = 0; }
                }
            }
        }

        /// Any valid JSON is skipped to its exact end, compact or pretty, at any offset, and
        /// read in full it equals serde_json's reading.
        #[test]
        fn valid_json_skips_to_its_end(v in value(), pad in 0usize..70, pretty in any::<bool>()) {
            let text = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap();
            let mut input = vec![b' '; pad];
            input.extend_from_slice(&text);
            input.extend_from_slice(b" ,]");
            let (_, n) = from_prefix::<IgnoredAny>(&input).unwrap();
            prop_assert_eq!(n, pad + text.len());
            let (read, n) = from_prefix::<serde_json::Value>(&input).unwrap();
            prop_assert_eq!(n, pad + text.len());
            prop_assert_eq!(read, v);
        }

        /// On any bytes, the block skip agrees with the byte loop: the same end, or both an
        /// error, of the same kind (the input ended, or a fault).
        #[test]
        fn block_skip_agrees_with_bytes(mut body in jsonish(), open in prop::sample::select(b"{[".to_vec())) {
            body.insert(0, open);
            let got = skip_blocks(&body, 0, &mut Open::default()).map_err(|e| e.is_eof());
            prop_assert_eq!(got, skip_by_bytes(&body, 0));
        }

        /// What serde_json accepts, this reader accepts as the same value; what it skips
        /// without complaint is no larger than the value serde_json skips.
        #[test]
        fn never_stricter_than_serde_json(body in jsonish()) {
            if serde_json::from_slice::<IgnoredAny>(&body).is_ok() {
                prop_assert!(from_slice::<IgnoredAny>(&body).is_ok());
            }
            if let Ok(want) = serde_json::from_slice::<serde_json::Value>(&body) {
                prop_assert_eq!(from_slice::<serde_json::Value>(&body).unwrap(), want);
                prop_assert!(from_slice::<IgnoredAny>(&body).is_ok());
            }
            if from_slice::<serde_json::Value>(&body).is_ok() {
                prop_assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
            }
        }
    }

    #[test]
    fn strings_borrow_unless_escaped_and_check_what_serde_json_checks() {
        let (t, _) = from_prefix::<&str>("\"plain é\"".as_bytes()).unwrap();
        assert_eq!(t, "plain é");
        let (t, _) = from_prefix::<String>(br#""a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00z""#).unwrap();
        assert_eq!(t, "a\"\\/\u{8}\u{c}\n\r\t\u{e9}😀z");
        for bad in [
            &br#""\ud800""#[..],
            br#""\udc00""#,
            br#""\ud800\u0041""#,
            br#""\x""#,
            b"\"a\x01\"",
            b"\"\xff\"",
            b"\"\xc3\"",
            br#""\u12g4""#,
        ] {
            let e = from_prefix::<String>(bad).unwrap_err();
            assert!(!e.is_eof(), "{bad:?}: {e}");
            assert!(serde_json::from_slice::<String>(bad).is_err(), "{bad:?}");
        }
        for cut in [&br#""abc"#[..], br#""a\"#, br#""\u12"#, br#""\ud83d"#] {
            assert!(from_prefix::<String>(cut).unwrap_err().is_eof(), "{cut:?}");
        }
    }

    /// Skipped values are checked for their strings, escapes, bytes and brackets, not for the
    /// order of their tokens (the module doc's trade).
    #[test]
    fn what_a_skip_checks() {
        for bad in [
            &br#"{"a":"x\qy"}"#[..],
            b"{\"a\":\"x\x01\"}",
            br#"{"a":[1,2}}"#,
            br#"[{"a":1]]"#,
            br#"[1,\n]"#,
            b"[1,\xc3\xa9]",
        ] {
            let e = from_prefix::<IgnoredAny>(bad).unwrap_err();
            assert!(!e.is_eof(), "{}: {e}", String::from_utf8_lossy(bad));
        }
        for cut in [
            &br#"{"a":[1,2]"#[..],
            br#"{"a":"}"#,
            br#"["\"#,
            b"[" as &[u8],
        ] {
            assert!(
                from_prefix::<IgnoredAny>(cut).unwrap_err().is_eof(),
                "{cut:?}"
            );
        }
        // Nor is the text of a skipped string checked to be UTF-8, as in serde_json.
        assert!(from_prefix::<IgnoredAny>(b"{\"a\":\"\xff\"}").is_ok());
        assert!(serde_json::from_slice::<IgnoredAny>(b"{\"a\":\"\xff\"}").is_ok());
        // Token order inside a skipped container is not checked.
        let (_, n) = from_prefix::<IgnoredAny>(br#"{"a" 1 2 : tru}x"#).unwrap();
        assert_eq!(n, 15);
        // Scalars skipped on their own are parsed in full.
        assert!(from_prefix::<IgnoredAny>(b"tru ").is_err());
        assert!(from_prefix::<IgnoredAny>(b"-x").is_err());
        assert_eq!(
            from_prefix::<IgnoredAny>(b"01").map(|(_, n)| n).ok(),
            Some(1)
        );
    }

    #[test]
    fn numbers_and_limits_as_serde_json() {
        for (text, want) in [
            ("0", "0"),
            ("-0", "-0.0"),
            ("18446744073709551615", "18446744073709551615"),
            ("-9223372036854775808", "-9223372036854775808"),
            ("1.5e3", "1500.0"),
            ("18446744073709551616", "1.8446744073709552e+19"),
        ] {
            let (v, _) = from_prefix::<serde_json::Value>(text.as_bytes()).unwrap();
            assert_eq!(v.to_string(), want, "{text}");
            let theirs: serde_json::Value = serde_json::from_str(text).unwrap();
            assert_eq!(v, theirs, "{text}");
        }
        for bad in ["-", "1.", "1e", "1e+", ".5", "+1", "1e999"] {
            assert!(
                from_slice::<serde_json::Value>(bad.as_bytes()).is_err(),
                "{bad}"
            );
            assert!(
                serde_json::from_slice::<serde_json::Value>(bad.as_bytes()).is_err(),
                "{bad}"
            );
        }
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(from_slice::<serde_json::Value>(deep(127).as_bytes()).is_ok());
        let e = from_slice::<serde_json::Value>(deep(128).as_bytes()).unwrap_err();
        assert!(e.to_string().contains("recursion limit"), "{e}");
        assert!(serde_json::from_slice::<serde_json::Value>(deep(128).as_bytes()).is_err());
        // A skip has no depth limit, like serde_json's.
        assert!(from_slice::<IgnoredAny>(deep(10_000).as_bytes()).is_ok());
    }
}
