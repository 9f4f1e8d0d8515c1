//! `--config FILE`: every flag from a YAML (or JSON) file, with the precedence
//! flag > environment variable > file > default.
//!
//! The file is a map of long flag names to values (`app-id: spark-etl`, `batch-size: 10`,
//! `insecure-skip-tls-verify: true`). Each key's value becomes the default of the flag's
//! environment variable (`PODALLOC_APP_ID`, …) when that variable is not already set, so
//! clap's own precedence does the rest and `--help` shows where a value came from.

use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;

/// Finds `--config FILE` / `--config=FILE` in `args`, else `$PODALLOC_CONFIG`.
pub fn find(args: &[String]) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        if a == "--config" {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(v.to_string());
        }
    }
    std::env::var("PODALLOC_CONFIG")
        .ok()
        .filter(|v| !v.is_empty())
}

/// Reads the config file and returns the environment variables to set (name, value): one
/// per key whose variable is unset. Keys are checked against the flags of `cmd` and its
/// subcommands.
///
/// Errors (exit 2): unreadable file, not a YAML map, an unknown key, a value that is not a
/// string, number or boolean, a flag without an environment variable.
pub fn load(cmd: &clap::Command, path: &Path) -> Result<Vec<(String, String)>> {
    let what = path.display();
    let text = super::read_input_file(path, "the config file")?;
    let map: BTreeMap<String, serde_json::Value> = serde_saphyr::from_str(&text).map_err(|e| {
        let first = e.to_string();
        Error::usage(format!(
            "config file {what} is not a YAML map of flag names to values: {}",
            first.lines().next().unwrap_or("")
        ))
    })?;
    let mut envs: BTreeMap<String, String> = BTreeMap::new();
    collect_envs(cmd, &mut envs);
    let mut out = Vec::new();
    for (key, value) in map {
        let Some(env) = envs.get(&key) else {
            return Err(Error::usage(format!(
                "config file {what}: unknown key {key:?}; keys are long flag names such as app-id, \
                 batch-size, namespace (see podalloc --help)"
            )));
        };
        let value = match value {
            serde_json::Value::String(s) => s,
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::Bool(b) => b.to_string(),
            other => {
                return Err(Error::usage(format!(
                    "config file {what}: {key} must be a string, number or boolean, not {other}"
                )))
            }
        };
        if std::env::var_os(env).is_none() {
            out.push((env.clone(), value));
        }
    }
    Ok(out)
}

fn collect_envs(cmd: &clap::Command, out: &mut BTreeMap<String, String>) {
    for a in cmd.get_arguments() {
        if let (Some(long), Some(env)) = (a.get_long(), a.get_env()) {
            if long != "config" {
                out.insert(long.to_string(), env.to_string_lossy().into_owned());
            }
        }
    }
    for sub in cmd.get_subcommands() {
        collect_envs(sub, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn finds_the_flag() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            find(&a(&["podalloc", "--config", "x.yaml", "reconcile"])),
            Some("x.yaml".into())
        );
        assert_eq!(
            find(&a(&["podalloc", "--config=y.yaml"])),
            Some("y.yaml".into())
        );
    }

    #[test]
    fn maps_keys_to_env_and_rejects_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.yaml");
        std::fs::write(
            &p,
            "app-id: etl\nbatch-size: 7\ninsecure-skip-tls-verify: true\n",
        )
        .unwrap();
        let envs = load(&crate::cli::Cli::command(), &p).unwrap();
        assert!(envs.contains(&("PODALLOC_APP_ID".into(), "etl".into())));
        assert!(envs.contains(&("PODALLOC_BATCH_SIZE".into(), "7".into())));
        assert!(envs.contains(&("PODALLOC_INSECURE_SKIP_TLS_VERIFY".into(), "true".into())));
        std::fs::write(&p, "app_idd: etl\n").unwrap();
        let e = load(&crate::cli::Cli::command(), &p).unwrap_err();
        assert!(e.message.contains("unknown key \"app_idd\""), "{e}");
        std::fs::write(&p, "- a\n- b\n").unwrap();
        assert!(load(&crate::cli::Cli::command(), &p).is_err());
        std::fs::write(&p, "app-id: [a]\n").unwrap();
        assert!(load(&crate::cli::Cli::command(), &p).is_err());
    }
}
