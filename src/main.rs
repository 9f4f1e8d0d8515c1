//! The `podalloc` binary: read `--config`, parse, set up logging, run, exit with the
//! documented code.

use clap::{CommandFactory, Parser};
use podalloc::cli::{Cli, LogFormat};
use std::io::Write;

fn main() {
    // A config file's values become the defaults of the flags' environment variables, so
    // flag > environment > file > default.
    let args: Vec<String> = std::env::args().collect();
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
    let cli = Cli::parse();
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
    logger.init();
    match podalloc::commands::run(cli) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("podalloc: error: {e}");
            std::process::exit(e.code as i32);
        }
    }
}
