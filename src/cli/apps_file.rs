//! The apps file of `podalloc apps --file`: one entry per app (id, namespace, template or
//! image, target, batch size, driver pod, state). Parsing checks every name and number as the
//! flags do (the target and batch-size parsers are `crate::engine::counts`'s).

use crate::engine::counts::{BatchSize, MAX_TARGET};
use serde::Deserialize;
use serde_json::Value;
use std::path::PathBuf;

/// One app of an apps file. Keys are kebab-case, as the flags; unknown keys are an error.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct AppEntry {
    /// The application id (`spark-app-selector`).
    pub app_id: String,
    /// Its namespace (default: the connection's).
    pub namespace: Option<String>,
    /// Executor pod template file, relative to the apps file's directory.
    pub template: Option<PathBuf>,
    /// Container image (as `--image`).
    pub image: Option<String>,
    /// The executor target; without it the app's saved target holds.
    pub target: Option<u32>,
    /// As `--batch-size`: a number, `auto` or `slow-start`.
    pub batch_size: Option<Value>,
    /// Driver pod owning the executors (as `--driver-pod`).
    pub driver_pod: Option<String>,
    /// State file, relative to the apps file's directory (default: the state directory's
    /// `<namespace>/<app id>.json`).
    pub state_file: Option<PathBuf>,
    /// As `--state-store` (`file` or `configmap:NAME`).
    pub state_store: Option<String>,
}

/// An apps file: `apps:` followed by a list of [`AppEntry`].
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct AppsFile {
    /// The apps, ticked in this order.
    pub apps: Vec<AppEntry>,
}

/// Parses an apps file (YAML or JSON); an entry without `namespace:` is in `default_ns`.
/// Errors (one line): the parser's first line; a `namespace:` that is not a namespace name
/// (a DNS-1123 label, as the API server validates it: `../../tmp/evil` is refused before it
/// becomes a state path or a URL); a `driver-pod:` that is not a pod name; a `target:` above
/// [`MAX_TARGET`] (the limit `--target` has); or two entries
/// for the same app however spelt (no `namespace:` and `namespace: <default_ns>` are the
/// same app, and one process must never manage an app twice: each copy would see its own
/// share of the list and create a batch every pass).
pub(crate) fn parse_apps_file(text: &str, default_ns: &str) -> Result<AppsFile, String> {
    let f: AppsFile = serde_saphyr::from_str(text)
        .map_err(|e| e.to_string().lines().next().unwrap_or("").to_string())?;
    let mut seen = std::collections::BTreeSet::new();
    for a in &f.apps {
        let app = format!("app {:?}", a.app_id.chars().take(80).collect::<String>());
        if let Some(ns) = &a.namespace {
            crate::engine::podspec::validate_dns1123_label(&format!("{app}: namespace"), ns)?;
        }
        if let Some(d) = &a.driver_pod {
            crate::engine::podspec::validate_dns1123_subdomain(&format!("{app}: driver-pod"), d)?;
        }
        if let Some(t) = a.target.filter(|&t| t > MAX_TARGET) {
            return Err(format!(
                "{app}: target {t} is too large: at most {}",
                MAX_TARGET
            ));
        }
        let ns = a.namespace.as_deref().unwrap_or(default_ns);
        if !seen.insert((ns.to_string(), a.app_id.clone())) {
            return Err(format!("{app} is listed twice in namespace {ns:?}"));
        }
    }
    Ok(f)
}

/// A `batch-size` value of an apps file or an annotation, as `--batch-size` reads it.
pub(crate) fn batch_size_of(v: &Value) -> Result<BatchSize, String> {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => {
            return Err(format!(
                "batch-size must be a number, auto or slow-start, not {other}"
            ))
        }
    };
    crate::engine::counts::parse_batch_size(&s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apps_files_parse_and_reject_unknown_keys_and_duplicates() {
        let f = parse_apps_file(
            "apps:\n- app-id: a\n  image: spark:3.5\n  target: 3\n  batch-size: 2\n\
             - app-id: b\n  namespace: team-b\n  template: exec.yaml\n  batch-size: auto\n",
            "default",
        )
        .unwrap();
        assert_eq!(f.apps.len(), 2);
        assert_eq!(f.apps[0].target, Some(3));
        assert_eq!(
            batch_size_of(f.apps[1].batch_size.as_ref().unwrap()),
            Ok(BatchSize::Auto)
        );
        assert_eq!(batch_size_of(&json!(2)), Ok(BatchSize::Fixed(2)));
        assert!(parse_apps_file("apps:\n- app-id: a\n  targett: 3\n", "default").is_err());
        assert!(
            parse_apps_file("apps:\n- app-id: a\n- app-id: a\n", "default")
                .unwrap_err()
                .contains("twice")
        );
    }

    #[test]
    fn one_app_spelt_twice_is_refused_and_every_name_is_validated() {
        // No namespace and the default namespace named are the same app.
        let twice = "apps:\n- app-id: a\n- app-id: a\n  namespace: default\n";
        let e = parse_apps_file(twice, "default").unwrap_err();
        assert!(
            e.contains("\"a\" is listed twice in namespace \"default\""),
            "{e}"
        );
        assert!(
            parse_apps_file(twice, "other").is_ok(),
            "two namespaces, two apps"
        );
        for (entry, what) in [
            (
                "  namespace: ../../tmp/evil\n",
                "namespace \"../../tmp/evil\" is not a valid name",
            ),
            ("  namespace: Team\n", "DNS-1123 label"),
            ("  namespace: ''\n", "namespace \"\""),
            ("  driver-pod: ../driver\n", "driver-pod \"../driver\""),
            ("  target: 1000001\n", "at most 1000000"),
        ] {
            let e =
                parse_apps_file(&format!("apps:\n- app-id: a\n{entry}"), "default").unwrap_err();
            assert!(e.contains(what) && !e.contains('\n'), "{entry}: {e}");
        }
        assert!(parse_apps_file("apps:\n- app-id: a\n  target: 1000000\n", "d").is_ok());
    }
}
