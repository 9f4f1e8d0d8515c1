//! Reading the executor pod template: `--template FILE` (JSON or YAML) and/or `--image`,
//! checked into a [`PodTemplate`]. The file read lives here, in the command line's layer, so that [`crate::engine::podspec`] stays
//! pure (no I/O).

use crate::engine::podspec::PodTemplate;
use crate::error::{Error, Result};
use std::path::Path;

/// Reads `--template` (JSON or YAML) and/or `--image` into a validated template; `None` when
/// neither is given.
///
/// Errors (exit 2): an unreadable file, text that is neither JSON nor YAML, or a template the
/// pod spec rejects (the message names the file).
pub(crate) fn load_template(
    template: Option<&Path>,
    image: Option<&str>,
) -> Result<Option<PodTemplate>> {
    match (template, image) {
        (None, None) => Ok(None),
        (None, Some(image)) => PodTemplate::from_image(image)
            .map(Some)
            .map_err(|e| Error::usage(e.0)),
        (Some(path), image) => {
            let text = crate::cli::read_input_file(path, "the pod template")?;
            let value = parse_yaml_or_json(&text).map_err(|e| {
                Error::usage(format!(
                    "pod template {} is not valid JSON or YAML: {e}",
                    path.display()
                ))
            })?;
            check_kind(&value)
                .map_err(|e| Error::usage(format!("pod template {}: {e}", path.display())))?;
            PodTemplate::from_value(value, image)
                .map(Some)
                .map_err(|e| Error::usage(format!("pod template {}: {e}", path.display())))
        }
    }
}

/// A template is a Pod: `kind` must be `Pod` and `apiVersion` `v1` when given (both may
/// be left out). Anything else — a Deployment, a PodTemplate, a Job — would otherwise be
/// sent as a Pod with its own fields silently dropped or rejected far from the cause.
///
/// Errors: the offending field and value, and what to do.
pub(crate) fn check_kind(value: &serde_json::Value) -> std::result::Result<(), String> {
    let kind = value.get("kind").and_then(serde_json::Value::as_str);
    let version = value.get("apiVersion").and_then(serde_json::Value::as_str);
    match kind {
        None | Some("Pod") => {}
        Some(k) => {
            let hint = match k {
                "Deployment" | "ReplicaSet" | "StatefulSet" | "Job" | "PodTemplate" => {
                    " (copy its spec.template — metadata and spec — into a Pod)"
                }
                _ => "",
            };
            return Err(format!(
                "kind is {k:?}, expected \"Pod\": the executor template is a Pod{hint}"
            ));
        }
    }
    match version {
        None | Some("v1") => Ok(()),
        Some(v) => Err(format!(
            "apiVersion is {v:?}, expected \"v1\" (a Pod is core/v1)"
        )),
    }
}

/// Parses pod template text: JSON when it starts like JSON, else YAML read the way kubectl
/// reads it (YAML 1.1 octals such as `0644`). Errors: the parser's first line.
pub fn parse_template_text(text: &str) -> std::result::Result<serde_json::Value, String> {
    parse_yaml_or_json(text)
}

fn parse_yaml_or_json(text: &str) -> std::result::Result<serde_json::Value, String> {
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(text).map_err(|e| e.to_string());
    }
    let mut opts = serde_saphyr::options::Options::default();
    opts.legacy_octal_numbers = true;
    let v: serde_json::Value =
        serde_saphyr::from_str_with_options(text, opts).map_err(|e| first_line(&e.to_string()))?;
    Ok(v)
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}
