//! `podalloc plan`: the allocation step once, offline, on a recorded PodList
//! (the contract in tests/conformance/README.md).

use crate::cli::{AppArgs, PlanArgs};
use crate::engine::alloc::{self, AllocatorState, Request, TargetChange};
use crate::engine::snapshot::{DriverState, For, ListSource, Snapshot};
use crate::error::{Error, Result};
use crate::store::file as state;
use log::warn;
use std::io::Read;

/// Reads the PodList and state, runs one step, prints the plan JSON on stdout.
pub(super) fn plan(app: &AppArgs, a: &PlanArgs) -> Result<()> {
    let app_id = app.app_id(false)?;
    let settings = app.settings(&app_id);
    // Checked here (an unreadable or invalid one is an error); used by the commands that
    // create pods.
    app.profile_templates()?;
    let bytes = if a.pods.as_os_str() == "-" {
        let mut v = Vec::new();
        std::io::stdin()
            .read_to_end(&mut v)
            .map_err(|e| Error::usage(format!("reading the PodList from standard input: {e}")))?;
        v
    } else {
        std::fs::read(&a.pods).map_err(|e| {
            Error::usage(format!("cannot read the PodList {}: {e}", a.pods.display()))
        })?
    };
    let what = if a.pods.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        a.pods.display().to_string()
    };
    let mut snapshot = Snapshot::default();
    let of = For::app(&app_id)
        .container(settings.executor_container.as_deref())
        .source(ListSource::Offline);
    (snapshot.read_page(&bytes[..], of))
        .map_err(|e| Error::usage(format!("PodList {what}: {e}")))?;
    snapshot.driver = a.driver_phase.as_deref().map(|p| match p {
        "Deleting" => DriverState::Deleting,
        phase => DriverState::of(false, phase),
    });
    let state = match &a.state {
        Some(p) => read_state(p)?,
        None => AllocatorState::new(),
    };
    if a.now > 0 && a.now < 100_000_000_000 {
        warn!(
            "--now {} looks like seconds, not milliseconds since the Unix epoch",
            a.now
        );
    }
    let request = Request {
        target: a.target.map_or(TargetChange::Keep, TargetChange::Set),
        remove: a.remove.clone(),
        evict: Vec::new(),
        profiles: (a.profile_target.iter())
            .map(|&(p, n)| (p, TargetChange::Set(n)))
            .collect(),
        ..Request::default()
    };
    if snapshot.executors.is_empty() && snapshot.foreign > 0 {
        warn!(
            "none of the {} pods in the PodList belong to app {app_id:?} (labels \
             spark-app-selector={app_id}, spark-role=executor): check --app-id",
            snapshot.foreign
        );
    }
    let plan = alloc::step(&snapshot, &state, &settings, &request, a.now).map_err(|e| match e {
        alloc::StepError::NoTarget => {
            Error::usage("no target: pass --target N (the --state given holds none)")
        }
    })?;
    for w in &plan.warnings {
        warn!("{w}");
    }
    super::print_out(&serde_json::to_string_pretty(&plan).expect("plan serializes"))
}

/// Reads `--state`: the `state` object of a previous plan, or that whole plan output.
fn read_state(p: &std::path::Path) -> Result<AllocatorState> {
    let bytes = std::fs::read(p)
        .map_err(|e| Error::usage(format!("cannot read the state {}: {e}", p.display())))?;
    let whole: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
    let inner = whole
        .as_ref()
        .filter(|v| v.get("version").is_none())
        .and_then(|v| v.get("state"))
        .map(|v| serde_json::to_vec(v).expect("re-serializes"));
    state::parse(inner.as_deref().unwrap_or(&bytes)).map_err(|why| {
        Error::usage(format!(
            "--state {} is not a podalloc state ({why}); pass the `state` object a previous \
             `podalloc plan` printed",
            p.display()
        ))
    })
}
