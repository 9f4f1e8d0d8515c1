//! Logging set-up of the binary: env_logger on stderr, as text or one JSON object per line,
//! behind a filter that keeps the HTTP and TLS libraries' trace records (which hold raw
//! requests, the Authorization header included) out of the logs.

use podalloc::cli::{LogFormat, Process};
use podalloc::error::Error;
use std::io::Write;

/// The log filter (env_logger syntax) of `--log-level LEVEL` and `-v` × `verbose`.
///
/// A bare level is podalloc's own: the libraries (ureq, rustls, …) log at most `info`, so
/// `--log-level debug` shows podalloc's requests and decisions without the TLS library's
/// handshake lines. `-v` raises podalloc to debug, `-vv` to trace, `-vvv` also lets every
/// library log at debug. `MODULE=LEVEL` directives are taken as written.
pub fn filter(level: &str, verbose: u8) -> String {
    const ORDER: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    let rank = |l: &str| ORDER.iter().position(|o| o.eq_ignore_ascii_case(l));
    let directives: Vec<&str> = level
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .collect();
    let bare = directives.iter().rev().find_map(|d| rank(d)).unwrap_or(3);
    let modules = directives.iter().filter(|d| d.contains('='));
    let ours = bare.max(match verbose {
        0 => 0,
        1 => 4,
        _ => 5,
    });
    let libraries = if verbose >= 3 { 4 } else { bare.min(3) };
    let mut out = format!("{},podalloc={}", ORDER[libraries], ORDER[ours]);
    for m in modules {
        out.push(',');
        out.push_str(m);
    }
    out
}

/// Installs the logger: `level` (`--log-level`, env_logger filter syntax), then `RUST_LOG`
/// when set (it wins), in `format`. Call once.
///
/// Every line carries the app id and namespace once the command has connected (text:
/// `app=… ns=…` in the bracket; JSON: fields `app` and `namespace`), and a record's
/// key-values (the tick line's counts) become JSON fields (text: `k=v` after the message).
/// The app and namespace come from `process.log`, which the command sets; every token in
/// `process.redactions` is scrubbed from the text.
pub fn init(level: &str, format: LogFormat, process: &Process) {
    let mut logger = env_logger::Builder::new();
    // RUST_LOG, when set, is the whole filter (it wins over --log-level and -v).
    match std::env::var("RUST_LOG") {
        Ok(f) if !f.trim().is_empty() => logger.parse_filters(&f),
        _ => logger.parse_filters(level),
    };
    logger.target(env_logger::Target::Stderr);
    match format {
        LogFormat::Text => {
            let (context, redactions) = (process.log.clone(), process.redactions.clone());
            logger.format(move |buf, record| {
                let ctx = match context.current() {
                    Some((app, ns)) => format!(" app={app} ns={ns}"),
                    None => String::new(),
                };
                let mut fields = TextFields(String::new());
                let _ = record.key_values().visit(&mut fields);
                let msg = record.args().to_string();
                writeln!(
                    buf,
                    "[{} {:<5} {}{ctx}] {}{}",
                    now_rfc3339(),
                    record.level(),
                    record.target(),
                    redactions.scrub(&msg),
                    fields.0
                )
            });
        }
        LogFormat::Json => {
            let (context, redactions) = (process.log.clone(), process.redactions.clone());
            logger.format(move |buf, record| {
                let mut line = serde_json::json!({
                    "ts": now_rfc3339(),
                    "level": record.level().to_string(),
                    "module": record.target(),
                    "msg": redactions.scrub(&record.args().to_string()),
                });
                if let Some((app, ns)) = context.current() {
                    line["app"] = app.as_str().into();
                    line["namespace"] = ns.as_str().into();
                }
                let _ = record.key_values().visit(&mut JsonFields(&mut line));
                writeln!(buf, "{line}")
            });
        }
    }
    let logger = logger.build();
    log::set_max_level(logger.filter());
    log::set_boxed_logger(Box::new(Capped {
        inner: logger,
        context: process.log.clone(),
        seen: std::sync::Mutex::new(std::collections::HashMap::new()),
    }))
    .expect("the logger is set once");
}

/// A record's key-values as text after its message: `: k=v k=v` (`tick` left out: the
/// message says it).
struct TextFields(String);

impl<'kvs> log::kv::VisitSource<'kvs> for TextFields {
    fn visit_pair(
        &mut self,
        key: log::kv::Key<'kvs>,
        value: log::kv::Value<'kvs>,
    ) -> Result<(), log::kv::Error> {
        if key.as_str() != "tick" {
            self.0.push_str(if self.0.is_empty() { ": " } else { " " });
            self.0.push_str(&format!("{key}={value}"));
        }
        Ok(())
    }
}

