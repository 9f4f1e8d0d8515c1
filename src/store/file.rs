//! The state store: the persisted [`AllocatorState`] in a JSON file, saved atomically, guarded
//! by an exclusive lock held for the whole tick (a `run` loop holds it for its whole life).
//!
//! - Saving writes a temporary file in the same directory with mode 0600, fsyncs it, renames
//!   it over the state file and fsyncs the directory: a crash leaves the old or the new file,
//!   never a torn one.
//! - The lock is an advisory `flock(2)` on `<state file>.lock` (the state file itself is
//!   replaced on every save, so it cannot carry the lock). It is released when the process
//!   ends, even by SIGKILL. A second run gets [`StoreError::Locked`] at once.
//! - A missing state file is a fresh start; an unreadable, malformed or unknown-version file
//!   is an error naming the file — never silently reset. So is a file with a key twice in one
//!   object (JSON decoders disagree on which one wins), or a `last_executor_id` above
//!   [`MAX_EXECUTOR_ID`].
//! - The state file and its lock file must be regular files (or not exist yet): a symbolic
//!   link, FIFO, socket or device there is refused ([`StoreError::NotRegular`], exit 2) and
//!   never followed, read or written. Files are opened with `O_NOFOLLOW | O_NONBLOCK` and
//!   checked with `fstat` after opening, so a link swapped in meanwhile is not followed and a
//!   FIFO never blocks. (Saving renames a temporary file over the path, which replaces a link
//!   rather than writing through it.)
//! - Steering requests for the lock's holder queue in `<state file>.requests/`
//!   (`store::queue::FileQueue`, which also holds this store's `StateStore` impl): written without the lock, removed by the holder only
//!   after the save that lists them in `applied_requests`.
//! - A save interrupted by SIGKILL can leave its temporary file (`.podalloc-state-XXXXXX.tmp`,
//!   six random letters or digits) in the state directory. Taking the lock removes such files
//!   of ours (that name pattern, regular files owned by this user) older than a minute; a save
//!   takes milliseconds, so a file that old belongs to no running save.

use crate::engine::alloc::{AllocatorState, StateOwner, Steering};
use crate::engine::snapshot::MAX_EXECUTOR_ID;
use std::fmt;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The temporary file name of a save: this prefix, [`TEMP_RAND_CHARS`] random letters or
/// digits, [`TEMP_SUFFIX`].
const TEMP_PREFIX: &str = ".podalloc-state-";
/// See [`TEMP_PREFIX`].
const TEMP_SUFFIX: &str = ".tmp";
/// See [`TEMP_PREFIX`].
const TEMP_RAND_CHARS: usize = 6;
/// A temporary state file older than this is left by an interrupted save.
const STALE_TEMP_AGE: Duration = Duration::from_secs(60);

