//! The `podalloc` binary: read `--config`, parse, set up logging, run, exit with the
//! documented code (0–6: `podalloc::error::ExitCode`).

mod logging;

use podalloc::cli::Cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let from_file = match apply_config_file(&args) {
        Ok(set) => set,
        Err(e) => {
            eprintln!("podalloc: error: {e}");
            return exit_code(&e);
        }
    };
    let mut cli = match parse(&args, &from_file) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // What the logger and the command share: made here, owned by both, global to neither.
    let process = podalloc::cli::Process::default();
    cli.process = process.clone();
    logging::init(
        &logging::filter(&cli.ops.log_level, cli.ops.verbose),
        cli.ops.log_format,
        &process,
    );
    die_with_any_thread();
    let format = cli.ops.log_format;
    let res = podalloc::commands::run(cli);
    logging::finish();
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            logging::print_error(format, &e, &process);
            exit_code(&e)
        }
    }
}

/// Any panic, in any thread (the loop, or the scoped read-ahead of a gzip list), ends the
/// whole process at once with one line and exit 1 (a runtime error), so that Kubernetes
/// restarts it: a process that lived on after a helper's panic could be left with a loop
/// that never renews its Lease.
fn die_with_any_thread() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".to_string());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("podalloc: internal error in thread {name}: {what}{at}; exiting (exit 1)");
        std::process::exit(1);
    }));
}

/// The process exit code of an error.
fn exit_code(e: &podalloc::error::Error) -> ExitCode {
    ExitCode::from(e.code as u8)
}

/// `--config FILE`: the file's values become the defaults of the flags' environment
/// variables, so flag > environment > file > default. Returns the variables it set.
///
/// Errors (exit 2): the config file's.
fn apply_config_file(args: &[String]) -> podalloc::error::Result<Vec<String>> {
    let Some(path) = podalloc::config_file::find(args) else {
        return Ok(Vec::new());
    };
    let envs = podalloc::config_file::load(&podalloc::cli::command(), std::path::Path::new(&path))?;
    let mut set = Vec::new();
    for (k, v) in envs {
        std::env::set_var(&k, v);
        set.push(k);
    }
    Ok(set)
}

/// Parses the command line. Help and version print and end with clap's code (0, or 2 for
/// help shown because a command is missing); any other error prints clap's whole message
/// (what is wrong, the allowed values or a "did you mean", the usage line) with the prefix
/// `podalloc: error:`, names the environment variable or config file a bad value came from,
/// and ends with exit 2.
fn parse(args: &[String], from_file: &[String]) -> Result<Cli, ExitCode> {
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
            let text = e.render().to_string();
            let text = text.trim_end().trim_start_matches("error: ");
            let mut lines = text.lines();
            let first = lines.next().unwrap_or("");
            let rest: Vec<&str> = lines.collect();
            let source = value_source(&e, args, from_file)
                .map(|s| format!(" ({s})"))
                .unwrap_or_default();
            eprintln!("podalloc: error: {first}{source}");
            for line in rest {
                eprintln!("{line}");
            }
            Err(ExitCode::from(2))
        }
    }
}

/// For a bad value that did not come from the command line: where it came from, as
/// `the value comes from the config file F (key K)` or `… from the environment variable V`.
fn value_source(e: &clap::Error, args: &[String], from_file: &[String]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    // `--log-level <LEVEL>` → `log-level`.
    let long = arg
        .strip_prefix("--")?
        .split([' ', '='])
        .next()?
        .to_string();
    let on_command_line = args
        .iter()
        .skip(1)
        .any(|a| a == &format!("--{long}") || a.starts_with(&format!("--{long}=")));
    if on_command_line {
        return None;
    }
    let cmd = podalloc::cli::command();
    let env = find_env(&cmd, &long)?;
    std::env::var_os(&env)?;
    if from_file.contains(&env) {
        let file = podalloc::config_file::find(args).unwrap_or_default();
        Some(format!(
            "the value comes from the config file {file}, key `{long}`"
        ))
    } else {
        Some(format!(
            "the value comes from the environment variable {env}"
        ))
    }
}

/// The environment variable of the flag `--long` in `cmd` or its subcommands.
fn find_env(cmd: &clap::Command, long: &str) -> Option<String> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned())
        .or_else(|| cmd.get_subcommands().find_map(|s| find_env(s, long)))
}
