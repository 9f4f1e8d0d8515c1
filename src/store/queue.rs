//! Steering a running controller, the shell half: the file store's request queue (a
//! directory beside the state file) and new request ids. The ConfigMap store keeps its queue
//! in the state ConfigMap (`src/cmstore.rs`); the pure rule that folds queued requests into a
//! step is [`crate::engine::alloc::take_requests`].
//!
//! The file queue is `<state file>.requests/`, one file per request, `<id>.json` holding a
//! [`Steering`]. A writer never needs the state's lock: it writes a temporary file in the
//! directory (mode 0600, fsync) and renames it to its own unique name (the id carries the
//! time in ns, the pid and random hex digits), then fsyncs the directory. So a reader sees a
//! request whole or not at all, and concurrent writers never overwrite each other. Only the
//! owner (the holder of the state's lock) removes a request file, and only after the state
//! that records the request as applied ([`crate::engine::alloc::AllocatorState::applied_requests`])
//! was saved: a crash in between leaves a file whose id the state already lists, which the
//! next tick skips and removes. Requests are applied in the order of their file names, which
//! is their submission order (time in ns first).

use crate::engine::alloc::{AllocatorState, SteerOp, Steering};
use crate::store::file::{LockedStore, StateStore, StoreError};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The suffix of a request file.
const SUFFIX: &str = ".json";
/// The name prefix of a request's temporary file before its rename.
const TEMP_PREFIX: &str = ".podalloc-request-";

/// A fresh request id: the wall clock in ns since the Unix epoch (20 digits), the pid and six
/// random hex digits, e.g. `01764625123456789012-4242-a1b2c3`. Unique across
/// processes and hosts, and sorting by submission time.
pub fn new_id() -> String {
    let ns = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    use std::io::Read;
    let mut bytes = [0u8; 3];
    let read = fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        // No random source: std's hasher keys (random per process, different per call)
        // mixed with the time still differ.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(ns);
        let n = h.finish() as u32;
        bytes.copy_from_slice(&n.to_le_bytes()[..3]);
    }
    let rand: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{ns:020}-{}-{rand}", std::process::id())
}

/// A new request for `op` of resource profile `profile` (0: the default one), submitted now
/// by `command` of this process.
pub fn request(op: SteerOp, command: &str, profile: u32) -> Steering {
    let h = crate::store::file::Holder::current(command);
    Steering {
        id: new_id(),
        op,
        submitted_ms: h.since_ms,
        by: format!("`podalloc {command}` on host {}, pid {}", h.host, h.pid),
        profile,
    }
}

/// The request queue of a file store: the directory `<state file>.requests`.
#[derive(Debug, Clone)]
pub struct FileQueue {
    dir: PathBuf,
}

impl FileQueue {
    /// The queue beside state file `state`.
    pub fn beside(state: &Path) -> FileQueue {
        let mut s = state.as_os_str().to_owned();
        s.push(".requests");
        FileQueue {
            dir: PathBuf::from(s),
        }
    }