/// Why the state could not be loaded, locked or saved. One line naming the file.
#[derive(Debug)]
pub enum StoreError {
    /// Another process holds the lock; the holder's record when it could be read.
    Locked(PathBuf, Option<Box<Holder>>),
    /// A `run` loop owns the app (ConfigMap or ExecutorSet store: a holder record whose loop
    /// answers, or an older podalloc's fresh one); the message names it.
    Owned(String),
    /// The state belongs to another cluster, namespace or app (see [`Bound`]); the message
    /// names both.
    Mismatch(String),
    /// The file exists but is not a valid state (malformed JSON, unknown version, bad ids).
    Corrupt(PathBuf, String),
    /// An I/O error reading, writing or locking.
    Io(PathBuf, std::io::Error),
    /// The state or lock path exists and is not a regular file: the `&str` says what it is
    /// (`a symbolic link`, `a FIFO`, `a socket`, `a device`). Never followed, read or written.
    NotRegular(PathBuf, &'static str),
    /// Another instance wrote the state first (ConfigMap store: 409 Conflict on update).
    Conflict(String),
    /// The store's backend failed (ConfigMap store: the API call's error).
    Backend(String),
    /// The API server refused the store's read or write by RBAC (403): permanent until the
    /// Role is fixed (exit 4); the message names the object and the verb to grant.
    Forbidden(String),
}

/// What a store's home sets for one resource profile ([`StateStore::home_profiles`]).
#[derive(Debug, Default)]
pub struct HomeProfile {
    /// The profile's target, as [`StateStore::home_target`] is profile 0's; `None`: none.
    pub target: Option<u32>,
    /// The profile's executor pod template; `None`: the flags'.
    pub template: Option<crate::engine::podspec::PodTemplate>,
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
    /// Checks, before a `run` loop's tick, that no one else owns the app (ConfigMap store:
    /// the holder record; the file store holds its lock for the whole run, so it is always
    /// ours). Errors: [`StoreError::Owned`] naming the holder.
    fn claim(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Gives up a `run` loop's ownership when it stops cleanly (ConfigMap store: the holder
    /// record is removed, so the next loop may start at once; the file store's lock goes with
    /// the process). Errors: as [`StateStore::save`].
    fn release(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    /// The steering requests queued for the owner ([`crate::store::queue`]), oldest first, those
    /// already applied included (the tick leaves out the ids the state lists in
    /// `applied_requests`). Read after [`StateStore::load`]. Errors: as `load`.
    fn requests(&mut self) -> Result<Vec<Steering>, StoreError> {
        Ok(Vec::new())
    }
    /// After a save that records requests `ids` as applied: removes them from the queue
    /// (file store: their files; the ConfigMap store's save already dropped them). Returns
    /// the ids now gone from the queue, which the state then stops listing.
    fn consumed(&mut self, ids: &[String]) -> Vec<String> {
        ids.to_vec()
    }
    /// The target the store's home sets, as of the last [`StateStore::load`] (an ExecutorSet:
    /// clamp(`spec.replicas`, `spec.minReplicas`, `spec.maxReplicas`)). It already accounts
    /// for the removals [`StateStore::requests`] returns, so the tick follows it as
    /// [`crate::engine::alloc::TargetChange::Absolute`] over any seed. `None`: the store holds
    /// no target of its own (file, ConfigMap), or its home sets none yet.
    fn home_target(&mut self) -> Option<u32> {
        None
    }
    /// The executor pod template the store's home sets, as of the last load (an
    /// ExecutorSet's `spec.template`); `None`: the flags' (`--template`, `--image`).
    /// Errors: a template that cannot be used ([`StoreError::Mismatch`], exit 2).
    fn home_template(&self) -> Result<Option<crate::engine::podspec::PodTemplate>, StoreError> {
        Ok(None)
    }
    /// What the store's homes set for the resource profiles other than 0, by profile id, as
    /// of the last load (an ExecutorSet per profile: each one's clamped `spec.replicas` and
    /// its `spec.template`). Empty: none (file, ConfigMap: profile targets live in the
    /// state). Errors: as [`StateStore::home_template`].
    fn home_profiles(
        &mut self,
    ) -> Result<std::collections::BTreeMap<u32, HomeProfile>, StoreError> {
        Ok(std::collections::BTreeMap::new())
    }
    /// What the tick saw and decided, for a store that publishes it (an ExecutorSet's
    /// `status`); no I/O: the next save or [`StateStore::publish`] writes it.
    fn observe(
        &mut self,
        _summary: &crate::engine::alloc::Summary,
        _blocked: Option<&crate::engine::alloc::Blocked>,
    ) {
    }
    /// After the tick's saves: writes what [`StateStore::observe`] was given when it differs
    /// from what the home shows (one conditional write; none at rest). Errors: as `save`.
    fn publish(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    /// A cheap read of the home's intent, made by a loop at rest every `--interval`: whether
    /// it changed since the last load, so the loop ticks at once (an ExecutorSet: one GET,
    /// `metadata.generation` compared; a ConfigMap: one GET, `resourceVersion` compared).
    /// Default: nothing to read, `Ok(false)`. Errors: the
    /// read's (the loop logs it and reads again later).
    fn intent_changed(&mut self) -> Result<bool, StoreError> {
        Ok(false)
    }
    /// A change marker of the queue that costs no API call (file store: the queue
    /// directory's mtime), polled by an idle loop to wake at once; `None`: none is cheap.
    fn queue_marker(&self) -> Option<std::time::SystemTime> {
        None
    }
}

/// The [`StateStore`] methods named, each handing the call unchanged to the store in field
/// `$inner` (a `Box<dyn StateStore>`): for a store that wraps another and changes only some
/// of its methods ([`Bound`], the runner's phase watch), which it writes itself.
macro_rules! forward_to_inner {
    ($inner:ident: $($method:ident),+ $(,)?) => {
        $($crate::store::file::forward_to_inner!(@ $inner $method);)+
    };
    (@ $inner:ident describe) => {
        fn describe(&self) -> String {
            self.$inner.describe()
        }
    };
    (@ $inner:ident load) => {
        fn load(
            &mut self,
        ) -> ::std::result::Result<Option<$crate::engine::alloc::AllocatorState>, $crate::store::file::StoreError>
        {
            self.$inner.load()
        }
    };
    (@ $inner:ident claim) => {
        fn claim(&mut self) -> ::std::result::Result<(), $crate::store::file::StoreError> {
            self.$inner.claim()
        }
    };
    (@ $inner:ident release) => {
        fn release(&mut self) -> ::std::result::Result<(), $crate::store::file::StoreError> {
            self.$inner.release()
        }
    };
    (@ $inner:ident requests) => {
        fn requests(
            &mut self,
        ) -> ::std::result::Result<Vec<$crate::engine::alloc::Steering>, $crate::store::file::StoreError> {
            self.$inner.requests()
        }
    };
    (@ $inner:ident consumed) => {
        fn consumed(&mut self, ids: &[String]) -> Vec<String> {
            self.$inner.consumed(ids)
        }
    };
    (@ $inner:ident queue_marker) => {
        fn queue_marker(&self) -> Option<std::time::SystemTime> {
            self.$inner.queue_marker()
        }
    };
    (@ $inner:ident home_target) => {
        fn home_target(&mut self) -> Option<u32> {
            self.$inner.home_target()
        }
    };
    (@ $inner:ident home_template) => {
        fn home_template(
            &self,
        ) -> ::std::result::Result<Option<$crate::engine::podspec::PodTemplate>, $crate::store::file::StoreError>
        {
            self.$inner.home_template()
        }
    };
    (@ $inner:ident home_profiles) => {
        fn home_profiles(
            &mut self,
        ) -> ::std::result::Result<
            std::collections::BTreeMap<u32, $crate::store::file::HomeProfile>,
            $crate::store::file::StoreError,
        > {
            self.$inner.home_profiles()
        }
    };
    (@ $inner:ident observe) => {
        fn observe(
            &mut self,
            summary: &$crate::engine::alloc::Summary,
            blocked: Option<&$crate::engine::alloc::Blocked>,
        ) {
            self.$inner.observe(summary, blocked)
        }
    };
    (@ $inner:ident publish) => {
        fn publish(&mut self) -> ::std::result::Result<(), $crate::store::file::StoreError> {
            self.$inner.publish()
        }
    };
    (@ $inner:ident intent_changed) => {
        fn intent_changed(&mut self) -> ::std::result::Result<bool, $crate::store::file::StoreError> {
            self.$inner.intent_changed()
        }
    };
}
pub(crate) use forward_to_inner;

/// Reads a small regular file (at most 64 KiB) without following a link. Errors: one line.
pub(crate) fn read_small(path: &Path) -> Result<Vec<u8>, String> {
    let file = open_regular(path, OpenOptions::new().read(true)).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(64 * 1024)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(bytes)
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Locked(p, holder) => {
                write!(f, "another podalloc run holds the lock on {}", p.display())?;
                match holder {
                    Some(h) => write!(f, " ({h})")?,
                    None => f.write_str(" (its owner record is not readable yet)")?,
                }
                f.write_str("; this command did nothing (exit 3)")
            }
            StoreError::Owned(m) | StoreError::Mismatch(m) => f.write_str(m),
            StoreError::Corrupt(p, why) => write!(
                f,
                "state file {} is not a valid podalloc state ({why}); fix or move it away \
                 (ids resume from the cluster's highest executor id without it)",
                p.display()
            ),
            StoreError::Io(p, e) => write!(f, "state file {}: {e}", p.display()),
            StoreError::NotRegular(p, what) => write!(
                f,
                "{} is {what}, not a regular file; podalloc does not follow or open it (the state \
                 and its .lock must be regular files): remove it or choose another --state-file",
                p.display()
            ),
            StoreError::Conflict(m) | StoreError::Backend(m) | StoreError::Forbidden(m) => {
                f.write_str(m)
            }
        }
    }
}

impl std::error::Error for StoreError {}

/// Converts a state-store error into the CLI's: locked, owned or conflict → exit 3; corrupt,
/// not a regular file or another cluster's state → exit 2; I/O and backend → 1; refused by
/// RBAC → 4.
pub fn store_error(e: StoreError) -> crate::error::Error {
    use crate::error::Error;
    match e {
        StoreError::Locked(..) | StoreError::Conflict(_) | StoreError::Owned(_) => {
            Error::locked(e.to_string())
        }
        StoreError::Mismatch(_) => Error::usage(e.to_string()),
        StoreError::Backend(_) => Error::runtime(e.to_string()),
        StoreError::Forbidden(_) => Error::refused(e.to_string()),
        StoreError::Corrupt(..) | StoreError::NotRegular(..) => Error::usage(e.to_string()),
        StoreError::Io(..) => Error::runtime(e.to_string()),
    }
}

/// Reads and validates a state file. `Ok(None)` when the file does not exist.
///
/// Errors: [`StoreError::NotRegular`] for a link, FIFO, socket or device (never opened for
/// reading), [`StoreError::Corrupt`] for a directory, malformed JSON, duplicate keys or an
/// unknown version, [`StoreError::Io`].
pub fn load(path: &Path) -> Result<Option<AllocatorState>, StoreError> {
    check_regular(path)?;
    let mut file = match open_regular(path, OpenOptions::new().read(true)) {
        Ok(f) => f,
        Err(StoreError::Io(_, e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| StoreError::Io(path.to_owned(), e))?;
    parse(&bytes)
        .map(Some)
        .map_err(|why| StoreError::Corrupt(path.to_owned(), why))
}

/// Parses and validates state JSON bytes. Errors: one line saying what is wrong.
pub fn parse(bytes: &[u8]) -> Result<AllocatorState, String> {
    // A key twice in one object: serde_json keeps the last, another reader may keep the first.
    serde_json::from_slice::<NoDuplicateKeys>(bytes).map_err(|e| e.to_string())?;
    // Check the version before the shape, so a newer format gets the right message.
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    match v.get("version") {
        Some(serde_json::Value::Number(_)) => {}
        Some(_) => return Err("\"version\" is not a number".into()),
        None => return Err("no \"version\" field".into()),
    }
    let state: AllocatorState = serde_json::from_value(v).map_err(|e| e.to_string())?;
    state.validate()?;
    if state.last_executor_id > MAX_EXECUTOR_ID {
        return Err(format!(
            "last_executor_id {} is above the largest executor id {MAX_EXECUTOR_ID} \
             (Spark's executor ids are positive longs)",
            state.last_executor_id
        ));
    }
    Ok(state)
}

/// Any JSON document in which no object has a key twice; decoding fails with
/// `duplicate key "K"` (and the position) otherwise.
struct NoDuplicateKeys;

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeysVisitor)
    }
}

struct NoDuplicateKeysVisitor;

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeysVisitor {
    type Value = NoDuplicateKeys;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        while a.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(NoDuplicateKeys)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut seen = std::collections::BTreeSet::new();
        while let Some(key) = a.next_key::<String>()? {
            if seen.contains(&key) {
                let key: String = key.chars().take(64).collect();
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate key {key:?}"
                )));
            }
            a.next_value::<NoDuplicateKeys>()?;
            seen.insert(key);
        }
        Ok(NoDuplicateKeys)
    }
}

