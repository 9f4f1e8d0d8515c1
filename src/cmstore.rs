//! The ConfigMap state store (`--state-store configmap:NAME`): the allocator state kept in a
//! ConfigMap of the app's namespace, key `state.json`, with optimistic concurrency.
//!
//! Loading remembers the ConfigMap's `resourceVersion`; every save is an update carrying it
//! (or a create when the ConfigMap did not exist). If another instance saved in between, the
//! API server answers 409 (Conflict on update, AlreadyExists on create) and the save fails
//! with [`StoreError::Conflict`]. Since the tick saves before it makes any call
//! (write-ahead), the instance that loses the race has not acted: it ends the tick with exit
//! 3, exactly like a run that finds the file lock taken. This is what lets a Kubernetes
//! CronJob (no volume) or several admin hosts run podalloc safely.
//!
//! Ownership: a `run` loop ([`ConfigMapStore::holding`]) writes a holder record (annotation
//! [`HOLDER_KEY`]: command, host, pid, since, renewed, stale-after) with every save, so every
//! tick renews it. Any other writer (a second loop, a one-shot `reconcile`) that loads a fresh
//! record of someone else stops with [`StoreError::Owned`] (exit 3) naming the holder; a
//! record not renewed for its `stale_after_s` (3 × max(interval, 10 s)) may be taken over.
//! Read-only commands (`status`, `--dry-run`) ignore it.
//!
//! A retried write: the API server may apply an update and still answer 5xx (or the answer
//! may be lost), and the client's retry then gets 409 because the `resourceVersion` moved.
//! Each save carries a fresh nonce (annotation [`WRITE_ID_KEY`]); after a 409 the store
//! re-reads the ConfigMap and, when it holds exactly the state and nonce just sent, counts
//! the save as done instead of reporting a rival.

use crate::alloc::AllocatorState;
use crate::kube::{KubeClient, KubeError};
use crate::state::{parse, Holder, StateStore, StoreError};
use serde_json::{json, Value};

/// The data key holding the state JSON.
pub(crate) const DATA_KEY: &str = "state.json";
/// The label podalloc puts on its ConfigMaps (and requires before writing over one).
pub(crate) const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The annotation holding a `run` loop's [`Holder`] record (JSON).
pub(crate) const HOLDER_KEY: &str = "podalloc.io/holder";
/// The annotation holding the nonce of the last save (see the module doc).
pub(crate) const WRITE_ID_KEY: &str = "podalloc.io/write-id";

/// How a store treats the holder record.
enum Mode {
    /// Read-only commands: the record is ignored.
    Read,
    /// One-shot commands: a fresh record of anyone is an error.
    Once,
    /// A `run` loop: a fresh record of someone else is an error; ours is renewed each save.
    Loop(Holder),
}

/// A state store in ConfigMap `name` of the client's namespace.
pub(crate) struct ConfigMapStore<'a> {
    client: &'a KubeClient,
    name: String,
    /// `metadata.resourceVersion` seen at the last load or save; `None`: does not exist.
    resource_version: Option<String>,
    app_id: String,
    mode: Mode,
    writes: u64,
}

