//! The state store: the persisted [`AllocatorState`] in a JSON file, saved atomically, guarded
//! by an exclusive lock held for the whole tick (DESIGN.md "State file").
//!
//! - Saving writes a temporary file in the same directory with mode 0600, fsyncs it, renames
//!   it over the state file and fsyncs the directory: a crash leaves the old or the new file,
//!   never a torn one.
//! - The lock is an advisory `flock(2)` on `<state file>.lock` (the state file itself is
//!   replaced on every save, so it cannot carry the lock). It is released when the process
//!   ends, even by SIGKILL. A second run gets [`StoreError::Locked`] at once.
//! - A missing state file is a fresh start; an unreadable, malformed or unknown-version file
//!   is an error naming the file — never silently reset.

use crate::alloc::AllocatorState;
use std::fmt;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Why the state could not be loaded, locked or saved. One line naming the file.
#[derive(Debug)]
pub enum StoreError {
    /// Another process holds the lock.
    Locked(PathBuf),
    /// The file exists but is not a valid state (malformed JSON, unknown version, bad ids).
    Corrupt(PathBuf, String),
    /// An I/O error reading, writing or locking.
    Io(PathBuf, std::io::Error),
    /// Another instance wrote the state first (ConfigMap store: 409 Conflict on update).
    Conflict(String),
    /// The store's backend failed (ConfigMap store: the API call's error).
    Backend(String),
}

/// Where the allocator state lives between ticks: a local file ([`LockedStore`]) or a
/// ConfigMap in the app's namespace. A tick loads once, saves before acting (write-ahead)
/// and after; a store that cannot guarantee it is the only writer must fail the first save
/// with [`StoreError::Conflict`] so that the tick does not act.
pub trait StateStore {
    /// What and where, for messages: `state file /x` or `ConfigMap ns/name`.
    fn describe(&self) -> String;
    /// Loads the state; `Ok(None)` for a fresh start.
    fn load(&mut self) -> Result<Option<AllocatorState>, StoreError>;
    /// Saves the state.
    fn save(&mut self, state: &AllocatorState) -> Result<(), StoreError>;
}

impl StateStore for LockedStore {
    fn describe(&self) -> String {
        format!("state file {}", self.path.display())
    }
    fn load(&mut self) -> Result<Option<AllocatorState>, StoreError> {
        LockedStore::load(self)
    }
    fn save(&mut self, state: &AllocatorState) -> Result<(), StoreError> {
        LockedStore::save(self, state)
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Locked(p) => write!(
                f,
                "another podalloc run holds the lock on {}; skipped this tick",
                p.display()
            ),
            StoreError::Corrupt(p, why) => write!(
                f,
                "state file {} is not a valid podalloc state ({why}); fix or move it away \
                 (ids resume from the cluster's highest executor id without it)",
                p.display()
            ),
            StoreError::Io(p, e) => write!(f, "state file {}: {e}", p.display()),
            StoreError::Conflict(m) | StoreError::Backend(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for StoreError {}

/// Converts a state-store error into the CLI's: locked → exit 3, corrupt → exit 2, I/O → 1.
pub fn store_error(e: StoreError) -> crate::error::Error {
    use crate::error::Error;
    match e {
        StoreError::Locked(_) | StoreError::Conflict(_) => Error::locked(e.to_string()),
        StoreError::Backend(_) => Error::runtime(e.to_string()),
        StoreError::Corrupt(..) => Error::usage(e.to_string()),
        StoreError::Io(..) => Error::runtime(e.to_string()),
    }
}

/// Reads and validates a state file. `Ok(None)` when the file does not exist.
///
/// Errors: [`StoreError::Corrupt`] for malformed JSON / unknown version, [`StoreError::Io`].
pub fn load(path: &Path) -> Result<Option<AllocatorState>, StoreError> {
    if path.is_dir() {
        return Err(StoreError::Corrupt(
            path.to_owned(),
            "it is a directory; --state-file names a file".into(),
        ));
    }
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::Io(path.to_owned(), e)),
    };
    parse(&bytes)
        .map(Some)
        .map_err(|why| StoreError::Corrupt(path.to_owned(), why))
}

/// Parses and validates state JSON bytes. Errors: one line saying what is wrong.
pub fn parse(bytes: &[u8]) -> Result<AllocatorState, String> {
    // Check the version before the shape, so a newer format gets the right message.
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    match v.get("version") {
        Some(serde_json::Value::Number(_)) => {}
        Some(_) => return Err("\"version\" is not a number".into()),
        None => return Err("no \"version\" field".into()),
    }
    let state: AllocatorState = serde_json::from_value(v).map_err(|e| e.to_string())?;
    state.validate()?;
    Ok(state)
}

/// An open, locked state file: the only way to save. Dropping it releases the lock.
#[derive(Debug)]
pub struct LockedStore {
    path: PathBuf,
    _lock: File,
}

impl LockedStore {
    /// Takes the exclusive lock for `path` without waiting, creating the directory (0700) and
    /// the lock file as needed.
    ///
    /// Errors: [`StoreError::Locked`] when another process holds it, [`StoreError::Io`].
    pub fn lock(path: &Path) -> Result<LockedStore, StoreError> {
        // A symlinked state file is written through (its target is replaced), not replaced
        // by a regular file.
        let resolved;
        let path = match fs::read_link(path) {
            Ok(target) => {
                resolved = match path.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
                resolved.as_path()
            }
            Err(_) => path,
        };
        if path.is_dir() {
            return Err(StoreError::Corrupt(
                path.to_owned(),
                "it is a directory; --state-file names a file".into(),
            ));
        }
        let io = |e| StoreError::Io(path.to_owned(), e);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_private_dir(dir).map_err(io)?;
        }
        let lock_path = lock_path(path);
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let file = opts
            .open(&lock_path)
            .map_err(|e| StoreError::Io(lock_path.clone(), e))?;
        match file.try_lock() {
            Ok(()) => Ok(LockedStore {
                path: path.to_owned(),
                _lock: file,
            }),
            Err(TryLockError::WouldBlock) => Err(StoreError::Locked(lock_path)),
            Err(TryLockError::Error(e)) => Err(StoreError::Io(lock_path, e)),
        }
    }