/// What a file type is, for [`StoreError::NotRegular`]; `None` for a regular file or a
/// directory (which has its own message).
fn irregular(t: fs::FileType) -> Option<&'static str> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a FIFO");
        }
        if t.is_socket() {
            return Some("a socket");
        }
        if t.is_block_device() || t.is_char_device() {
            return Some("a device");
        }
    }
    if t.is_symlink() {
        Some("a symbolic link")
    } else if t.is_file() || t.is_dir() {
        None
    } else {
        Some("not a file")
    }
}

/// What is at `path` when it is neither absent nor a regular file nor a directory
/// (`a symbolic link`, `a FIFO`, `a socket`, `a device`), without following a link.
///
/// Errors: the I/O error of `lstat(2)` other than "not found".
pub fn irregular_at(path: &Path) -> std::io::Result<Option<&'static str>> {
    match fs::symlink_metadata(path) {
        Ok(m) => Ok(irregular(m.file_type())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Refuses `path` when it exists and is not a regular file (without following a link).
fn check_regular(path: &Path) -> Result<(), StoreError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err(StoreError::Corrupt(
            path.to_owned(),
            "it is a directory; --state-file names a file".into(),
        )),
        Ok(m) => match irregular(m.file_type()) {
            Some(what) => Err(StoreError::NotRegular(path.to_owned(), what)),
            None => Ok(()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::Io(path.to_owned(), e)),
    }
}

/// Opens `path` with `opts` without following a final symbolic link and without blocking
/// on a FIFO (`O_NOFOLLOW | O_NONBLOCK`), then checks that what was opened is a regular file.
fn open_regular(path: &Path, opts: &mut OpenOptions) -> Result<File, StoreError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = match opts.open(path) {
        Ok(f) => f,
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(StoreError::NotRegular(path.to_owned(), "a symbolic link"))
        }
        Err(e) => return Err(StoreError::Io(path.to_owned(), e)),
    };
    let meta = file
        .metadata()
        .map_err(|e| StoreError::Io(path.to_owned(), e))?;
    if meta.is_dir() {
        return Err(StoreError::Corrupt(
            path.to_owned(),
            "it is a directory; --state-file names a file".into(),
        ));
    }
    match irregular(meta.file_type()) {
        Some(what) => Err(StoreError::NotRegular(path.to_owned(), what)),
        None => Ok(file),
    }
}

