//! `apps --discover SELECTOR`: the driver pods matching the selector, what their
//! annotations ask for (the pure parsing is [`crate::engine::driver::Driver`]), the apps they make,
//! and what became of them (ended, stopped by an error, badly annotated: one warning and one
//! Warning Event on the driver).
//!
//! A new driver's app keeps its state in the home it already has in the namespace (an
//! ExecutorSet, a state ConfigMap), found as `run` finds it without `--state-store`
//! ([`super::home::discovered`]); only an app without one gets discovery's own store
//! (`--state-configmaps`, `--state-dir`). An app with two homes and none in use is not
//! managed: one warning naming both and the fix, and the other apps go on.

use super::home::Home;
use crate::cli::{AppArgs, Cli};
use crate::controller::runner::Slot;
use crate::controller::tick::App;
use crate::engine::alloc::{Request, TargetChange};
use crate::engine::driver::{self, Driver};
use crate::error::Result;
use crate::kube::KubeClient;
use log::{info, warn};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The client discovery lists with, and the Events poster its warnings go to.
pub(super) type Via<'a> = (&'a KubeClient, &'a crate::controller::events::Poster);

/// `--discover`: the driver pods, what their annotations asked for, what became of them.
pub(super) struct Discovery {
    selector: String,
    /// How often the drivers are listed (`--interval`).
    pub(super) interval: Duration,
    /// The global flags: every discovered app's defaults.
    args: AppArgs,
    /// The template of `--template`/`--image`, for drivers without a template annotation.
    template: Option<crate::engine::podspec::PodTemplate>,
    /// Driver uid → its annotations, as last seen.
    seen: BTreeMap<String, BTreeMap<String, String>>,
    /// Driver uid → (its phase, the targets of its annotations), as last applied to its app.
    applied: BTreeMap<String, (String, Targets)>,
    /// Drivers whose app ended (driver finished): not managed again.
    pub(super) done: BTreeSet<String>,
    /// Drivers whose app was stopped by an error, with their annotations then: managed
    /// again once the annotations change.
    pub(super) stopped: BTreeMap<String, BTreeMap<String, String>>,
    /// The last warning per driver uid (so one bad annotation is one line, not one a pass).
    warned: BTreeMap<String, String>,
    /// ConfigMap name → (when read, the template).
    templates: BTreeMap<String, (Instant, crate::engine::podspec::PodTemplate)>,
    /// Whether the last list matched no driver pod (said once, until one appears).
    said_none: bool,
    /// Driver uid → the home its app already had in the namespace, when it had one.
    homes: BTreeMap<String, Home>,
}

/// How long a template read from a ConfigMap is used before it is read again.
const TEMPLATE_TTL: Duration = Duration::from_secs(60);

/// A driver found with no app yet: (its uid, the app, its annotated targets, the home the
/// app already has in the namespace; `None`: none, discovery's own store).
pub(super) type Found = (String, App, Targets, Option<Home>);

/// The targets a driver's annotations ask for: profile 0's, and each other profile's.
pub(super) type Targets = (u32, BTreeMap<u32, u32>);

/// The step's request that makes `targets` the app's: `change` (a seed, a set) of each.
pub(super) fn request_of(targets: &Targets, change: fn(u32) -> TargetChange) -> Request {
    Request {
        target: change(targets.0),
        profiles: (targets.1.iter()).map(|(&p, &n)| (p, change(n))).collect(),
        ..Request::default()
    }
}

impl Discovery {
    /// Discovery of the drivers matching `selector`, every `interval`, with the global
    /// flags of `cli` as every app's defaults. Errors (exit 2): `--template`/`--image`.
    pub(super) fn new(cli: &Cli, selector: &str, interval: Duration) -> Result<Discovery> {
        let template = crate::cli::template::load_template(
            cli.app.template.as_deref(),
            cli.app.image.as_deref(),
        )?;
        Ok(Discovery {
            selector: selector.to_string(),
            interval,
            args: cli.app.clone(),
            template,
            seen: BTreeMap::new(),
            applied: BTreeMap::new(),
            done: BTreeSet::new(),
            stopped: BTreeMap::new(),
            warned: BTreeMap::new(),
            templates: BTreeMap::new(),
            said_none: false,
            homes: BTreeMap::new(),
        })
    }