/// Copies a record's key-values into a JSON object (numbers stay numbers).
struct JsonFields<'a>(&'a mut serde_json::Value);

impl<'kvs> log::kv::VisitSource<'kvs> for JsonFields<'_> {
    fn visit_pair(
        &mut self,
        key: log::kv::Key<'kvs>,
        value: log::kv::Value<'kvs>,
    ) -> Result<(), log::kv::Error> {
        let v = if let Some(n) = value.to_u64() {
            serde_json::Value::from(n)
        } else if let Some(n) = value.to_i64() {
            serde_json::Value::from(n)
        } else if let Some(b) = value.to_bool() {
            serde_json::Value::from(b)
        } else {
            serde_json::Value::from(value.to_string())
        };
        self.0[key.as_str()] = v;
        Ok(())
    }
}

/// Reports the warnings still held back by the collapsing (see [`Capped`]); call at exit.
pub fn finish() {
    log::logger().flush();
}

/// Prints the error that ends the command on stderr: `podalloc: error: … [app=A ns=N]` (the
/// app and namespace once the command has connected), or in JSON one object with the log
/// lines' fields plus `exit_code`.
pub fn print_error(format: LogFormat, e: &Error, process: &Process) {
    let msg = process.redactions.scrub(&e.to_string()).into_owned();
    let context = process.log.current();
    match format {
        LogFormat::Text => match context {
            Some((app, ns)) => eprintln!("podalloc: error: {msg} [app={app} ns={ns}]"),
            None => eprintln!("podalloc: error: {msg}"),
        },
        LogFormat::Json => {
            let mut line = serde_json::json!({
                "ts": now_rfc3339(),
                "level": "ERROR",
                "module": "podalloc",
                "msg": msg,
                "exit_code": e.code as i32,
            });
            if let Some((app, ns)) = context {
                line["app"] = app.as_str().into();
                line["namespace"] = ns.as_str().into();
            }
            eprintln!("{line}")
        }
    }
}

/// The wall clock as RFC 3339 with milliseconds (UTC), for the JSON lines.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// How long identical warnings are collapsed into one line and a count.
const COLLAPSE_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// One warning text being collapsed: when its window began, how many were held back.
struct Seen {
    since: std::time::Instant,
    held: u32,
    /// The last text held back.
    last: String,
    /// Its level.
    level: log::Level,
}

/// The installed logger: the filter below, and the collapsing of repeated warnings.
///
/// The HTTP and TLS libraries dump raw requests (the Authorization header included) at trace
/// level: those records are dropped whatever level was asked for, so no token ever reaches
/// the logs.
///
/// A warning identical to one logged less than a minute ago (digits aside: tick numbers,
/// retry counts and delays differ during an outage) is held back and counted; the next one
/// after the minute is logged with `(… N more times in the last minute)`, and [`finish`]
/// reports what is still held, as history (`held back before exit, N more time(s) in the
/// last minute, the last: …`: a "retrying next tick" in it is not a promise). Warnings of target `podalloc::security` (TLS verification
/// off) are never collapsed: they are meant to be seen every tick; nor are the lines of
/// leader election ([`LEADER_LINES`]): each change of leadership is shown. A warning still
/// held at exit is reported by [`finish`] on the line of the app it was about.
/// The target of the tick summary lines, which [`Capped`] never collapses: the runner logs
/// them by their own rule (on a change, else every `--log-every`).
const TICK_LINES: &str = "podalloc::controller::runner";

/// The target of leader election's lines, which [`Capped`] never collapses (the library
/// holds its module path to this name in a test).
const LEADER_LINES: &str = podalloc::controller::LEADER_LOG_TARGET;

struct Capped {
    inner: env_logger::Logger,
    /// Which app a line is about (also read for the key of a collapsed warning).
    context: podalloc::controller::context::LogContext,
    seen: std::sync::Mutex<std::collections::HashMap<String, Seen>>,
}

impl Capped {
    fn allowed(m: &log::Metadata<'_>) -> bool {
        let t = m.target();
        if t.starts_with("ureq_proto") {
            m.level() <= log::Level::Info
        } else if t.starts_with("ureq") || t.starts_with("rustls") {
            m.level() <= log::Level::Debug
        } else {
            true
        }
    }

    /// The key under which warnings count as identical: the app the line is about (so one
    /// app's line never holds back another's), the target, and the text with every run of
    /// digits replaced by `#`.
    fn key(&self, r: &log::Record<'_>) -> String {
        let app = self.context.current().unwrap_or_default();
        let mut k = format!("{}\u{0}{}|{}|", app.1, app.0, r.target());
        if r.level() != log::Level::Warn {
            k.push_str(&r.args().to_string());
            return k;
        }
        let mut in_digits = false;
        for c in r.args().to_string().chars() {
            if c.is_ascii_digit() {
                if !in_digits {
                    k.push('#');
                }
                in_digits = true;
            } else {
                k.push(c);
                in_digits = false;
            }
        }
        k
    }

