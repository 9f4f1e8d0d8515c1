//! `podalloc sim` and `--simulate` in a binary built without the simulator
//! (`cargo build --no-default-features`, the production image): both are usage errors that
//! say so. The same names as `sim.rs`, so the callers need no `cfg`.

use crate::cli::{ConnArgs, SimArgs};
use crate::error::{Error, Result};
use crate::kube::ConnectionFlags;
use std::path::PathBuf;

/// Never made: this binary has no simulator.
pub(super) struct SimGuard {
    _never: std::convert::Infallible,
}

impl SimGuard {
    /// Unreachable: no `SimGuard` exists in this build.
    pub(super) fn state_file(&self) -> PathBuf {
        match self._never {}
    }
}

/// The usage error of `--simulate` and `podalloc sim` here.
fn no_simulator(what: &str) -> Error {
    Error::usage(format!(
        "{what}: this podalloc was built without the simulator (cargo feature `sim`); \
         connect to a cluster instead, or build with the default features"
    ))
}

/// `--simulate`: a usage error (exit 2) in this build.
pub(super) fn start_simulator(_: &ConnArgs) -> Result<(ConnectionFlags, Option<SimGuard>)> {
    Err(no_simulator("--simulate"))
}

/// `podalloc sim`: a usage error (exit 2) in this build.
pub(super) fn sim(_: &SimArgs) -> Result<()> {
    Err(no_simulator("podalloc sim"))
}
