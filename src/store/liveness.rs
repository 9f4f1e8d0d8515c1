//! Who owns an in-cluster home (a state ConfigMap, an ExecutorSet) without a heartbeat.
//!
//! A `run` loop without `--leader-elect` writes its holder record ([`Holder`]) once, when it
//! claims the home, and never renews it: at rest it writes nothing. Whether the holder still
//! lives is asked on demand, by whoever finds its record and would act:
//!
//! - **ping**: a process that finds another holder's record (one that is not ours, not of a
//!   process gone from this host) writes a [`Ping`] (a nonce) on the home, conditional on the
//!   `resourceVersion` it read;
//! - **pong**: the holder's loop reads its home every `--interval` at rest (the intent read)
//!   and at every tick; when the home carries a ping it has not answered, it writes the
//!   ping's nonce as the pong (conditionally) and goes on. Neither counts as intent: they
//!   wake no tick;
//! - **verdict**: the asking process reads the home again; the pong within the holder's
//!   answer deadline ([`Holder::answer_within_ms`], 3 × its interval + 2 s + its tick budget) says it lives (a
//!   standby keeps waiting and asks again after [`PING_PERIOD`]; a one-shot command refuses,
//!   exit 3); no pong by then says it is dead: a loop takes the home over with a conditional
//!   write of its own record (a 409: someone else was first, read again).
//!
//! A ping already on the home and not answered is adopted rather than replaced, so two
//! standbys never hide each other's question. A record written by an older podalloc that
//! renewed it (`stale_after_s`, no answer deadline: it cannot answer) is judged by its age
//! as before.

use crate::kube::KubeError;
use crate::store::file::{Holder, StoreError};
use serde_json::Value;
use std::cell::RefCell;
use std::time::{Duration, Instant};

/// How long a standby that saw the holder answer waits before it asks again.
pub(crate) const PING_PERIOD: Duration = Duration::from_secs(30);

/// The answer deadline of a record that names none: 3 × 10 s + 2 s.
const DEFAULT_ANSWER: Duration = Duration::from_secs(32);

/// How often a one-shot command reads the home again while it waits for a pong.
const ASK_POLL: Duration = Duration::from_millis(100);

/// A question to a holder: does it live? Written on its home by the asking process.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Ping {
    /// What the holder writes back as its pong.
    pub(crate) nonce: String,
    /// Who asks (host and pid), for people.
    #[serde(default)]
    pub(crate) by: String,
}

impl Ping {
    /// A new question from this process.
    pub(crate) fn new() -> Ping {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let pid = std::process::id();
        Ping {
            nonce: format!("{pid}-{ns}"),
            by: format!("{} pid {pid}", crate::store::file::hostname()),
        }
    }
}

/// The answer deadline a loop reading its home every `interval` puts in its record, in ms:
/// 3 × `interval` (at least 1 s) + 2 s + `busy`, the longest its tick may keep it from
/// reading its home (the tick budget, 4 × `--request-timeout`: a loop answers between
/// ticks, so a holder inside a tick that calls a slow server must not be taken for dead
/// while a create of that tick may still land: two actors, a removed executor back).
pub(crate) fn answer_within_ms(interval: Duration, busy: Duration) -> u64 {
    let ms = interval.as_millis().max(1000) as u64;
    3 * ms + 2000 + busy.as_millis() as u64
}

/// How long a process waits for `h`'s pong before it takes `h` as dead.
pub(crate) fn deadline_of(h: &Holder) -> Duration {
    h.answer_within_ms
        .map_or(DEFAULT_ANSWER, Duration::from_millis)
}

/// What a process makes of the holder record on a home, without asking.
#[derive(Debug)]
pub(crate) enum Found {
    /// No record, or one nobody holds any more (the reason, for a log line: its process is
    /// gone from this host, or an old-style record went stale).
    Free(Option<String>),
    /// This process's own record.
    Ours,
    /// Another process's record that looks live: ask it ([`Asker`]).
    Other(Holder),
    /// An older podalloc's renewed record, still fresh: live, no question needed.
    Renewed(Holder, u64),
}