    /// The annotations of driver `uid` as last seen.
    pub(super) fn annotations_of(&self, uid: &str) -> BTreeMap<String, String> {
        self.seen.get(uid).cloned().unwrap_or_default()
    }

    /// Warns once per driver and message, in the log and as a Warning Event on the driver
    /// pod (reason `AllocationSkipped`), so `kubectl describe pod DRIVER` says why its
    /// executors are left as they are.
    fn warn_once(&mut self, (client, events): Via<'_>, ns: &str, d: &Driver, msg: String) {
        if self.warned.get(&d.uid) != Some(&msg) {
            warn!("{msg}");
            let now = super::env::now_ms();
            crate::controller::events::warn_on_pod(
                events,
                client,
                ns,
                &d.name,
                &d.uid,
                "AllocationSkipped",
                &msg,
                now,
            );
            self.warned.insert(d.uid.clone(), msg);
        }
    }

    /// Lists the driver pods and brings `slots` in line: a gone driver's app is marked
    /// ending and woken (its next tick, with the driver gone, is the step's `driver-ended`),
    /// a changed target or phase wakes its app; returns the new drivers' apps.
    pub(super) fn refresh(
        &mut self,
        (client, events): Via<'_>,
        ns: &str,
        slots: &mut [Slot<'_>],
    ) -> Vec<Found> {
        let lp = crate::kube::ListParams {
            label_selector: &self.selector,
            field_selector: None,
            limit: Some(500),
        };
        let items = match client.api(&crate::kube::PODS).list_items(&lp) {
            Ok((items, _)) => items,
            Err(e) => {
                let sel = &self.selector;
                warn!("listing the driver pods ({sel}): {e}; retrying next tick");
                return Vec::new();
            }
        };
        let drivers: Vec<Driver> = items.iter().filter_map(Driver::of).collect();
        match (drivers.is_empty(), self.said_none) {
            (true, false) => warn!(
                "--discover {:?}: no driver pod in namespace {ns} matches; nothing to manage \
                 until one does (check the selector and -n/--namespace)",
                self.selector
            ),
            (false, true) => info!(
                "--discover {:?}: {} driver pod(s) found",
                self.selector,
                drivers.len()
            ),
            _ => {}
        }
        self.said_none = drivers.is_empty();
        let live: BTreeSet<&str> = drivers.iter().map(|d| d.uid.as_str()).collect();
        for s in slots.iter_mut() {
            let gone = s.driver_uid.as_deref().is_some_and(|u| !live.contains(u));
            if gone && !s.ending {
                s.ending = true;
                s.wake();
            }
        }
        self.done.retain(|u| live.contains(u.as_str()));
        self.seen.retain(|u, _| live.contains(u.as_str()));
        self.applied.retain(|u, _| live.contains(u.as_str()));
        self.homes.retain(|u, _| live.contains(u.as_str()));
        let mut found = Vec::new();
        for d in drivers {
            found.extend(self.admit((client, events), ns, d, slots));
        }
        found
    }

    /// One driver: updates its app (a changed target or phase wakes it), returns it as a
    /// new app, or reports why not.
    fn admit(
        &mut self,
        (client, events): Via<'_>,
        ns: &str,
        d: Driver,
        slots: &mut [Slot<'_>],
    ) -> Option<Found> {
        if self.done.contains(&d.uid) {
            return None;
        }
        self.seen.insert(d.uid.clone(), d.annotations.clone());
        if let Some(was) = self.stopped.get(&d.uid) {
            if *was == d.annotations {
                return None;
            }
            self.stopped.remove(&d.uid);
        }
        let Some(app_id) = d.app_id.clone() else {
            let msg = format!(
                "driver pod {:?} has no spark-app-selector label: skipped",
                d.name
            );
            self.warn_once((client, events), ns, &d, msg);
            return None;
        };
        let (wanted, app) = match self.lower(client, &d, &app_id, slots) {
            Ok(w) => w,
            Err(msg) => {
                self.warn_once((client, events), ns, &d, msg);
                return None;
            }
        };
        let targets: Targets = (wanted.target, wanted.profiles.clone());
        let Some(s) = slots
            .iter_mut()
            .find(|s| s.driver_uid.as_deref() == Some(&d.uid))
        else {
            return self.found((client, events), ns, d, (app, targets));
        };
        self.warned.remove(&d.uid);
        let before = (self.applied).insert(d.uid.clone(), (d.phase.clone(), targets.clone()));
        // The app as its annotations make it now; whether a profile without a template
        // of its own has none is its home's (an ExecutorSet's), kept.
        let own = s.app.own_profile_templates;
        s.app = app;
        s.app.own_profile_templates = own;
        match before {
            Some((_, was)) if was != targets => {
                let key = driver::ANNOTATION_EXECUTORS;
                let (profiles, pkey) = (
                    said_profiles(&targets.1),
                    driver::ANNOTATION_PROFILE_EXECUTORS,
                );
                if let Some(Home::ExecutorSet(es)) = self.homes.get(&d.uid) {
                    // Its ExecutorSet's spec is the app's intent: the controller never writes
                    // it, and a target set beside it would stop the app (exit 2).
                    warn!(
                        "app {app_id}: annotations {key}, {pkey} of driver pod {:?} ask for \
                         target {}{profiles}, not applied: its home, ExecutorSet {es}, holds \
                         its target (spec.replicas): `kubectl scale executorset {es} \
                         --replicas {}`",
                        d.name, wanted.target, wanted.target
                    );
                    // Its phase may have changed in the same listing.
                    s.wake();
                    return None;
                }
                info!(
                    "app {app_id}: target {}{profiles} (annotations {key}, {pkey})",
                    wanted.target
                );
                s.first = Some(request_of(&targets, TargetChange::Set));
                s.wake();
            }
            Some((phase, _)) if phase != d.phase => s.wake(),
            _ => {}
        }
        None
    }

    /// A driver `d` whose app has no slot yet: the app, with the home it already has in the
    /// namespace ([`super::home::discovered`]), or, when it cannot be managed (two homes,
    /// none in use), one warning saying why (looked for again at the next listing).
    fn found(
        &mut self,
        via: Via<'_>,
        ns: &str,
        d: Driver,
        (mut app, targets): (App, Targets),
    ) -> Option<Found> {
        let home = match super::home::discovered(via.0, &app.app_id) {
            Ok(h) => h,
            Err(msg) => {
                self.warn_once(via, ns, &d, msg);
                return None;
            }
        };
        self.warned.remove(&d.uid);
        self.applied
            .insert(d.uid.clone(), (d.phase.clone(), targets.clone()));
        // As `run` on an ExecutorSet: each profile's ExecutorSet carries its own template.
        app.own_profile_templates = matches!(home, Some(Home::ExecutorSet(_)));
        let said_home = match &home {
            Some(h) => {
                self.homes.insert(d.uid.clone(), h.clone());
                let seed = match h {
                    Home::ExecutorSet(_) => " (the annotations only seed an empty spec.replicas)",
                    Home::ConfigMap(_) => "",
                };
                format!("; its home: {h}{seed}")
            }
            None => {
                self.homes.remove(&d.uid);
                String::new()
            }
        };
        info!(
            "app {}: driver pod {:?} found, target {}{}{said_home}",
            app.app_id,
            d.name,
            targets.0,
            said_profiles(&targets.1)
        );
        Some((d.uid, app, targets, home))
    }

    /// What driver `d`'s annotations ask for and the app they make. Errors: a warning naming
    /// the driver (bad annotation, no template, its app id managed for another driver).
    fn lower(
        &mut self,
        client: &KubeClient,
        d: &Driver,
        app_id: &str,
        slots: &[Slot<'_>],
    ) -> std::result::Result<(driver::Wanted, App), String> {
        let wanted = d.wanted()?;
        let mine = slots
            .iter()
            .any(|s| s.driver_uid.as_deref() == Some(&d.uid));
        if !mine && slots.iter().any(|s| s.app.app_id == app_id) {
            return Err(format!(
                "driver pod {:?}: app {app_id} is already managed for another driver: skipped",
                d.name
            ));
        }
        let template = self.template_for(client, d, &wanted)?;
        let app = discovered_app(&self.args, app_id, &wanted, template, &d.name)?;
        Ok((wanted, app))
    }

    /// The executor template of a driver's app: its ConfigMap's, else the global one.
    /// Errors: a warning naming the driver.
    fn template_for(
        &mut self,
        client: &KubeClient,
        d: &Driver,
        wanted: &driver::Wanted,
    ) -> std::result::Result<crate::engine::podspec::PodTemplate, String> {
        let template = match &wanted.template {
            None => self.template.clone(),
            Some(cm) => Some(self.template_from(client, cm).map_err(|msg| {
                format!(
                    "driver pod {:?}: {msg}; its executors are left as they are",
                    d.name
                )
            })?),
        };
        template.ok_or_else(|| {
            format!(
                "driver pod {:?}: no executor template: annotate it with {} or give --template/--image",
                d.name,
                driver::ANNOTATION_TEMPLATE
            )
        })
    }

    /// The template in ConfigMap `name` (key [`driver::TEMPLATE_KEY`]), read at most once a
    /// [`TEMPLATE_TTL`].
    fn template_from(
        &mut self,
        client: &KubeClient,
        name: &str,
    ) -> std::result::Result<crate::engine::podspec::PodTemplate, String> {
        if let Some((at, t)) = self.templates.get(name) {
            if at.elapsed() < TEMPLATE_TTL {
                return Ok(t.clone());
            }
        }
        let key = driver::TEMPLATE_KEY;
        let cm = client
            .api(&crate::kube::CONFIG_MAPS)
            .get(name)
            .map_err(|e| format!("cannot read ConfigMap {name:?}: {e}"))?
            .ok_or_else(|| {
                format!(
                    "no ConfigMap {name:?} (annotation {})",
                    driver::ANNOTATION_TEMPLATE
                )
            })?;
        let text = cm["data"][key]
            .as_str()
            .ok_or_else(|| format!("ConfigMap {name:?} has no key {key:?}"))?;
        let value = crate::cli::template::parse_template_text(text)
            .map_err(|e| format!("ConfigMap {name:?} key {key:?} is not YAML or JSON: {e}"))?;
        let t = crate::engine::podspec::PodTemplate::from_value(value, None)
            .map_err(|e| format!("ConfigMap {name:?} key {key:?}: {e}"))?;
        self.templates
            .insert(name.to_string(), (Instant::now(), t.clone()));
        Ok(t)
    }
}

/// The other profiles' targets for a log line: `, profile 1 target 4, …` (empty: none).
fn said_profiles(profiles: &BTreeMap<u32, u32>) -> String {
    (profiles.iter())
        .map(|(p, n)| format!(", profile {p} target {n}"))
        .collect()
}

/// The app of driver pod `driver` as its annotations (`wanted`) and the global flags
/// (`args`) make it. Errors: an `--executor-container` the template does not have, naming
/// the driver.
fn discovered_app(
    args: &AppArgs,
    app_id: &str,
    wanted: &driver::Wanted,
    template: crate::engine::podspec::PodTemplate,
    driver: &str,
) -> std::result::Result<App, String> {
    let mut args = args.clone();
    if let Some(b) = wanted.batch_size {
        args.batch_size = b;
    }
    let mut settings = args.settings(app_id);
    if let Some(name) = &settings.executor_container {
        (template.check_executor_container(name))
            .map_err(|msg| format!("driver pod {driver:?}: {msg}"))?;
    }
    if settings.executor_container.is_none() {
        // As `AppArgs::app`: the template's first container is the executor's.
        settings.executor_container = Some(template.first_container().to_string());
    }
    Ok(App {
        settings,
        app_id: app_id.to_string(),
        template: Some(template),
        profile_templates: Default::default(),
        own_profile_templates: false,
        driver_pod: Some(driver.to_string()),
        page_size: args.page_size,
    })
}