/// An open, locked state file: the only way to save. Dropping it releases the lock.
#[derive(Debug)]
pub struct LockedStore {
    path: PathBuf,
    _lock: File,
}

impl LockedStore {
    /// Takes the exclusive lock for `path` without waiting, creating the directory (0700) and
    /// the lock file as needed, then, the first time this process locks a state in that
    /// directory, removes stale temporary files of interrupted saves (see the module doc).
    ///
    /// Errors: [`StoreError::Locked`] when another process holds it,
    /// [`StoreError::NotRegular`] when the state or lock path is a link, FIFO, socket or
    /// device, [`StoreError::Io`].
    pub fn lock(path: &Path) -> Result<LockedStore, StoreError> {
        LockedStore::lock_as(path, &Holder::current("podalloc"), &SweptDirs::default())
    }

    /// [`LockedStore::lock`], then writes `holder` into the lock file, where a second process
    /// that finds the lock taken reads it ([`StoreError::Locked`] names the holder). The
    /// record outlives the process, but only a process holding the lock counts as the holder.
    ///
    /// The directory is swept of stale temporary files unless `swept` has swept it.
    ///
    /// Errors: as [`LockedStore::lock`].
    pub fn lock_as(
        path: &Path,
        holder: &Holder,
        swept: &SweptDirs,
    ) -> Result<LockedStore, StoreError> {
        check_regular(path)?;
        let io = |e| StoreError::Io(path.to_owned(), e);
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir {
            create_private_dir(dir).map_err(io)?;
        }
        let lock_path = lock_path(path);
        check_regular(&lock_path)?;
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let file = open_regular(&lock_path, &mut opts)?;
        match file.try_lock() {
            Ok(()) => {
                write_holder(&file, holder).map_err(|e| StoreError::Io(lock_path.clone(), e))?;
                swept.sweep_once(dir.unwrap_or(Path::new(".")));
                Ok(LockedStore {
                    path: path.to_owned(),
                    _lock: file,
                })
            }
            Err(TryLockError::WouldBlock) => {
                let holder = read_holder(&lock_path).map(Box::new);
                Err(StoreError::Locked(lock_path, holder))
            }
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
            .prefix(TEMP_PREFIX)
            .rand_bytes(TEMP_RAND_CHARS)
            .suffix(TEMP_SUFFIX)
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

/// True for a name of our temporary state files (see [`TEMP_PREFIX`]).
fn is_temp_name(name: &std::ffi::OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    name.strip_prefix(TEMP_PREFIX)
        .and_then(|rest| rest.strip_suffix(TEMP_SUFFIX))
        .is_some_and(|r| r.len() == TEMP_RAND_CHARS && r.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The directories a process has swept of stale temporary state files, so that each is
/// swept at its first lock only ([`LockedStore::lock_as`]). A temporary file is only left by
/// a process killed while saving, so one sweep per directory and process finds them all;
/// sweeping at every lock read the whole directory once per app, which made `apps` with
/// 1,000 state files in one directory read 1,000 directories of 2,000 entries at start
/// (O(apps²)). The process's services own one; a fresh one sweeps again.
#[derive(Debug, Default)]
pub struct SweptDirs(std::cell::RefCell<std::collections::BTreeSet<PathBuf>>);

impl SweptDirs {
    /// [`remove_stale_temp_files`] in `dir`, unless this set has swept it.
    fn sweep_once(&self, dir: &Path) {
        let key = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
        let first = self.0.borrow_mut().insert(key);
        if first {
            remove_stale_temp_files(dir);
        }
    }
}

/// Best effort: removes our temporary state files in `dir` older than [`STALE_TEMP_AGE`]
/// (regular files, owned by this user), logging each; errors are logged at debug level.
fn remove_stale_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !is_temp_name(&entry.file_name()) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        #[cfg(unix)]
        let ours = {
            use std::os::unix::fs::MetadataExt;
            meta.uid() == rustix::process::geteuid().as_raw()
        };
        #[cfg(not(unix))]
        let ours = true;
        let stale = meta
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_TEMP_AGE);
        if !(meta.file_type().is_file() && ours && stale) {
            continue;
        }
        match fs::remove_file(&path) {
            Ok(()) => log::info!(
                "removed {}, a temporary state file left by an interrupted save",
                path.display()
            ),
            Err(e) => log::debug!("cannot remove the stale {}: {e}", path.display()),
        }
    }
}

/// A state store bound to one cluster, namespace and app: loading a state recorded for
/// another one is a [`StoreError::Mismatch`] (exit 2) naming both, never a silent reuse;
/// saving records `owner` in the state ([`AllocatorState::owner`]). A state without the
/// record (written by an older podalloc) is accepted and gets it at the next save.
pub struct Bound<'a> {
    inner: Box<dyn StateStore + 'a>,
    owner: StateOwner,
    check_server: bool,
}

impl<'a> Bound<'a> {
    /// Binds `inner` to `owner`. `check_server`: compare the API server URL too (the file
    /// store; a ConfigMap lives in its cluster, which may be reached by several URLs).
    pub fn new(inner: Box<dyn StateStore + 'a>, owner: StateOwner, check_server: bool) -> Self {
        Bound {
            inner,
            owner,
            check_server,
        }
    }
}

/// Checks that `state` belongs to `want` (see [`Bound`]); `what` names the store.
///
/// Errors: [`StoreError::Mismatch`] naming both owners.
pub fn check_owner(
    state: &AllocatorState,
    want: &StateOwner,
    check_server: bool,
    what: &str,
) -> Result<(), StoreError> {
    let Some(have) = &state.owner else {
        return Ok(());
    };
    let same = (!check_server || have.server == want.server)
        && have.namespace == want.namespace
        && have.app_id == want.app_id;
    if same {
        return Ok(());
    }
    let show = |o: &StateOwner| {
        format!(
            "server {} namespace {} app {}",
            o.server.chars().take(200).collect::<String>(),
            o.namespace.chars().take(80).collect::<String>(),
            o.app_id.chars().take(80).collect::<String>()
        )
    };
    Err(StoreError::Mismatch(format!(
        "{what} belongs to {}, but this command is connected to {}; never reusing another \
         cluster's state: give this cluster its own --state-file (or --state-store), or move \
         the file away if it is really stale",
        show(have),
        show(want)
    )))
}

impl StateStore for Bound<'_> {
    fn load(&mut self) -> Result<Option<AllocatorState>, StoreError> {
        let state = self.inner.load()?;
        if let Some(st) = &state {
            check_owner(st, &self.owner, self.check_server, &self.inner.describe())?;
        }
        Ok(state)
    }
    fn save(&mut self, state: &AllocatorState) -> Result<(), StoreError> {
        if state.owner.as_ref() == Some(&self.owner) {
            return self.inner.save(state);
        }
        let mut st = state.clone();
        st.owner = Some(self.owner.clone());
        self.inner.save(&st)
    }
    forward_to_inner!(inner: describe, claim, release, requests, consumed, queue_marker,
        home_target, home_template, home_profiles, observe, publish, intent_changed);
}