/// Judges the record `text` (JSON [`Holder`]; `None`: absent) against `mine` (a loop's own
/// record; `None`: a one-shot command's). An unreadable record counts as none.
pub(crate) fn judge(text: Option<&str>, mine: Option<&Holder>, what: &str) -> Found {
    let Some(text) = text else {
        return Found::Free(None);
    };
    let Ok(theirs) = serde_json::from_str::<Holder>(text) else {
        log::warn!("{what}: unreadable holder record ignored");
        return Found::Free(None);
    };
    judge_holder(theirs, mine)
}

/// [`judge`] of a parsed record.
pub(crate) fn judge_holder(theirs: Holder, mine: Option<&Holder>) -> Found {
    if mine.is_some_and(|m| m.same(&theirs)) {
        return Found::Ours;
    }
    if holder_gone(&theirs) {
        return Found::Free(Some(format!(
            "an owner whose process is gone ({theirs}: no such process on this host)"
        )));
    }
    // A record that names an answer deadline is asked; only an older podalloc's record
    // (renewed, no answer deadline) is judged by its age.
    if let Some(stale) = theirs
        .stale_after_s
        .filter(|_| theirs.answer_within_ms.is_none())
    {
        let renewed = theirs.renewed_ms.unwrap_or(theirs.since_ms);
        let age = crate::clock::now_ms().saturating_sub(renewed) / 1000;
        return match age > stale {
            true => Found::Free(Some(format!(
                "a stale owner ({theirs}; last renewed {age}s ago)"
            ))),
            false => Found::Renewed(theirs, age),
        };
    }
    Found::Other(theirs)
}