    /// For a warning: `None` to hold it back, else how many were held back before it.
    fn admit(&self, r: &log::Record<'_>) -> Option<u32> {
        // Leadership changes are never collapsed: each one matters.
        if r.target() == LEADER_LINES {
            return Some(0);
        }
        let collapsed = match r.level() {
            log::Level::Warn => r.target() != "podalloc::security",
            // The tick lines have their own rule (`--log-every`, the runner's `TickLog`).
            log::Level::Info => r.target() != TICK_LINES,
            _ => false,
        };
        if !collapsed {
            return Some(0);
        }
        let now = std::time::Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let key = self.key(r);
        match seen.get_mut(&key) {
            Some(s) if now.duration_since(s.since) < COLLAPSE_WINDOW => {
                s.held += 1;
                s.last = r.args().to_string();
                s.level = r.level();
                None
            }
            Some(s) => {
                let held = s.held;
                s.since = now;
                s.held = 0;
                Some(held)
            }
            None => {
                let first = Seen {
                    since: now,
                    held: 0,
                    last: String::new(),
                    level: r.level(),
                };
                seen.insert(key, first);
                Some(0)
            }
        }
    }
}

impl log::Log for Capped {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        Self::allowed(m) && self.inner.enabled(m)
    }
    fn log(&self, r: &log::Record<'_>) {
        if !Self::allowed(r.metadata()) || !self.inner.enabled(r.metadata()) {
            return;
        }
        match self.admit(r) {
            None => {}
            Some(0) => self.inner.log(r),
            Some(n) => self.inner.log(
                &log::Record::builder()
                    .args(format_args!(
                        "{} (… {n} more times in the last minute)",
                        r.args()
                    ))
                    .level(r.level())
                    .target(r.target())
                    .module_path(r.module_path())
                    .file(r.file())
                    .line(r.line())
                    .build(),
            ),
        }
    }
    fn flush(&self) {
        type Held = (String, String, String, u32, log::Level);
        let held: Vec<Held> = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.iter_mut()
                .filter(|(_, s)| s.held > 0 && s.level == log::Level::Warn)
                .map(|(k, s)| {
                    // The key is `ns\0app|target|text` (see `Capped::key`).
                    let mut parts = k.splitn(3, '|');
                    let (app, target) = (parts.next().unwrap_or(""), parts.next());
                    let (text, n) = (std::mem::take(&mut s.last), std::mem::take(&mut s.held));
                    let target = target.unwrap_or("podalloc").to_string();
                    (app.to_string(), target, text, n, s.level)
                })
                .collect()
        };
        for (app, target, text, n, level) in held {
            // The summary is about the app the warnings were about, whatever the command's.
            let (ns, id) = app.split_once('\u{0}').unwrap_or(("", ""));
            self.context.set_app((!id.is_empty()).then_some((id, ns)));
            self.inner.log(
                &log::Record::builder()
                    .args(format_args!(
                        "held back before exit, {n} more time(s) in the last minute, the \
                         last: {text}"
                    ))
                    .level(level)
                    .target(&target)
                    .build(),
            );
            self.context.set_app(None);
        }
        self.inner.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::filter;

    #[test]
    fn a_bare_level_is_podallocs_and_only_vvv_opens_the_libraries() {
        assert_eq!(filter("info", 0), "info,podalloc=info");
        assert_eq!(filter("debug", 0), "info,podalloc=debug");
        assert_eq!(filter("warn", 1), "warn,podalloc=debug");
        assert_eq!(filter("info", 2), "info,podalloc=trace");
        assert_eq!(filter("info", 3), "debug,podalloc=trace");
        assert_eq!(filter("TRACE", 0), "info,podalloc=trace");
        assert_eq!(
            filter("warn,ureq=debug", 0),
            "warn,podalloc=warn,ureq=debug"
        );
    }

    use super::Capped;
    use log::{Level, Metadata};

    fn allowed(target: &str, level: Level) -> bool {
        Capped::allowed(&Metadata::builder().target(target).level(level).build())
    }

    #[test]
    fn http_and_tls_trace_records_never_pass() {
        assert!(!allowed("ureq_proto::client", Level::Debug));
        assert!(!allowed("ureq_proto::client", Level::Trace));
        assert!(allowed("ureq_proto::client", Level::Info));
        assert!(!allowed("ureq::unversioned", Level::Trace));
        assert!(allowed("ureq::unversioned", Level::Debug));
        assert!(!allowed("rustls::client", Level::Trace));
        assert!(allowed("rustls::client", Level::Debug));
        assert!(allowed("podalloc::reconcile", Level::Trace));
    }
}