    /// The state file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the state under the lock (see [`load`]).
    pub fn load(&self) -> Result<Option<AllocatorState>, StoreError> {
        load(&self.path)
    }

    /// Saves atomically: temp file (0600) in the same directory, fsync, rename, fsync dir.
    pub fn save(&self, state: &AllocatorState) -> Result<(), StoreError> {
        let io = |e| StoreError::Io(self.path.clone(), e);
        let mut json = serde_json::to_vec_pretty(state).expect("state serializes");
        json.push(b'\n');
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
            _ => PathBuf::from("."),
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(".podalloc-state-")
            .suffix(".tmp")
            .permissions(private_file())
            .tempfile_in(&dir)
            .map_err(io)?;
        tmp.write_all(&json).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(&self.path).map_err(|e| io(e.error))?;
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// `<state file>.lock`.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

fn private_file() -> fs::Permissions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::Permissions::from_mode(0o600)
    }
    #[cfg(not(unix))]
    {
        let f = tempfile::tempfile().expect("temp file");
        f.metadata().expect("metadata").permissions()
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b.create(dir)
}

/// The default state file for an app: `$XDG_STATE_HOME/podalloc/<namespace>/<app id>.json`,
/// else `~/.local/state/podalloc/…`, else `./.podalloc/…`.
pub fn default_path(namespace: &str, app_id: &str) -> PathBuf {
    let base = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local").join("state"))
        })
        .unwrap_or_else(|| PathBuf::from(".podalloc"));
    base.join("podalloc")
        .join(namespace)
        .join(format!("{app_id}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::Unacknowledged;

    #[test]
    fn save_load_roundtrip_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/app.json");
        let store = LockedStore::lock(&path).unwrap();
        assert_eq!(store.load().unwrap(), None);
        let mut st = AllocatorState::new();
        st.target = Some(4);
        st.last_executor_id = 9;
        st.unacknowledged.push(Unacknowledged {
            executor_id: 9,
            created_ms: 5,
            retry: false,
        });
        store.save(&st).unwrap();
        assert_eq!(store.load().unwrap(), Some(st));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        // No temp files left behind.
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}"); // app.json + app.json.lock
    }

    #[test]
    fn second_lock_is_refused_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.json");
        let a = LockedStore::lock(&path).unwrap();
        assert!(matches!(
            LockedStore::lock(&path),
            Err(StoreError::Locked(_))
        ));
        drop(a);
        assert!(LockedStore::lock(&path).is_ok());
    }

    #[test]
    fn corrupt_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.json");
        for (body, needle) in [
            ("{not json", "key must be a string"),
            ("", "EOF"),
            ("{}", "no \"version\""),
            (r#"{"version": 2}"#, "version 2 is not supported"),
            (r#"{"version": "1"}"#, "not a number"),
            (r#"{"version": 1, "target": -1}"#, "invalid value"),
            (
                r#"{"version": 1, "last_executor_id": 1, "unacknowledged": [{"executor_id": 5, "created_ms": 0}]}"#,
                "above last_executor_id",
            ),
        ] {
            fs::write(&path, body).unwrap();
            let e = load(&path).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("app.json") && msg.contains(needle),
                "{body:?}: {msg}"
            );
        }
    }

    #[test]
    fn default_path_is_per_namespace_and_app() {
        let p = default_path("ns1", "app-1");
        assert!(p.ends_with("podalloc/ns1/app-1.json"), "{}", p.display());
    }
}