    /// The queue's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Adds `req` to the queue atomically (temp file + rename, see the module doc), creating
    /// the directory (0700) as needed. Errors: [`StoreError::NotRegular`] when the directory
    /// is a link or not a directory, [`StoreError::Io`].
    pub fn submit(&self, req: &Steering) -> Result<(), StoreError> {
        let io = |e| StoreError::Io(self.dir.clone(), e);
        self.check_dir()?;
        let mut b = fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            b.mode(0o700);
        }
        b.create(&self.dir).map_err(io)?;
        let mut json = serde_json::to_vec(req).expect("request serializes");
        json.push(b'\n');
        let mut tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(io)?;
        tmp.write_all(&json).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        let path = self.dir.join(format!("{}{SUFFIX}", req.id));
        tmp.persist_noclobber(&path).map_err(|e| io(e.error))?;
        if let Ok(d) = fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }

    /// The queued requests, oldest first. A file that does not parse is skipped with a
    /// warning naming it (it is never removed). A missing directory is an empty queue.
    /// Errors: [`StoreError::NotRegular`], [`StoreError::Io`].
    pub fn list(&self) -> Result<Vec<Steering>, StoreError> {
        self.check_dir()?;
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(StoreError::Io(self.dir.clone(), e)),
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(SUFFIX) && !n.starts_with('.'))
            .collect();
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let path = self.dir.join(&name);
            let parsed = crate::store::file::read_small(&path)
                .and_then(|b| serde_json::from_slice::<Steering>(&b).map_err(|e| e.to_string()));
            match parsed {
                Ok(r) if format!("{}{SUFFIX}", r.id) == name => out.push(r),
                Ok(_) => log::warn!("{}: its id is not its name: ignored", path.display()),
                Err(e) => log::warn!("{}: not a steering request ({e}): ignored", path.display()),
            }
        }
        Ok(out)
    }

    /// Best effort, for the holder of the state's lock: removes temporary files of
    /// submissions killed before their rename (`.podalloc-request-*.tmp`) older than a
    /// minute (a submission takes milliseconds, so such a file belongs to no running one).
    pub fn remove_stale_temps(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let ours = name.starts_with(TEMP_PREFIX) && name.ends_with(".tmp");
            let old = (e.metadata().ok())
                .filter(|m| m.file_type().is_file())
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= std::time::Duration::from_secs(60));
            if ours && old {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// Whether request `id` is still queued.
    pub fn contains(&self, id: &str) -> bool {
        self.dir.join(format!("{id}{SUFFIX}")).exists()
    }

    /// Removes the files of requests `ids` (applied: the saved state lists them). Returns the
    /// ids whose files are gone (removed now or already).
    pub fn remove(&self, ids: &[String]) -> Vec<String> {
        let gone: Vec<String> = ids
            .iter()
            .filter(
                |id| match fs::remove_file(self.dir.join(format!("{id}{SUFFIX}"))) {
                    Ok(()) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
                    Err(e) => {
                        log::warn!("cannot remove the applied request {id}: {e}");
                        false
                    }
                },
            )
            .cloned()
            .collect();
        if !gone.is_empty() {
            if let Ok(d) = fs::File::open(&self.dir) {
                let _ = d.sync_all();
            }
        }
        gone
    }

    /// The directory's modification time: it changes when a request is added or removed (a
    /// `stat`, no API call), so an idle loop polls it to wake at once. `None`: no queue yet.
    pub fn marker(&self) -> Option<SystemTime> {
        fs::metadata(&self.dir).and_then(|m| m.modified()).ok()
    }

    /// Refuses a queue path that exists and is not a directory (a link is never followed).
    fn check_dir(&self) -> Result<(), StoreError> {
        match fs::symlink_metadata(&self.dir) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(m) if m.file_type().is_symlink() => {
                Err(StoreError::NotRegular(self.dir.clone(), "a symbolic link"))
            }
            Ok(_) => Err(StoreError::NotRegular(self.dir.clone(), "not a directory")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::Io(self.dir.clone(), e)),
        }
    }
}

/// The file store as a [`StateStore`]: the state under its lock, and the queue of steering
/// requests beside it (here, so that the file store needs nothing of its queue).
impl StateStore for LockedStore {
    fn describe(&self) -> String {
        format!("state file {}", self.path().display())
    }
    fn load(&mut self) -> Result<Option<AllocatorState>, StoreError> {
        LockedStore::load(self)
    }
    fn save(&mut self, state: &AllocatorState) -> Result<(), StoreError> {
        LockedStore::save(self, state)
    }
    fn requests(&mut self) -> Result<Vec<Steering>, StoreError> {
        let queue = FileQueue::beside(self.path());
        queue.remove_stale_temps();
        queue.list()
    }
    fn consumed(&mut self, ids: &[String]) -> Vec<String> {
        FileQueue::beside(self.path()).remove(ids)
    }
    fn queue_marker(&self) -> Option<std::time::SystemTime> {
        FileQueue::beside(self.path()).marker()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_queue_in_submission_order_and_are_removed_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let q = FileQueue::beside(&dir.path().join("app.json"));
        assert!(q.list().unwrap().is_empty());
        assert!(q.marker().is_none());
        let a = request(SteerOp::Add { count: 2 }, "add", 0);
        let b = request(
            SteerOp::Remove {
                ids: vec![3],
                evict: false,
            },
            "remove",
            0,
        );
        q.submit(&a).unwrap();
        q.submit(&b).unwrap();
        assert!(a.id < b.id, "{} {}", a.id, b.id);
        assert_eq!(q.list().unwrap(), vec![a.clone(), b.clone()]);
        assert!(q.contains(&a.id));
        assert_eq!(q.remove(std::slice::from_ref(&a.id)), vec![a.id.clone()]);
        assert_eq!(q.list().unwrap(), vec![b]);
        assert!(!q.contains(&a.id));
        // No temporary files are left.
        let names: Vec<_> = fs::read_dir(q.dir()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1);
    }
}
