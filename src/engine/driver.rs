//! The driver pods `podalloc apps --discover` finds: what a driver's labels and annotations
//! say about its app (target, the targets of other resource profiles, batch size, template
//! ConfigMap). Pure: a listed pod in, the
//! app's wishes out (the I/O is `commands/discover.rs`).

use crate::engine::counts::BatchSize;
use crate::engine::snapshot::LABEL_APP;
use serde_json::Value;
use std::collections::BTreeMap;

/// Annotation on a driver pod: the executor target, a whole number (`"20"`).
pub(crate) const ANNOTATION_EXECUTORS: &str = "podalloc.io/executors";
/// Annotation on a driver pod: the targets of resource profiles other than 0 (Spark 3.1+'s
/// stage-level scheduling), `P=N` comma-separated (`"1=4,2=2"`), as `--profile-target`;
/// profile 0's is [`ANNOTATION_EXECUTORS`].
pub(crate) const ANNOTATION_PROFILE_EXECUTORS: &str = "podalloc.io/profile-executors";
/// Annotation on a driver pod: the batch size (`"10"`, `auto` or `slow-start`, as
/// `--batch-size`).
pub(crate) const ANNOTATION_BATCH_SIZE: &str = "podalloc.io/batch-size";
/// Annotation on a driver pod: the name of a ConfigMap in the driver's namespace whose
/// [`TEMPLATE_KEY`] holds the executor pod template (YAML or JSON).
pub(crate) const ANNOTATION_TEMPLATE: &str = "podalloc.io/executor-template";
/// The ConfigMap key holding the executor pod template.
pub(crate) const TEMPLATE_KEY: &str = "template.yaml";

/// A driver pod found by `--discover`, as its labels and annotations describe its app (its
/// lifecycle is the tick's business: `controller::tick::read_driver`).
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
            ANNOTATION_PROFILE_EXECUTORS,
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
        let target = crate::engine::counts::parse_target(t.trim())
            .map_err(|_| bad(ANNOTATION_EXECUTORS, t, "a whole number of executors"))?;
        let profiles = match self.annotations.get(ANNOTATION_PROFILE_EXECUTORS) {
            None => BTreeMap::new(),
            Some(v) => profile_targets(v).ok_or_else(|| {
                bad(
                    ANNOTATION_PROFILE_EXECUTORS,
                    v,
                    "P=N,… (a resource profile id from 1, a whole number of executors)",
                )
            })?,
        };
        let batch_size = match self.annotations.get(ANNOTATION_BATCH_SIZE) {
            None => None,
            Some(v) => Some(
                crate::engine::counts::parse_batch_size(v.trim())
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
            profiles,
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
    /// [`ANNOTATION_PROFILE_EXECUTORS`]: profile id (1 and up) → target; empty when absent.
    pub profiles: BTreeMap<u32, u32>,
    /// [`ANNOTATION_BATCH_SIZE`], when given.
    pub batch_size: Option<BatchSize>,
    /// [`ANNOTATION_TEMPLATE`], when given: a ConfigMap name.
    pub template: Option<String>,
}

/// `P=N,…` of [`ANNOTATION_PROFILE_EXECUTORS`] (spaces around parts allowed): profile ids
/// 1..=`i32::MAX` (Spark's `ResourceProfile.id`; 0's target is [`ANNOTATION_EXECUTORS`]),
/// targets as `--target` reads them, each profile once. `None`: anything else.
fn profile_targets(v: &str) -> Option<BTreeMap<u32, u32>> {
    let mut out = BTreeMap::new();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (p, n) = part.split_once('=')?;
        let p: u32 = p
            .trim()
            .parse()
            .ok()
            .filter(|&p| p >= 1 && p <= i32::MAX as u32)?;
        let n = crate::engine::counts::parse_target(n.trim()).ok()?;
        if out.insert(p, n).is_some() {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn profile_targets_are_p_equals_n_from_profile_1() {
        let mut d = Driver::of(&json!({"metadata": {"name": "drv", "uid": "u",
            "annotations": {"podalloc.io/executors": "2",
                "podalloc.io/profile-executors": " 1=4, 2=0 "}}}))
        .unwrap();
        let w = d.wanted().unwrap();
        assert_eq!(w.profiles, BTreeMap::from([(1, 4), (2, 0)]));
        for bad in ["0=3", "1=x", "1", "1=2,1=3", "-1=2", "2147483648=1"] {
            d.annotations
                .insert(ANNOTATION_PROFILE_EXECUTORS.into(), bad.into());
            let e = d.wanted().unwrap_err();
            assert!(e.contains(ANNOTATION_PROFILE_EXECUTORS), "{bad}: {e}");
        }
    }
}
