//! Logging set-up of the binary: env_logger on stderr, as text or one JSON object per line,
//! behind a filter that keeps the HTTP and TLS libraries' trace records (which hold raw
//! requests, the Authorization header included) out of the logs.

use podalloc::cli::LogFormat;
use podalloc::error::Error;
use std::io::Write;

/// Installs the logger: `level` (`--log-level`, env_logger filter syntax), then `RUST_LOG`
/// when set (it wins), in `format`. Call once.
pub fn init(level: &str, format: LogFormat) {
    let mut logger = env_logger::Builder::new();
    logger.parse_filters(level);
    if let Ok(f) = std::env::var("RUST_LOG") {
        logger.parse_filters(&f);
    }
    logger.target(env_logger::Target::Stderr);
    match format {
        LogFormat::Text => {
            logger.format_timestamp_millis();
        }
        LogFormat::Json => {
            logger.format(|buf, record| {
                let line = serde_json::json!({
                    "ts": now_rfc3339(),
                    "level": record.level().to_string(),
                    "module": record.target(),
                    "msg": record.args().to_string(),
                });
                writeln!(buf, "{line}")
            });
        }
    }
    let logger = logger.build();
    log::set_max_level(logger.filter());
    log::set_boxed_logger(Box::new(Capped(logger))).expect("the logger is set once");
}

/// Prints the error that ends the command on stderr: `podalloc: error: …`, or in JSON one
/// object with the log lines' fields plus `exit_code`.
pub fn print_error(format: LogFormat, e: &Error) {
    match format {
        LogFormat::Text => eprintln!("podalloc: error: {e}"),
        LogFormat::Json => eprintln!(
            "{}",
            serde_json::json!({
                "ts": now_rfc3339(),
                "level": "ERROR",
                "module": "podalloc",
                "msg": e.to_string(),
                "exit_code": e.code as i32,
            })
        ),
    }
}

/// The wall clock as RFC 3339 with milliseconds (UTC), for the JSON lines.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// The HTTP and TLS libraries dump raw requests (the Authorization header included) at trace
/// level: those records are dropped whatever level was asked for, so no token ever reaches
/// the logs.
struct Capped(env_logger::Logger);

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
}

impl log::Log for Capped {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        Self::allowed(m) && self.0.enabled(m)
    }
    fn log(&self, r: &log::Record<'_>) {
        if Self::allowed(r.metadata()) {
            self.0.log(r);
        }
    }
    fn flush(&self) {
        self.0.flush();
    }
}

#[cfg(test)]
mod tests {
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