/// Whether the process of holder record `h` is gone: it ran on this host, in this PID
/// namespace, and no process has its pid (`kill(pid, 0)` answers ESRCH). A holder on
/// another host, or in another PID namespace (another container with the same host name:
/// its pid means nothing here), or whose record names no namespace, is never gone by this
/// test (it is asked instead).
pub(crate) fn holder_gone(h: &Holder) -> bool {
    let ours = crate::store::file::pid_namespace();
    if h.host != crate::store::file::hostname() || h.pid == 0 || ours.is_none() || h.pid_ns != ours
    {
        return false;
    }
    let Some(pid) = i32::try_from(h.pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    // Signal 0 sends nothing: it only asks whether the process exists.
    rustix::process::test_kill_process(pid) == Err(rustix::io::Errno::SRCH)
}

/// [`StoreError::Owned`]: home `what` is held by live holder `who`.
pub(crate) fn owned(what: &str, who: &str) -> StoreError {
    StoreError::Owned(format!(
        "{what} is owned by a running loop: {who}; this command did nothing (exit 3): stop \
         that loop first"
    ))
}

/// Sets `set`'s keys in the JSON object `map` (made one when it is not), removing those
/// set to `None`: a home's holder, ping and pong fields before one conditional write.
pub(crate) fn set_keys(map: &mut serde_json::Value, set: &[(&str, Option<serde_json::Value>)]) {
    if !map.is_object() {
        *map = serde_json::json!({});
    }
    let m = map.as_object_mut().expect("an object");
    for (k, v) in set {
        match v {
            Some(v) => m.insert((*k).to_string(), v.clone()),
            None => m.remove(*k),
        };
    }
}

/// The nonce the holder should answer now: the home's ping when its pong is not that nonce.
pub(crate) fn pong_due(ping: Option<&Ping>, pong: Option<&str>) -> Option<String> {
    ping.filter(|p| pong != Some(p.nonce.as_str()))
        .map(|p| p.nonce.clone())
}

/// What an asking process does next ([`Asker::next`]).
#[derive(Debug)]
pub(crate) enum Next {
    /// The holder answered: it lives (the message says when).
    Alive(String),
    /// A question is out, not answered yet, its deadline not passed.
    Waiting(String),
    /// Write this ping on the home (conditionally), then [`Asker::sent`].
    Ping(Ping),
    /// No answer within the deadline: the holder is dead, take over.
    Dead(String),
}

/// A process's question to one holder, kept between its reads of the home.
#[derive(Debug, Default)]
pub(crate) struct Asker {
    /// The nonce being waited for, whose holder (`since_ms`, pid, host) and since when.
    asked: Option<(String, Holder, Instant)>,
    /// The holder that answered last, and when.
    answered: Option<(Holder, Instant)>,
}

impl Asker {
    /// The next step about holder `theirs`, from the home's `ping` and `pong` as just read.
    pub(crate) fn next(
        &mut self,
        theirs: &Holder,
        ping: Option<&Ping>,
        pong: Option<&str>,
    ) -> Next {
        if self.asked.as_ref().is_some_and(|(_, h, _)| !h.same(theirs)) {
            self.asked = None;
        }
        let answered_now = ping.is_some_and(|p| pong == Some(p.nonce.as_str()));
        if let Some((nonce, _, at)) = &self.asked {
            // Our question, or one that replaced it (asked later), answered: alive.
            if answered_now {
                let ms = at.elapsed().as_millis();
                self.answered = Some((theirs.clone(), Instant::now()));
                self.asked = None;
                return Next::Alive(format!("it answered a ping within {ms} ms"));
            }
            let deadline = deadline_of(theirs);
            if at.elapsed() >= deadline {
                let nonce = nonce.clone();
                self.asked = None;
                return Next::Dead(format!(
                    "an owner that did not answer ({theirs}: no answer to ping {nonce} within \
                     {} ms)",
                    deadline.as_millis()
                ));
            }
            let nonce = ping.map_or_else(|| nonce.clone(), |p| p.nonce.clone());
            let at = *at;
            self.asked = Some((nonce.clone(), theirs.clone(), at));
            return Next::Waiting(format!(
                "asked whether it lives (ping {nonce}, {} ms ago; it answers within {} ms)",
                at.elapsed().as_millis(),
                deadline.as_millis()
            ));
        }
        if let Some(p) = ping.filter(|_| !answered_now) {
            // Someone's question is out: wait for its answer rather than replace it.
            self.asked = Some((p.nonce.clone(), theirs.clone(), Instant::now()));
            return Next::Waiting(format!("a ping ({}) is waiting for its answer", p.nonce));
        }
        if let Some((h, at)) = &self.answered {
            if h.same(theirs) && at.elapsed() < PING_PERIOD {
                return Next::Alive(format!(
                    "it answered a ping {}s ago",
                    at.elapsed().as_secs()
                ));
            }
        }
        Next::Ping(Ping::new())
    }

    /// Ping `p` to holder `theirs` was written on the home.
    pub(crate) fn sent(&mut self, p: &Ping, theirs: &Holder) {
        self.asked = Some((p.nonce.clone(), theirs.clone(), Instant::now()));
    }
}

/// What a home carries about its holder, as one read saw it.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The holder record (JSON), if any.
    pub(crate) holder: Option<String>,
    pub(crate) ping: Option<Ping>,
    pub(crate) pong: Option<String>,
}

