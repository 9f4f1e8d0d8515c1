//! Many applications in one process (`podalloc apps`): the apps file, the driver-pod
//! annotations of `--discover`, and the split of one namespace-wide executor list into one
//! snapshot per app. Pure: no I/O, no clock, no log.
//!
//! One pass lists each namespace's executor pods once (`spark-role=executor`) and splits the
//! pages by the `spark-app-selector` label ([`Snapshot::add_page_split`], the same
//! classification as one app's own list), instead of one list per app.

use crate::cli::BatchSize;
use crate::engine::snapshot::{Snapshot, SnapshotError, LABEL_APP};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Annotation on a driver pod: the executor target, a whole number (`"20"`).
pub(crate) const ANNOTATION_EXECUTORS: &str = "podalloc.io/executors";
/// Annotation on a driver pod: the batch size (`"10"`, `auto` or `slow-start`, as
/// `--batch-size`).
pub(crate) const ANNOTATION_BATCH_SIZE: &str = "podalloc.io/batch-size";
/// Annotation on a driver pod: the name of a ConfigMap in the driver's namespace whose
/// [`TEMPLATE_KEY`] holds the executor pod template (YAML or JSON).
pub(crate) const ANNOTATION_TEMPLATE: &str = "podalloc.io/executor-template";
/// The ConfigMap key holding the executor pod template.
pub(crate) const TEMPLATE_KEY: &str = "template.yaml";

/// One app of an apps file. Keys are kebab-case, as the flags; unknown keys are an error.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub(crate) struct AppEntry {
    /// The application id (`spark-app-selector`).
    pub app_id: String,
    /// Its namespace (default: the connection's).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Executor pod template file, relative to the apps file's directory.
    #[serde(default)]
    pub template: Option<PathBuf>,
    /// Container image (as `--image`).
    #[serde(default)]
    pub image: Option<String>,
    /// The executor target; without it the app's saved target holds.
    #[serde(default)]
    pub target: Option<u32>,
    /// As `--batch-size`: a number, `auto` or `slow-start`.
    #[serde(default)]
    pub batch_size: Option<Value>,
    /// Driver pod owning the executors (as `--driver-pod`).
    #[serde(default)]
    pub driver_pod: Option<String>,
    /// State file, relative to the apps file's directory (default: the state directory's
    /// `<namespace>/<app id>.json`).
    #[serde(default)]
    pub state_file: Option<PathBuf>,
    /// As `--state-store` (`file` or `configmap:NAME`).
    #[serde(default)]
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
/// [`crate::cli::MAX_TARGET`] (the limit `--target` has); or two entries
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
        if let Some(t) = a.target.filter(|&t| t > crate::cli::MAX_TARGET) {
            return Err(format!(
                "{app}: target {t} is too large: at most {}",
                crate::cli::MAX_TARGET
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
    crate::cli::parse_batch_size(&s)
}

/// A driver pod found by `--discover`, as its labels and annotations describe its app (its
/// lifecycle is the tick's business: [`crate::controller::tick::read_driver`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Driver {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// Its `spark-app-selector` label; `None` when missing.
    pub app_id: Option<String>,
    /// The annotations podalloc reads: [`ANNOTATION_EXECUTORS`], [`ANNOTATION_BATCH_SIZE`],
    /// [`ANNOTATION_TEMPLATE`] (absent ones left out).
    pub annotations: BTreeMap<String, String>,
    /// Its lifecycle as listed: `status.phase`, or `deleting` once it has a
    /// `deletionTimestamp` (a change wakes its app: the step ends it).
    pub phase: String,
}

impl Driver {
    /// Reads a driver pod (a list item). `None` without a name.
    pub(crate) fn of(pod: &Value) -> Option<Driver> {
        let meta = &pod["metadata"];
        let s = |v: &Value| v.as_str().map(str::to_string);
        let annotations = [
            ANNOTATION_EXECUTORS,
            ANNOTATION_BATCH_SIZE,
            ANNOTATION_TEMPLATE,
        ]
        .iter()
        .filter_map(|k| Some((k.to_string(), s(&meta["annotations"][*k])?)))
        .collect();
        Some(Driver {
            name: s(&meta["name"])?,
            uid: s(&meta["uid"]).unwrap_or_default(),
            app_id: s(&meta["labels"][LABEL_APP]),
            annotations,
            phase: match meta["deletionTimestamp"].is_null() {
                true => s(&pod["status"]["phase"]).unwrap_or_default(),
                false => "deleting".to_string(),
            },
        })
    }

    /// What the annotations ask for. Errors: one line per annotation that is missing or does
    /// not parse, naming the driver and the annotation.
    pub(crate) fn wanted(&self) -> Result<Wanted, String> {
        let bad = |key: &str, v: &str, want: &str| {
            format!(
                "driver pod {:?}: annotation {key}={v:?} is not {want}; its executors are left as they are",
                self.name
            )
        };
        let Some(t) = self.annotations.get(ANNOTATION_EXECUTORS) else {
            return Err(format!(
                "driver pod {:?} has no annotation {ANNOTATION_EXECUTORS}",
                self.name
            ));
        };
        let target = crate::cli::parse_target(t.trim())
            .map_err(|_| bad(ANNOTATION_EXECUTORS, t, "a whole number of executors"))?;
        let batch_size = match self.annotations.get(ANNOTATION_BATCH_SIZE) {
            None => None,
            Some(v) => Some(
                crate::cli::parse_batch_size(v.trim())
                    .map_err(|_| bad(ANNOTATION_BATCH_SIZE, v, "a number, auto or slow-start"))?,
            ),
        };
        let template = match self.annotations.get(ANNOTATION_TEMPLATE) {
            None => None,
            Some(v) if crate::engine::podspec::validate_dns1123_subdomain("x", v).is_ok() => {
                Some(v.clone())
            }
            Some(v) => return Err(bad(ANNOTATION_TEMPLATE, v, "a ConfigMap name")),
        };
        Ok(Wanted {
            target,
            batch_size,
            template,
        })
    }
}

/// What a driver's annotations ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Wanted {
    /// [`ANNOTATION_EXECUTORS`].
    pub target: u32,
    /// [`ANNOTATION_BATCH_SIZE`], when given.
    pub batch_size: Option<BatchSize>,
    /// [`ANNOTATION_TEMPLATE`], when given: a ConfigMap name.
    pub template: Option<String>,
}

