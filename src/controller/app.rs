//! The application a tick works for: its id, settings, template, driver and page size.

use crate::engine::alloc::Settings;
use crate::engine::podspec::PodTemplate;
use crate::engine::snapshot::{LABEL_APP, LABEL_ROLE, ROLE_EXECUTOR};

/// Everything a tick needs to know about the application.
#[derive(Debug, Clone)]
pub struct App {
    /// The application id (`spark-app-selector`), already validated as a label value.
    pub app_id: String,
    /// Allocation settings.
    pub settings: Settings,
    /// The executor pod template; `None` only for read-only commands (status, dry run).
    pub template: Option<PodTemplate>,
    /// Driver pod name for ownerReferences.
    pub driver_pod: Option<String>,
    /// Pods per list page (0: no pagination).
    pub page_size: u32,
}

impl App {
    /// The label selector of the app's executor pods:
    /// `spark-app-selector=<app id>,spark-role=executor`.
    pub fn label_selector(&self) -> String {
        format!("{LABEL_APP}={},{LABEL_ROLE}={ROLE_EXECUTOR}", self.app_id)
    }
}