/// Who holds a state: the command, host, process id and since when. Written into the lock
/// file by the file store, and by a `run` loop into an annotation of the ConfigMap store and
/// into `status.holder` of the ExecutorSet store, once per claim (never renewed: whether it
/// lives is asked on demand, `crate::store::liveness`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    /// The podalloc command (`run`, `reconcile`, …).
    pub command: String,
    /// The host name (`gethostname(2)`; `unknown` when it cannot be read).
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// When the holder started, RFC 3339 UTC (for people).
    pub since: String,
    /// When the holder started, ms since the Unix epoch (to tell two holders apart).
    #[serde(default)]
    pub since_ms: u64,
    /// When the record was last renewed, ms since the Unix epoch: read only, in the
    /// records of an older podalloc that renewed them (with `stale_after_s` and no answer
    /// deadline, judged by their age).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_ms: Option<u64>,
    /// An older podalloc's renewed record is stale after this many seconds (read only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_after_s: Option<u64>,
    /// How long a process that pings this holder waits for its pong, in ms (3 × its
    /// `--interval` + 2 s; in-cluster homes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_within_ms: Option<u64>,
    /// The holder's PID namespace (`/proc/self/ns/pid`, e.g. `pid:[4026531836]`), so that
    /// its pid is looked up only from the same namespace: two containers may share a host
    /// name (hostNetwork, `spec.hostname`) but not their pids. `None` where it cannot be
    /// read, and in older records: their pid says nothing (the holder is asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<String>,
}

