//! The application a tick works for: its id, settings, template, driver and page size.

use crate::engine::alloc::Settings;
use crate::engine::podspec::PodTemplate;
use crate::engine::snapshot::{LABEL_APP, LABEL_ROLE, ROLE_EXECUTOR};
use std::collections::BTreeMap;

/// Everything a tick needs to know about the application.
#[derive(Debug, Clone)]
pub struct App {
    /// The application id (`spark-app-selector`), already validated as a label value.
    pub app_id: String,
    /// Allocation settings.
    pub settings: Settings,
    /// The executor pod template (of resource profile 0, and of every profile without its
    /// own); `None` only for read-only commands (status, dry run).
    pub template: Option<PodTemplate>,
    /// The templates of resource profiles that have their own (`--profile-template P=FILE`),
    /// by profile id.
    pub profile_templates: BTreeMap<u32, PodTemplate>,
    /// Whether a profile P >= 1 without a template of its own has none (the ExecutorSet
    /// store, whose profiles each carry theirs: profile 0's shape is never taken silently),
    /// rather than profile 0's.
    pub own_profile_templates: bool,
    /// Driver pod name for ownerReferences.
    pub driver_pod: Option<String>,
    /// Pods per list page (0: no pagination).
    pub page_size: u32,
}

impl App {
    /// The template executors of resource profile `profile` are built from: its own, else
    /// profile 0's (the pod then differs only by its profile label and env), unless
    /// [`Self::own_profile_templates`].
    pub fn template_for(&self, profile: u32) -> Option<&PodTemplate> {
        match self.profile_templates.get(&profile) {
            Some(t) => Some(t),
            None if profile == 0 || !self.own_profile_templates => self.template.as_ref(),
            None => None,
        }
    }

    /// The label selector of the app's executor pods:
    /// `spark-app-selector=<app id>,spark-role=executor`.
    pub fn label_selector(&self) -> String {
        format!("{LABEL_APP}={},{LABEL_ROLE}={ROLE_EXECUTOR}", self.app_id)
    }
}