/// The per-app snapshots one namespace-wide list gives ([`split_pages`]).
#[derive(Debug, Default)]
pub(crate) struct Split {
    /// App id → its executors.
    pub snaps: BTreeMap<String, Snapshot>,
    /// App id → its executor container's name, for the apps that name one
    /// (`--executor-container`); the others use each pod's first container.
    pub containers: BTreeMap<String, String>,
    /// Apps whose pods could not make a snapshot (two pods with one executor id).
    pub failed: BTreeMap<String, SnapshotError>,
}

impl Split {
    /// An empty split for these app ids.
    pub(crate) fn for_apps<'a>(apps: impl IntoIterator<Item = &'a str>) -> Split {
        Split {
            snaps: apps
                .into_iter()
                .map(|a| (a.to_string(), Snapshot::default()))
                .collect(),
            containers: BTreeMap::new(),
            failed: BTreeMap::new(),
        }
    }

    /// Adds one page ([`Snapshot::add_page_split`]); returns its continue token.
    pub(crate) fn add_page(&mut self, bytes: &[u8]) -> Result<Option<String>, SnapshotError> {
        Snapshot::add_page_split(bytes, &mut self.snaps, &self.containers, &mut self.failed)
    }

    /// Drops what earlier pages gave (a list restarted after 410 Gone).
    pub(crate) fn restart(&mut self) {
        for s in self.snaps.values_mut() {
            *s = Snapshot::default();
        }
        self.failed.clear();
    }
}

