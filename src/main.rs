//! The `podalloc` binary: parse, set up logging, run, exit with the documented code.

use clap::Parser;

fn main() {
    let cli = podalloc::cli::Cli::parse();
    let mut logger = env_logger::Builder::new();
    logger.parse_filters(&cli.log_level);
    if let Ok(f) = std::env::var("RUST_LOG") {
        logger.parse_filters(&f);
    }
    logger
        .format_timestamp_millis()
        .target(env_logger::Target::Stderr)
        .init();
    match podalloc::commands::run(cli) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("podalloc: error: {e}");
            std::process::exit(e.code as i32);
        }
    }
}
