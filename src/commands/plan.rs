//! `podalloc plan`: the allocation step once, offline, on a recorded PodList
//! (the contract in shared/conformance/README.md).

use crate::alloc::{self, AllocatorState, Request};
use crate::cli::{AppArgs, PlanArgs};
use crate::error::{Error, Result};
use crate::snapshot::Snapshot;
use crate::state::{self, store_error, StoreError};
use log::warn;
use std::io::Read;

/// Reads the PodList and state, runs one step, prints the plan JSON on stdout.
pub fn plan(app: &AppArgs, a: &PlanArgs) -> Result<()> {
    let app_id = app.app_id(false)?;
    let settings = app.settings(&app_id);
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
    let snapshot = Snapshot::from_pod_list(&bytes, &app_id)
        .map_err(|e| Error::usage(format!("PodList {what}: {e}")))?;
    let state = match &a.state {
        Some(p) => state::load(p)
            .map_err(|e| match e {
                StoreError::Io(p, e) => {
                    Error::usage(format!("cannot read the state {}: {e}", p.display()))
                }
                e => store_error(e),
            })?
            .ok_or_else(|| Error::usage(format!("state file {} does not exist", p.display())))?,
        None => AllocatorState::new(),
    };
    let request = Request {
        target: a.target,
        remove: a.remove.clone(),
    };
    let plan = alloc::step(&snapshot, &state, &settings, &request, a.now)
        .map_err(|e| Error::usage(e.to_string()))?;
    for w in &plan.warnings {
        warn!("{w}");
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&plan).expect("plan serializes")
    );
    Ok(())
}
