//! The `podalloc` binary: read `--config`, parse, set up logging, run, exit with the
//! documented code.

use clap::{CommandFactory, Parser};
use podalloc::cli::{Cli, LogFormat};
use std::io::Write;

fn main() {
    // A config file's values become the defaults of the flags' environment variables, so
    // flag > environment > file > default.
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(path) = podalloc::config_file::find(&args) {
        match podalloc::config_file::load(&Cli::command(), std::path::Path::new(&path)) {
            Ok(envs) => {
                for (k, v) in envs {
                    std::env::set_var(k, v);
                }
            }
            Err(e) => {
                eprintln!("podalloc: error: {e}");
                std::process::exit(e.code as i32);
            }
        }
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
                _ => {
                    // One line, as every other error: clap's first line without its prefix.
                    let text = e.render().to_string();
                    let first = text
                        .lines()
                        .next()
                        .unwrap_or("")
                        .trim_start_matches("error: ");
                    let from = match podalloc::config_file::find(&args) {
                        Some(f) => format!("; values may come from the config file {f}"),
                        None => String::new(),
                    };
                    eprintln!("podalloc: error: {first} (see podalloc --help{from})");
                    std::process::exit(2);
                }
            }
        }
    };
    let mut logger = env_logger::Builder::new();
    logger.parse_filters(&cli.log_level);
    if let Ok(f) = std::env::var("RUST_LOG") {
        logger.parse_filters(&f);
    }

    logger.target(env_logger::Target::Stderr);
    match cli.log_format {
        LogFormat::Text => {
            logger.format_timestamp_millis();
        }
        LogFormat::Json => {
            logger.format(|buf, record| {
                let line = serde_json::json!({
                    "ts": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
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
    let format = cli.log_format;
    match podalloc::commands::run(cli) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            match format {
                LogFormat::Text => eprintln!("podalloc: error: {e}"),
                LogFormat::Json => eprintln!(
                    "{}",
                    serde_json::json!({
                        "ts": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
                        "level": "ERROR",
                        "module": "podalloc",
                        "msg": e.to_string(),
                        "exit_code": e.code as i32,
                    })
                ),
            }
            std::process::exit(e.code as i32);
        }
    }
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