/// A one-shot command's question to `theirs`, waited for: `read` reads the home again
/// (`None`: it is gone), `ping` writes a ping on the last object read (`Ok(false)`: a 409).
/// Returns `Ok(Err(message))` when the holder answered (it lives), `Ok(Ok(why))` when it
/// did not answer within its deadline or gave the home up (`why`: for a log line).
/// Errors: `read`'s and `ping`'s.
pub(crate) fn ask_waiting<E>(
    mut theirs: Holder,
    mut read: impl FnMut() -> Result<Option<Seen>, E>,
    mut ping: impl FnMut(&Ping) -> Result<bool, E>,
) -> Result<Result<Option<String>, String>, E> {
    let mut asker = Asker::default();
    loop {
        let Some(seen) = read()? else {
            return Ok(Ok(None));
        };
        match seen.holder.as_deref().map(serde_json::from_str::<Holder>) {
            Some(Ok(h)) if h.same(&theirs) => {}
            Some(Ok(h)) => match judge_holder(h, None) {
                Found::Other(h) => {
                    theirs = h;
                    asker = Asker::default();
                }
                Found::Renewed(h, age) => {
                    return Ok(Err(format!("{h} (renewed {age}s ago)")));
                }
                Found::Free(why) => return Ok(Ok(why)),
                Found::Ours => return Ok(Ok(None)),
            },
            _ => return Ok(Ok(None)),
        }
        match asker.next(&theirs, seen.ping.as_ref(), seen.pong.as_deref()) {
            Next::Alive(how) => return Ok(Err(format!("{theirs} ({how})"))),
            Next::Dead(why) => return Ok(Ok(Some(why))),
            Next::Waiting(_) => std::thread::sleep(ASK_POLL),
            Next::Ping(p) => {
                if ping(&p)? {
                    asker.sent(&p, &theirs);
                }
            }
        }
    }
}

/// How a command treats the holder record on its home.
pub(crate) enum Mode {
    /// Read-only commands (on an ExecutorSet, the steering writes too): the record is ignored.
    Read,
    /// One-shot commands (on an ExecutorSet, `run --leader-elect` too, whose Lease says who
    /// acts): a live holder of anyone is an error; `ping`: it is asked (and waited for)
    /// first, else a record that looks live is taken as live (the steering commands on a
    /// ConfigMap, which then wait for the loop to take their request).
    Once { ping: bool },
    /// A `run` loop: a live holder of someone else makes it a standby; its own record is
    /// written once, when it claims the home.
    Loop(Holder),
}

impl Mode {
    /// A `run` loop's, reading its home every `interval`: `holder` with its answer deadline
    /// (3 × `interval` + 2 s + `busy`, the tick budget), and no renewal fields (an older
    /// podalloc's).
    pub(crate) fn looping(mut holder: Holder, (interval, busy): (Duration, Duration)) -> Mode {
        holder.answer_within_ms = Some(answer_within_ms(interval, busy));
        holder.stale_after_s = None;
        holder.renewed_ms = None;
        Mode::Loop(holder)
    }
}

/// The holder record `text` (JSON; `None`: absent) of a `kind` home when it looks live (not
/// asked: not of a process gone from this host, not an older podalloc's stale one), for
/// `status` and the search for the app's home.
pub(crate) fn looks_live(text: Option<&str>, kind: &str) -> Option<Holder> {
    match judge(text, None, kind) {
        Found::Other(h) | Found::Renewed(h, _) => Some(h),
        Found::Free(_) | Found::Ours => None,
    }
}

