//! One namespace-wide executor list (`spark-role=executor`, what `podalloc apps` lists once a
//! pass) split by the `spark-app-selector` label into one snapshot per app, each pod decoded
//! once and classified by the same code as an app's own list.

use super::stream::{self, Sink, START_BUFFER};
use super::{RawPod, Snapshot, SnapshotError};
use std::collections::BTreeMap;

/// The per-app snapshots one namespace-wide list gives.
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

    /// Reads one page of the list from `body` while it arrives, with the decoder of
    /// [`Snapshot::read_page`] (the API server's `PodList`, JSON or Protobuf), and returns its
    /// continue token. Each pod is decoded once and classified by the same code as one app's
    /// own list, so every app's snapshot equals the one its own list would give; pods of apps
    /// not in the split are skipped. A pod that breaks one app's snapshot
    /// ([`SnapshotError::DuplicateId`]) records that app in `failed` and leaves the others
    /// alone. A page that fails adds nothing.
    ///
    /// Errors: those of [`Snapshot::read_page`] but a duplicate id.
    pub(crate) fn read_page<R: std::io::Read>(
        &mut self,
        body: R,
    ) -> Result<Option<String>, SnapshotError> {
        let mut page = SplitPage {
            split: self,
            parts: BTreeMap::new(),
            failed: BTreeMap::new(),
        };
        let read = stream::read(body, &mut page, false, START_BUFFER)?;
        let (parts, failed) = (page.parts, page.failed);
        self.failed.extend(failed);
        for (app, part) in parts {
            if self.failed.contains_key(&app) {
                continue;
            }
            let snap = self.snaps.entry(app.clone()).or_default();
            if let Err(e) = snap.merge(part) {
                self.failed.insert(app, e);
            }
        }
        Ok(read.cont.flatten().filter(|c| !c.is_empty()))
    }

    /// Drops what earlier pages gave (a list restarted after 410 Gone).
    pub(crate) fn restart(&mut self) {
        for s in self.snaps.values_mut() {
            *s = Snapshot::default();
        }
        self.failed.clear();
    }
}

/// One page of a split while it is read: each app's pods in a part of their own, added to
/// the split only once the whole page has been read.
struct SplitPage<'s> {
    split: &'s Split,
    parts: BTreeMap<String, Snapshot>,
    /// Apps whose pods broke their snapshot in this page.
    failed: BTreeMap<String, SnapshotError>,
}

impl Sink for SplitPage<'_> {
    fn pod(&mut self, pod: RawPod<'_>) {
        let labels = pod.metadata.as_ref().and_then(|m| m.labels.as_ref());
        let Some(app) = labels.and_then(|l| l.0[0].as_deref()) else {
            return;
        };
        if !self.split.snaps.contains_key(app)
            || self.split.failed.contains_key(app)
            || self.failed.contains_key(app)
        {
            return;
        }
        let app = app.to_string();
        let container = self.split.containers.get(&app).map(String::as_str);
        let part = self.parts.entry(app.clone()).or_default();
        if let Err(e) = part.add_pod(pod, &app, container) {
            self.parts.remove(&app);
            self.failed.insert(app, e);
        }
    }
}

/// Splits whole pages (tests). Errors as [`Split::read_page`].
#[cfg(test)]
pub(crate) fn split_pages(pages: &[&[u8]], apps: &[&str]) -> Result<Split, SnapshotError> {
    let mut s = Split::for_apps(apps.iter().copied());
    for p in pages {
        s.read_page(*p)?;
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use serde_json::Value;

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
}
