//! The `podalloc` binary: read `--config`, parse, set up logging, run, exit with the
//! documented code (0–6: `podalloc::error::ExitCode`).

mod logging;

use podalloc::cli::Cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Err(e) = apply_config_file(&args) {
        eprintln!("podalloc: error: {e}");
        return exit_code(&e);
    }
    let cli = match parse(&args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    logging::init(&cli.log_level, cli.log_format);
    let format = cli.log_format;
    match podalloc::commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logging::print_error(format, &e);
            exit_code(&e)
        }
    }
}

/// The process exit code of an error.
fn exit_code(e: &podalloc::error::Error) -> ExitCode {
    ExitCode::from(e.code as u8)
}

/// `--config FILE`: the file's values become the defaults of the flags' environment
/// variables, so flag > environment > file > default.
///
/// Errors (exit 2): the config file's.
fn apply_config_file(args: &[String]) -> podalloc::error::Result<()> {
    let Some(path) = podalloc::config_file::find(args) else {
        return Ok(());
    };
    let envs = podalloc::config_file::load(&podalloc::cli::command(), std::path::Path::new(&path))?;
    for (k, v) in envs {
        std::env::set_var(k, v);
    }
    Ok(())
}

/// Parses the command line. Help and version print and end with clap's code (0, or 2 for
/// help shown because a command is missing); any other error prints one line, as every
/// other error, and ends with exit 2.
fn parse(args: &[String]) -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    let e = match podalloc::cli::parse_from(std::env::args_os()) {
        Ok(cli) => return Ok(cli),
        Err(e) => e,
    };
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            Err(ExitCode::from(e.exit_code() as u8))
        }
        _ => {
            // One line: clap's first line without its prefix.
            let text = e.render().to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("error: ");
            let from = match podalloc::config_file::find(args) {
                Some(f) => format!("; values may come from the config file {f}"),
                None => String::new(),
            };
            eprintln!("podalloc: error: {first} (see podalloc --help{from})");
            Err(ExitCode::from(2))
        }
    }
}