/// A write of a home's holder fields ([`Home::put`]).
pub(crate) enum Write<'a> {
    /// The question to the holder.
    Ping(&'a Ping),
    /// The holder's answer: the nonce of the ping it read.
    Pong(&'a str),
    /// A loop's own record, the ping and pong removed.
    Claim(&'a Holder),
    /// No record, ping or pong.
    Release,
}

/// A home that carries a holder record, a ping and a pong (a state ConfigMap in its
/// annotations, an ExecutorSet in its status): what [`settle`], [`answer`] and [`release`]
/// need of it.
pub(crate) trait Home {
    /// The names of the holder record, the ping and the pong among the home's fields.
    const KEYS: [&'static str; 3];
    /// A holder record or a ping as the home holds it (JSON text in an annotation, JSON).
    fn encode<T: serde::Serialize>(v: &T) -> Value;
    /// What home `obj` carries about its holder.
    fn seen(obj: &Value) -> Seen;
    /// The home, for messages: `ConfigMap ns/name`, `ExecutorSet ns/name`.
    fn what(&self) -> String;
    /// How this command treats the holder record.
    fn mode(&self) -> &Mode;
    /// This loop's question to another holder, kept between its reads of the home.
    fn asker(&mut self) -> &mut Asker;
    /// Reads the home; `None` when it does not exist. Errors: the API's.
    fn read(&self) -> Result<Option<Value>, StoreError>;
    /// The object of home `obj` that holds the fields named by [`Home::KEYS`] (a
    /// ConfigMap's annotations, an ExecutorSet's status).
    fn fields(obj: &mut Value) -> &mut Value;
    /// Writes home `obj` with its `resourceVersion` (the ConfigMap, the ExecutorSet's
    /// status): the object as stored. Errors: the API's, a 409 among them.
    fn replace(&self, obj: &Value) -> Result<Value, KubeError>;
    /// What a 403 on this home asks of the user: the RBAC to grant (in parentheses after
    /// the error).
    const FORBIDDEN_HINT: &'static str;
    /// What a 404 on this home asks of the user, if a 404 can mean more than a missing
    /// object (an ExecutorSet's: the CRD not installed).
    const NOT_FOUND_HINT: Option<&'static str>;
    /// What a conditional write changes, before [`Home::what`] in the conflict message
    /// (`""`: the whole object; `"the status of "`).
    const WRITES: &'static str;

    /// An API error of this home's as the store reports it: `Forbidden` for a 403 (naming
    /// the home and [`Home::FORBIDDEN_HINT`]), else `Backend` naming the home (and
    /// [`Home::NOT_FOUND_HINT`] for a 404).
    fn backend(&self, e: KubeError) -> StoreError {
        let what = self.what();
        match (e.status_code(), Self::NOT_FOUND_HINT) {
            (Some(403), _) => {
                StoreError::Forbidden(format!("{what}: {e} ({})", Self::FORBIDDEN_HINT))
            }
            (Some(404), Some(hint)) => StoreError::Backend(format!("{what}: {e} ({hint})")),
            _ => StoreError::Backend(format!("{what}: {e}")),
        }
    }

    /// The error of a write that met a 409 at every try.
    fn conflict(&self) -> StoreError {
        StoreError::Conflict(format!(
            "another podalloc instance updated {}{} first; this tick did nothing",
            Self::WRITES,
            self.what()
        ))
    }
}

/// How many times a release is tried again after a 409.
const RETRIES: u32 = 8;

/// Makes `write` on home `obj` (conditional on its `resourceVersion`): the object as
/// stored, `None` after a 409. Errors: the API's.
pub(crate) fn write<H: Home>(
    home: &H,
    obj: &Value,
    write: Write<'_>,
) -> Result<Option<Value>, StoreError> {
    let [holder, ping, pong] = H::KEYS;
    let set = match write {
        Write::Ping(p) => vec![(ping, Some(H::encode(p)))],
        Write::Pong(nonce) => vec![(pong, Some(Value::from(nonce)))],
        Write::Claim(h) => vec![(holder, Some(H::encode(h))), (ping, None), (pong, None)],
        Write::Release => vec![(holder, None), (ping, None), (pong, None)],
    };
    let mut obj = obj.clone();
    set_keys(H::fields(&mut obj), &set);
    match home.replace(&obj) {
        Ok(stored) => Ok(Some(stored)),
        Err(e) if e.status_code() == Some(409) => Ok(None),
        Err(e) => Err(home.backend(e)),
    }
}

/// Settles who holds home `obj`, as just read, before this command uses it (see the module
/// doc); `obj` is left as the home stands after this command's own writes (a pong, its
/// claim, or as last read while it waited for an answer). Errors: [`StoreError::Owned`]
/// naming a live holder; the API's.
pub(crate) fn settle<H: Home>(home: &mut H, obj: &mut Value) -> Result<(), StoreError> {
    let what = home.what();
    let seen = H::seen(obj);
    let (ping, mine) = match home.mode() {
        Mode::Read => return Ok(()),
        Mode::Once { ping } => (*ping, None),
        Mode::Loop(h) => (true, Some(h.clone())),
    };
    let theirs = match judge(seen.holder.as_deref(), mine.as_ref(), &what) {
        Found::Ours => {
            if let Some(stored) = answer(home, obj, &seen)? {
                *obj = stored;
            }
            return Ok(());
        }
        Found::Free(why) => {
            if let Some(why) = why {
                log::warn!("{what}: taking over from {why}");
            }
            return take(home, obj);
        }
        Found::Renewed(h, age) => return Err(owned(&what, &format!("{h} (renewed {age}s ago)"))),
        Found::Other(h) if !ping => return Err(owned(&what, &h.to_string())),
        Found::Other(h) => h,
    };
    if mine.is_none() {
        return ask(home, obj, theirs);
    }
    let step = (home.asker()).next(&theirs, seen.ping.as_ref(), seen.pong.as_deref());
    match step {
        Next::Alive(how) | Next::Waiting(how) => Err(owned(&what, &format!("{theirs} ({how})"))),
        Next::Ping(p) => {
            if write(home, obj, Write::Ping(&p))?.is_some() {
                home.asker().sent(&p, &theirs);
            }
            Err(owned(&what, &format!("{theirs} (asked whether it lives)")))
        }
        Next::Dead(why) => {
            log::warn!("{what}: taking over from {why}");
            take(home, obj)
        }
    }
}

/// A loop's own record on home `obj` (as `seen`): answers the ping it carries when not
/// answered yet. Returns the home as stored after the pong; `None`: nothing to answer, or a
/// 409 (answered at the next read). Errors: the API's.
pub(crate) fn answer<H: Home>(
    home: &H,
    obj: &Value,
    seen: &Seen,
) -> Result<Option<Value>, StoreError> {
    let Some(nonce) = pong_due(seen.ping.as_ref(), seen.pong.as_deref()) else {
        return Ok(None);
    };
    log::debug!("{}: answering ping {nonce}", home.what());
    write(home, obj, Write::Pong(&nonce))
}

/// A one-shot command's question to live-looking holder `theirs` of home `obj`, waited for
/// ([`ask_waiting`]); `obj` is left as the home was last read or written.
fn ask<H: Home>(home: &H, obj: &mut Value, theirs: Holder) -> Result<(), StoreError> {
    let latest = RefCell::new(obj.clone());
    let read = || -> Result<Option<Seen>, StoreError> {
        Ok(home.read()?.map(|o| {
            let seen = H::seen(&o);
            *latest.borrow_mut() = o;
            seen
        }))
    };
    let ping = |p: &Ping| -> Result<bool, StoreError> {
        let base = latest.borrow().clone();
        match write(home, &base, Write::Ping(p))? {
            Some(stored) => {
                *latest.borrow_mut() = stored;
                Ok(true)
            }
            None => Ok(false),
        }
    };
    let verdict = ask_waiting(theirs, read, ping)?;
    *obj = latest.into_inner();
    match verdict {
        Err(alive) => Err(owned(&home.what(), &alive)),
        Ok(why) => {
            if let Some(why) = why {
                log::warn!("{}: taking over from {why}", home.what());
            }
            Ok(())
        }
    }
}

/// A loop claims home `obj` (no live holder on it): writes its record, once, conditionally
/// (a 409: someone else wrote first, [`StoreError::Owned`]: read again at the next claim);
/// `obj` becomes the home as stored. A one-shot command writes nothing here.
fn take<H: Home>(home: &H, obj: &mut Value) -> Result<(), StoreError> {
    let Mode::Loop(mine) = home.mode() else {
        return Ok(());
    };
    match write(home, obj, Write::Claim(mine))? {
        Some(stored) => {
            log::debug!("{}: claimed by this loop", home.what());
            *obj = stored;
            Ok(())
        }
        None => Err(StoreError::Owned(format!(
            "{} was written by another process while this loop claimed it; reading it again",
            home.what()
        ))),
    }
}

/// Removes a loop's own holder record from its home (one conditional write, again after a
/// 409), so the next loop starts at once; nothing when the record is not ours or the home
/// is gone. Errors: the API's, [`Home::conflict`] after the retries.
pub(crate) fn release<H: Home>(home: &H) -> Result<(), StoreError> {
    let Mode::Loop(mine) = home.mode() else {
        return Ok(());
    };
    for _ in 0..RETRIES {
        let Some(obj) = home.read()? else {
            return Ok(());
        };
        let text = H::seen(&obj).holder;
        if !matches!(judge(text.as_deref(), Some(mine), ""), Found::Ours) {
            return Ok(());
        }
        if write(home, &obj, Write::Release)?.is_some() {
            return Ok(());
        }
    }
    Err(home.conflict())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other() -> Holder {
        Holder {
            host: "elsewhere".into(),
            pid: 42,
            answer_within_ms: Some(50),
            ..Holder::current("run")
        }
    }

    #[test]
    fn a_question_answered_says_alive_and_is_not_asked_again_for_a_while() {
        let (h, mut a) = (other(), Asker::default());
        let Next::Ping(p) = a.next(&h, None, None) else {
            panic!("asks first")
        };
        a.sent(&p, &h);
        assert!(matches!(a.next(&h, Some(&p), None), Next::Waiting(_)));
        assert!(matches!(
            a.next(&h, Some(&p), Some(&p.nonce)),
            Next::Alive(_)
        ));
        assert!(matches!(
            a.next(&h, Some(&p), Some(&p.nonce)),
            Next::Alive(_)
        ));
    }

    #[test]
    fn no_answer_within_the_deadline_says_dead_and_a_waiting_ping_is_adopted() {
        let (h, mut a) = (other(), Asker::default());
        let theirs = Ping::new();
        assert!(matches!(a.next(&h, Some(&theirs), None), Next::Waiting(_)));
        std::thread::sleep(Duration::from_millis(60));
        assert!(matches!(a.next(&h, Some(&theirs), None), Next::Dead(_)));
    }

    #[test]
    fn a_holder_judged_by_host_pid_and_old_renewals() {
        let me = Holder::current("run");
        assert!(matches!(judge_holder(me.clone(), Some(&me)), Found::Ours));
        assert!(matches!(judge_holder(other(), Some(&me)), Found::Other(_)));
        let gone = Holder {
            pid: 999_999_999,
            ..Holder::current("run")
        };
        assert!(matches!(
            judge_holder(gone.clone(), None),
            Found::Free(Some(_))
        ));
        // The same host name, another PID namespace (another container): its pid is not
        // looked up here, it is asked (it was taken over at once while alive).
        let other_ns = Holder {
            pid_ns: Some("pid:[1]".into()),
            ..gone.clone()
        };
        assert!(matches!(judge_holder(other_ns, None), Found::Other(_)));
        let unnamed_ns = Holder {
            pid_ns: None,
            ..gone
        };
        assert!(matches!(judge_holder(unnamed_ns, None), Found::Other(_)));
        let old = Holder {
            stale_after_s: Some(30),
            renewed_ms: Some(crate::clock::now_ms()),
            answer_within_ms: None,
            ..other()
        };
        assert!(matches!(
            judge_holder(old.clone(), None),
            Found::Renewed(..)
        ));
        let stale = Holder {
            renewed_ms: Some(1),
            ..old
        };
        assert!(matches!(judge_holder(stale, None), Found::Free(Some(_))));
        assert_eq!(
            answer_within_ms(Duration::from_secs(1), Duration::ZERO),
            5000
        );
        assert_eq!(
            answer_within_ms(Duration::from_secs(1), Duration::from_secs(120)),
            125_000
        );
        assert!(pong_due(Some(&Ping::new()), None).is_some());
    }
}
