//! `podalloc man` and `podalloc completions`: the manual and the shell completion scripts,
//! both generated from the command-line definitions.

use crate::cli::{Cli, CompletionsArgs};
use crate::error::{Error, Result};

/// `man`: prints the whole manual (roff) on stdout. A closed pipe (`| head`) is not an
/// error. Errors (exit 1): any other write error.
pub(super) fn man() -> Result<()> {
    match render_man(&mut std::io::stdout()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::runtime(format!("writing the man page: {e}")))
        }
        _ => Ok(()),
    }
}

/// `completions SHELL`: prints the completion script on stdout (generated into memory
/// first: the generator panics on a write error). A closed pipe is not an error.
pub(super) fn completions(a: &CompletionsArgs) -> Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut buf: Vec<u8> = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "podalloc", &mut buf);
    super::print_out(String::from_utf8_lossy(&buf).trim_end_matches('\n'))
}

/// The man page: the main page, then each command's synopsis, description and options
/// (those not shared with the main page), so one page holds the whole manual.
fn render_man(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    // The derived command, every flag with its full help (`cli::command` trims the short
    // help, which the man page generator would take for the whole help).
    let cmd = <Cli as clap::CommandFactory>::command();
    let globals: std::collections::BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    clap_mangen::Man::new(cmd.clone()).render(out)?;
    for sub in cmd.get_subcommands() {
        let name = sub.get_name().to_string();
        let own: Vec<clap::Arg> = sub
            .get_arguments()
            .filter(|a| !a.get_long().is_some_and(|l| globals.contains(l)))
            .cloned()
            .collect();
        let title: &'static str = Box::leak(format!("podalloc {name}").into_boxed_str());
        let mut page = clap::Command::new(title)
            .about(sub.get_about().cloned().unwrap_or_default())
            .disable_help_flag(true);
        if let Some(long) = sub.get_long_about() {
            page = page.long_about(long.clone());
        }
        for a in own {
            page = page.arg(a);
        }
        writeln!(out, ".SH \"COMMAND: {}\"", name.to_uppercase())?;
        let man = clap_mangen::Man::new(page);
        let mut buf: Vec<u8> = Vec::new();
        man.render_synopsis_section(&mut buf)?;
        man.render_description_section(&mut buf)?;
        man.render_options_section(&mut buf)?;
        // Sub-headings under the command's heading.
        let text = String::from_utf8_lossy(&buf).replace(".SH ", ".SS ");
        out.write_all(text.as_bytes())?;
    }
    Ok(())
}