impl Holder {
    /// This process as the holder, for `command`, starting now.
    pub fn current(command: &str) -> Holder {
        let now = std::time::SystemTime::now();
        Holder {
            command: command.to_string(),
            host: hostname(),
            pid: std::process::id(),
            since: humantime::format_rfc3339_seconds(now).to_string(),
            since_ms: now
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            renewed_ms: None,
            stale_after_s: None,
            answer_within_ms: None,
            pid_ns: pid_namespace(),
        }
    }

    /// The same process and start as `other` (renewals aside).
    pub fn same(&self, other: &Holder) -> bool {
        self.host == other.host && self.pid == other.pid && self.since_ms == other.since_ms
    }
}

/// This process's PID namespace, as `/proc/self/ns/pid` names it; `None` where it cannot
/// be read (not Linux, no /proc).
pub(crate) fn pid_namespace() -> Option<String> {
    std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let clean = |s: &str| -> String {
            s.chars()
                .filter(|c| !c.is_control())
                .take(100)
                .collect::<String>()
        };
        write!(
            f,
            "held by `podalloc {}` on host {}, pid {}, since {}",
            clean(&self.command),
            clean(&self.host),
            self.pid,
            clean(&self.since)
        )
    }
}

/// The host name, or `unknown`.
pub fn hostname() -> String {
    let uname = rustix::system::uname();
    match uname.nodename().to_string_lossy().trim() {
        "" => "unknown".to_string(),
        h => h.to_string(),
    }
}

/// Replaces the lock file's content with `holder` as one JSON line.
fn write_holder(mut file: &File, holder: &Holder) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut line = serde_json::to_vec(holder).expect("holder serializes");
    line.push(b'\n');
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&line)
}

/// The holder record in a lock file; `None` when absent (being written) or unreadable.
fn read_holder(lock_path: &Path) -> Option<Holder> {
    let mut file = open_regular(lock_path, OpenOptions::new().read(true)).ok()?;
    let mut text = String::new();
    (&mut file).take(4096).read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}

/// The process holding the lock of state file `path` now, found without taking the lock
/// (a read-only `status` must never make a starting loop fail with exit 3): the lock file's
/// holder record, when Linux's `/proc/locks` lists an `flock(2)` on that very file (device
/// and inode). `None` when the lock is free, when there is no readable record, or where
/// `/proc/locks` does not exist.
pub fn lock_holder(path: &Path) -> Option<Holder> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let lock = lock_path(path);
        let meta = fs::symlink_metadata(&lock).ok()?;
        let table = fs::read_to_string("/proc/locks").ok()?;
        let held = (table.lines()).any(|l| flock_on(l, meta.dev(), meta.ino()));
        held.then(|| read_holder(&lock)).flatten()
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        None
    }
}

/// Whether one `/proc/locks` line (`1: FLOCK  ADVISORY  WRITE 1234 fe:00:5357728 0 EOF`:
/// kind, pid, then the device's major:minor in hex and the inode in decimal) is a granted
/// flock on the file of device `dev` (as `st_dev` encodes it) and inode `ino`. Waiters'
/// lines (`1: -> FLOCK …`) are not locks held.
fn flock_on(line: &str, dev: u64, ino: u64) -> bool {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.get(1) != Some(&"FLOCK") {
        return false;
    }
    let Some(mut id) = f.get(5).map(|d| d.split(':')) else {
        return false;
    };
    let (major, minor) = (
        (dev >> 8) & 0xfff | (dev >> 32) & !0xfff,
        dev & 0xff | (dev >> 12) & !0xff,
    );
    let hex = |s: Option<&str>| s.and_then(|s| u64::from_str_radix(s, 16).ok());
    hex(id.next()) == Some(major)
        && hex(id.next()) == Some(minor)
        && id.next().and_then(|s| s.parse().ok()) == Some(ino)
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

/// The default state file for an app of the cluster at `server`:
/// `$XDG_STATE_HOME/podalloc/<cluster>/<namespace>/<app id>.json` (else under
/// `~/.local/state`, else `./.podalloc`), where `<cluster>` is the server's host, port and
/// path with every other character made `_` (`https://10.0.0.1:6443` → `10.0.0.1_6443`).
/// So another kubeconfig context, or a restarted simulator, never finds a state file bound
/// to another server at its default path.
///
/// A state file at the path of earlier versions (no `<cluster>`), bound to this very server,
/// namespace and app, is used where it is (and said once), so nothing it holds — the ids
/// handed out, the target, queued requests — is lost; one of another server is left alone.
pub fn default_path_for(server: &str, namespace: &str, app_id: &str) -> PathBuf {
    default_path_in(&state_base(), server, namespace, app_id)
}

/// [`default_path_for`] under `base` (`<state base>`).
fn default_path_in(base: &Path, server: &str, namespace: &str, app_id: &str) -> PathBuf {
    let cluster: String = server
        .split_once("://")
        .map_or(server, |(_, rest)| rest)
        .trim_end_matches('/')
        .chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                true => c,
                false => '_',
            },
        )
        .collect();
    let path = base
        .join(&cluster)
        .join(namespace)
        .join(format!("{app_id}.json"));
    let legacy = base.join(namespace).join(format!("{app_id}.json"));
    if !path.exists() && legacy.is_file() {
        let ours = load(&legacy)
            .ok()
            .flatten()
            .and_then(|st| st.owner)
            .is_some_and(|o| {
                o.server.trim_end_matches('/') == server.trim_end_matches('/')
                    && o.namespace == namespace
                    && o.app_id == app_id
            });
        if ours {
            log::info!(
                "using the state file at its former default path {} (this cluster's; new ones \
                 go under {})",
                legacy.display(),
                base.join(&cluster).display()
            );
            return legacy;
        }
    }
    path
}

