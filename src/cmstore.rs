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

use crate::alloc::AllocatorState;
use crate::kube::{KubeClient, KubeError};
use crate::state::{parse, StateStore, StoreError};
use serde_json::{json, Value};

/// The data key holding the state JSON.
pub const DATA_KEY: &str = "state.json";
/// The label podalloc puts on its ConfigMaps (and requires before writing over one).
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// A state store in ConfigMap `name` of the client's namespace.
pub struct ConfigMapStore<'a> {
    client: &'a KubeClient,
    name: String,
    /// `metadata.resourceVersion` seen at the last load or save; `None`: does not exist.
    resource_version: Option<String>,
    app_id: String,
}

impl<'a> ConfigMapStore<'a> {
    /// A store for ConfigMap `name` (a DNS-1123 subdomain) holding `app_id`'s state.
    pub fn new(client: &'a KubeClient, name: &str, app_id: &str) -> ConfigMapStore<'a> {
        ConfigMapStore {
            client,
            name: name.to_string(),
            resource_version: None,
            app_id: app_id.to_string(),
        }
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
        let mut cm = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "labels": {MANAGED_BY: "podalloc", "spark-app-selector": self.app_id},
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
            Err(e) if e.status_code() == Some(409) => Err(self.conflict()),
            Err(e) => Err(self.backend(e)),
        }
    }
}