impl<'a> ConfigMapStore<'a> {
    /// A store for ConfigMap `name` (a DNS-1123 subdomain) holding `app_id`'s state.
    pub(crate) fn new(client: &'a KubeClient, name: &str, app_id: &str) -> ConfigMapStore<'a> {
        ConfigMapStore {
            client,
            name: name.to_string(),
            resource_version: None,
            app_id: app_id.to_string(),
            mode: Mode::Once,
            writes: 0,
        }
    }

    /// For read-only commands: the holder record is ignored.
    pub(crate) fn read_only(mut self) -> Self {
        self.mode = Mode::Read;
        self
    }

    /// For a `run` loop with tick `interval`: writes and renews `holder`, stale after
    /// 3 × max(interval, 10 s).
    pub(crate) fn holding(mut self, mut holder: Holder, interval: std::time::Duration) -> Self {
        holder.stale_after_s = Some(3 * interval.as_secs().max(10));
        self.mode = Mode::Loop(holder);
        self
    }

    /// Errors with [`StoreError::Owned`] when `cm` carries a fresh holder record that is not
    /// ours (nothing for read-only commands).
    fn check_holder(&self, cm: &Value) -> Result<(), StoreError> {
        let mine = match &self.mode {
            Mode::Read => return Ok(()),
            Mode::Once => None,
            Mode::Loop(h) => Some(h),
        };
        let Some(text) = cm["metadata"]["annotations"][HOLDER_KEY].as_str() else {
            return Ok(());
        };
        let Ok(theirs) = serde_json::from_str::<Holder>(text) else {
            log::warn!(
                "{}: unreadable {HOLDER_KEY} annotation ignored",
                self.what()
            );
            return Ok(());
        };
        if mine.is_some_and(|m| m.same(&theirs)) {
            return Ok(());
        }
        let renewed = theirs.renewed_ms.unwrap_or(theirs.since_ms);
        let age_s = crate::commands::now_ms().saturating_sub(renewed) / 1000;
        let stale_after = theirs.stale_after_s.unwrap_or(30);
        if age_s > stale_after {
            log::warn!(
                "{}: taking over from a stale owner ({theirs}; last renewed {age_s}s ago)",
                self.what()
            );
            return Ok(());
        }
        Err(StoreError::Owned(format!(
            "{} is owned by a running loop: {theirs} (renewed {age_s}s ago, stale after \
             {stale_after}s); this command did nothing (exit 3): stop that loop first",
            self.what()
        )))
    }

    /// A nonce for one save: pid, wall clock in ns, and a counter.
    fn next_write_id(&mut self) -> String {
        self.writes += 1;
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("{}-{ns}-{}", std::process::id(), self.writes)
    }

    /// After a 409: whether the ConfigMap already holds exactly `text` under `write_id`
    /// (our own write, applied but answered with an error and retried). Updates the
    /// remembered `resourceVersion` when so.
    fn own_write_landed(&mut self, text: &str, write_id: &str) -> bool {
        let Ok(Some(cm)) = self.client.get_configmap(&self.name) else {
            return false;
        };
        let landed = cm["data"][DATA_KEY].as_str() == Some(text)
            && cm["metadata"]["annotations"][WRITE_ID_KEY].as_str() == Some(write_id);
        if landed {
            log::info!(
                "{}: the write answered 409 had already been applied (a retried request); \
                 counted as saved",
                self.what()
            );
            self.resource_version = cm["metadata"]["resourceVersion"]
                .as_str()
                .map(str::to_string);
        }
        landed
    }

    fn what(&self) -> String {
        format!("ConfigMap {}/{}", self.client.namespace(), self.name)
    }

    fn backend(&self, e: KubeError) -> StoreError {
        StoreError::Backend(format!("{}: {e}", self.what()))
    }

    fn conflict(&self) -> StoreError {
        StoreError::Conflict(format!(
            "another podalloc instance updated {} first; this tick did nothing",
            self.what()
        ))
    }
}

impl StateStore for ConfigMapStore<'_> {
    fn describe(&self) -> String {
        self.what()
    }

    fn load(&mut self) -> Result<Option<AllocatorState>, StoreError> {
        let Some(cm) = self
            .client
            .get_configmap(&self.name)
            .map_err(|e| self.backend(e))?
        else {
            self.resource_version = None;
            return Ok(None);
        };
        // Never take over a ConfigMap that podalloc did not create: saving replaces it whole.
        let cm_path = || std::path::PathBuf::from(format!("configmap:{}", self.name));
        if cm["metadata"]["labels"][MANAGED_BY] != "podalloc" {
            return Err(StoreError::Corrupt(
                cm_path(),
                format!(
                    "{} exists and was not created by podalloc (no label {MANAGED_BY}=podalloc); \
                     choose another name for --state-store",
                    self.what()
                ),
            ));
        }
        self.check_holder(&cm)?;
        self.resource_version = cm["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_string);
        match cm["data"][DATA_KEY].as_str() {
            None => Ok(None),
            Some(text) => parse(text.as_bytes())
                .map(Some)
                .map_err(|why| StoreError::Corrupt(cm_path(), format!("key {DATA_KEY}: {why}"))),
        }
    }

    fn save(&mut self, state: &AllocatorState) -> Result<(), StoreError> {
        let text = serde_json::to_string_pretty(state).expect("state serializes");
        let write_id = self.next_write_id();
        let mut annotations = json!({ WRITE_ID_KEY: write_id });
        if let Mode::Loop(h) = &mut self.mode {
            h.renewed_ms = Some(crate::commands::now_ms());
            annotations[HOLDER_KEY] = Value::String(serde_json::to_string(h).expect("holder"));
        }
        let mut cm = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "labels": {MANAGED_BY: "podalloc", "spark-app-selector": self.app_id},
                "annotations": annotations,
            },
            "data": {DATA_KEY: text},
        });
        let res = match &self.resource_version {
            Some(rv) => {
                cm["metadata"]["resourceVersion"] = Value::String(rv.clone());
                self.client.replace_configmap(&self.name, &cm)
            }
            None => self.client.create_configmap(&cm),
        };
        match res {
            Ok(saved) => {
                self.resource_version = saved["metadata"]["resourceVersion"]
                    .as_str()
                    .map(str::to_string);
                Ok(())
            }
            Err(e) if e.status_code() == Some(409) => {
                if self.own_write_landed(&text, &write_id) {
                    Ok(())
                } else {
                    Err(self.conflict())
                }
            }
            Err(e) => Err(self.backend(e)),
        }
    }

    fn claim(&mut self) -> Result<(), StoreError> {
        self.load().map(|_| ())
    }

    fn release(&mut self) -> Result<(), StoreError> {
        if !matches!(self.mode, Mode::Loop(_)) {
            return Ok(());
        }
        let state = self.load()?;
        // Saved without the holder record (the replace drops the annotation).
        self.mode = Mode::Once;
        match state {
            Some(st) => self.save(&st),
            None => Ok(()),
        }
    }
}