/// `$XDG_STATE_HOME/podalloc`, else `~/.local/state/podalloc`, else `./.podalloc/podalloc`.
fn state_base() -> PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".local").join("state"))
        })
        .unwrap_or_else(|| PathBuf::from(".podalloc"))
        .join("podalloc")
}

/// The default state file of earlier versions: `<state base>/<namespace>/<app id>.json`
/// (see [`default_path_for`], which supersedes it).
pub fn default_path(namespace: &str, app_id: &str) -> PathBuf {
    state_base().join(namespace).join(format!("{app_id}.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_holder_names_the_process_holding_the_lock_and_none_once_released() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.json");
        assert!(lock_holder(&path).is_none(), "no lock file yet");
        let held =
            LockedStore::lock_as(&path, &Holder::current("run"), &SweptDirs::default()).unwrap();
        let h = lock_holder(&path).expect("held by this process");
        assert_eq!((h.command.as_str(), h.pid), ("run", std::process::id()));
        drop(held);
        assert!(
            lock_holder(&path).is_none(),
            "released: the record stays, the lock does not"
        );
    }

    #[test]
    fn proc_locks_lines_are_matched_by_device_and_inode() {
        // st_dev of major 0xfe, minor 0: 0xfe00.
        let line = "3: FLOCK  ADVISORY  WRITE 22281 fe:00:5357728 0 EOF";
        assert!(flock_on(line, 0xfe00, 5357728));
        assert!(!flock_on(line, 0xfe00, 5357729));
        assert!(!flock_on(line, 0xfe01, 5357728));
        assert!(!flock_on(
            "3: -> FLOCK  ADVISORY  WRITE 1 fe:00:5357728 0 EOF",
            0xfe00,
            5357728
        ));
        assert!(!flock_on(
            "1: OFDLCK ADVISORY  WRITE -1 fe:00:5357728 0 EOF",
            0xfe00,
            5357728
        ));
        // Major 8, minor 0x103 (st_dev keeps a minor's bits above the low byte from bit 20).
        let dev: u64 = 0x08 << 8 | 0x03 | 0x100 << 12;
        assert!(flock_on(
            "1: FLOCK  ADVISORY  WRITE 9 08:103:42 0 EOF",
            dev,
            42
        ));
    }
    use crate::engine::alloc::Unacknowledged;

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
            profile: 0,
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
            Err(StoreError::Locked(..))
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

    #[test]
    fn the_default_path_is_per_cluster_and_a_former_one_of_this_cluster_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        let (a, b) = ("https://10.0.0.1:6443", "https://api.example.com/k8s/c-1/");
        let pa = default_path_in(base, a, "ns", "app");
        assert!(
            pa.ends_with("10.0.0.1_6443/ns/app.json"),
            "{}",
            pa.display()
        );
        let pb = default_path_in(base, b, "ns", "app");
        assert!(
            pb.ends_with("api.example.com_k8s_c-1/ns/app.json"),
            "{}",
            pb.display()
        );
        // A state file at the former path, bound to cluster a: a keeps using it, b does not.
        let legacy = base.join("ns/app.json");
        let mut st = AllocatorState::new();
        st.owner = Some(crate::engine::alloc::StateOwner {
            server: a.into(),
            namespace: "ns".into(),
            app_id: "app".into(),
        });
        LockedStore::lock(&legacy).unwrap().save(&st).unwrap();
        assert_eq!(default_path_in(base, a, "ns", "app"), legacy);
        assert_eq!(default_path_in(base, b, "ns", "app"), pb);
        assert_eq!(
            default_path_in(base, a, "ns", "other"),
            base.join("10.0.0.1_6443/ns/other.json")
        );
    }

    #[test]
    fn duplicate_keys_are_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.json");
        for (body, key) in [
            (r#"{"version": 1, "target": 5, "target": 0}"#, "target"),
            (r#"{"version": 1, "version": 1}"#, "version"),
            (
                r#"{"version": 1, "last_executor_id": 3, "unacknowledged": [{"executor_id": 3, "created_ms": 0, "created_ms": 9}]}"#,
                "created_ms",
            ),
        ] {
            fs::write(&path, body).unwrap();
            let msg = load(&path).unwrap_err().to_string();
            assert!(
                msg.contains("app.json") && msg.contains(&format!("duplicate key \"{key}\"")),
                "{body}: {msg}"
            );
        }
    }

    #[test]
    fn ids_above_the_executor_id_range_are_refused() {
        let e = parse(br#"{"version": 1, "last_executor_id": 18446744073709551615}"#).unwrap_err();
        assert!(
            e.contains("above the largest executor id 9223372036854775807"),
            "{e}"
        );
        assert!(parse(br#"{"version": 1, "last_executor_id": 9223372036854775807}"#).is_ok());
    }

    #[cfg(unix)]
    fn mkfifo(path: &Path) {
        let mode = rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR;
        rustix::fs::mknodat(rustix::fs::CWD, path, rustix::fs::FileType::Fifo, mode, 0).unwrap();
    }

    /// A link at the state or lock path is refused, not followed: its target is never
    /// written (an earlier version wrote through a linked state file).
    #[cfg(unix)]
    #[test]
    fn symlinked_state_or_lock_is_refused_and_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let path = dir.path().join("app.json");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let e = LockedStore::lock(&path).unwrap_err();
        assert!(
            matches!(e, StoreError::NotRegular(_, "a symbolic link")),
            "{e}"
        );
        assert!(e.to_string().contains("app.json is a symbolic link"), "{e}");
        assert!(load(&path)
            .unwrap_err()
            .to_string()
            .contains("symbolic link"));
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, lock_path(&path)).unwrap();
        let e = LockedStore::lock(&path).unwrap_err();
        assert!(
            e.to_string().contains("app.json.lock is a symbolic link"),
            "{e}"
        );
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        // A dangling link is refused too (it would create its target).
        let path = dir.path().join("other.json");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &path).unwrap();
        assert!(matches!(
            LockedStore::lock(&path),
            Err(StoreError::NotRegular(..))
        ));
        assert!(!dir.path().join("nowhere").exists());
    }

    /// A FIFO at the state or lock path is refused at once: never opened for a blocking read.
    #[cfg(unix)]
    #[test]
    fn fifo_state_or_lock_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.json");
        mkfifo(&path);
        let e = load(&path).unwrap_err();
        assert!(e.to_string().contains("app.json is a FIFO"), "{e}");
        assert!(matches!(
            LockedStore::lock(&path),
            Err(StoreError::NotRegular(_, "a FIFO"))
        ));
        // The open itself never blocks either (O_NONBLOCK), should the check be raced.
        let e = open_regular(&path, OpenOptions::new().read(true)).unwrap_err();
        assert!(matches!(e, StoreError::NotRegular(_, "a FIFO")), "{e}");
        let path = dir.path().join("b.json");
        mkfifo(&lock_path(&path));
        let e = LockedStore::lock(&path).unwrap_err();
        assert!(e.to_string().contains("b.json.lock is a FIFO"), "{e}");
        let e = load(Path::new("/dev/null")).unwrap_err();
        assert!(e.to_string().contains("is a device"), "{e}");
        assert_eq!(
            crate::store::file::store_error(e).code,
            crate::error::ExitCode::Usage
        );
    }

    /// The sweep reads the directory once per process: a second app's lock in it does not.
    #[test]
    fn a_directory_is_swept_at_its_first_lock_only() {
        let dir = tempfile::tempdir().unwrap();
        let (swept, holder) = (SweptDirs::default(), Holder::current("apps"));
        let _first = LockedStore::lock_as(&dir.path().join("a.json"), &holder, &swept).unwrap();
        let stale = dir.path().join(".podalloc-state-q1W2e3.tmp");
        let f = File::create(&stale).unwrap();
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
            .unwrap();
        let _second = LockedStore::lock_as(&dir.path().join("b.json"), &holder, &swept).unwrap();
        assert!(stale.exists(), "not swept again");
    }

    #[test]
    fn stale_temp_files_of_ours_are_removed_on_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.json");
        let old = std::time::SystemTime::now() - Duration::from_secs(120);
        let mk = |name: &str, age: Option<std::time::SystemTime>| {
            let p = dir.path().join(name);
            let f = File::create(&p).unwrap();
            if let Some(t) = age {
                f.set_modified(t).unwrap();
            }
            p
        };
        let stale = mk(".podalloc-state-a1B2c3.tmp", Some(old));
        let fresh = mk(".podalloc-state-Zz9yX8.tmp", None);
        let other = mk(".podalloc-state-toolong1.tmp", Some(old));
        let metrics = mk(".podalloc-metrics-a1B2c3.tmp", Some(old));
        let mine = mk("notes.tmp", Some(old));
        let store = LockedStore::lock(&path).unwrap();
        assert!(!stale.exists());
        for kept in [&fresh, &other, &metrics, &mine] {
            assert!(kept.exists(), "{}", kept.display());
        }
        // Our own saves use that pattern.
        store.save(&AllocatorState::new()).unwrap();
        assert!(is_temp_name(std::ffi::OsStr::new(
            ".podalloc-state-a1B2c3.tmp"
        )));
        assert!(!is_temp_name(std::ffi::OsStr::new(
            ".podalloc-state-a1B2c.tmp"
        )));
    }
}