/// Splits whole pages (tests, benchmarks). Errors as [`Snapshot::add_page_split`].
#[cfg(test)]
pub(crate) fn split_pages(pages: &[&[u8]], apps: &[&str]) -> Result<Split, SnapshotError> {
    let mut s = Split::for_apps(apps.iter().copied());
    for p in pages {
        s.add_page(p)?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, app: &str, id: &str, phase: &str) -> Value {
        json!({"metadata": {"name": name, "uid": format!("u-{name}"), "resourceVersion": "1",
            "labels": {"spark-app-selector": app, "spark-role": "executor", "spark-exec-id": id}},
            "status": {"phase": phase}})
    }

    fn list(items: &[Value]) -> Vec<u8> {
        serde_json::to_vec(&json!({"kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "9"}, "items": items}))
        .unwrap()
    }

    #[test]
    fn the_split_equals_each_apps_own_list() {
        let pods = vec![
            pod("a-1", "a", "1", "Running"),
            pod("b-1", "b", "1", "Pending"),
            pod("a-2", "a", "2", "Failed"),
            pod("c-1", "c", "1", "Running"),
            pod("a-x", "a", "0", "Running"),
            json!({"metadata": {"name": "nolabel"}}),
        ];
        let body = list(&pods);
        let split = split_pages(&[&body], &["a", "b", "z"]).unwrap();
        for app in ["a", "b", "z"] {
            let own: Vec<Value> = (pods.iter())
                .filter(|p| p["metadata"]["labels"]["spark-app-selector"] == app)
                .cloned()
                .collect();
            let alone = Snapshot::from_pod_list(&list(&own), app).unwrap();
            assert_eq!(split.snaps[app], alone, "{app}");
        }
        assert_eq!(split.snaps["a"].executors.len(), 2);
        assert_eq!(
            split.snaps["a"].warnings.len(),
            1,
            "the bad id is warned about"
        );
        assert!(
            !split.snaps.contains_key("c"),
            "an app not managed is skipped"
        );
    }

    #[test]
    fn a_duplicate_id_fails_only_its_app() {
        let body = list(&[
            pod("a-1", "a", "1", "Running"),
            pod("a-1b", "a", "1", "Running"),
            pod("b-1", "b", "1", "Running"),
        ]);
        let split = split_pages(&[&body], &["a", "b"]).unwrap();
        assert!(split.failed.contains_key("a"));
        assert!(!split.failed.contains_key("b"));
        assert_eq!(split.snaps["b"].executors.len(), 1);
        assert!(split_pages(&[b"{}"], &["a"]).is_err(), "not a PodList");
    }

    #[test]
    fn annotations_give_the_target_batch_and_template_or_a_named_warning() {
        let mut d = Driver::of(&json!({"metadata": {"name": "drv", "uid": "u",
            "labels": {"spark-app-selector": "spark-1"},
            "annotations": {"podalloc.io/executors": "20", "podalloc.io/batch-size": "auto",
                "podalloc.io/executor-template": "etl-executor", "other": "x"}},
            "status": {"phase": "Running"}}))
        .unwrap();
        assert_eq!(d.app_id.as_deref(), Some("spark-1"));
        let w = d.wanted().unwrap();
        assert_eq!(w.target, 20);
        assert_eq!(w.batch_size, Some(BatchSize::Auto));
        assert_eq!(w.template.as_deref(), Some("etl-executor"));
        d.annotations
            .insert(ANNOTATION_EXECUTORS.into(), "twenty".into());
        let e = d.wanted().unwrap_err();
        assert!(
            e.contains("\"drv\"") && e.contains(ANNOTATION_EXECUTORS),
            "{e}"
        );
        d.annotations
            .insert(ANNOTATION_EXECUTORS.into(), "3".into());
        d.annotations
            .insert(ANNOTATION_BATCH_SIZE.into(), "-1".into());
        assert!(d.wanted().unwrap_err().contains(ANNOTATION_BATCH_SIZE));
    }

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
