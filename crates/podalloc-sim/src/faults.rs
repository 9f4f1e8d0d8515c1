//! Fault injection: rules that make chosen requests fail the way a real apiserver (or the
//! network in front of it) fails, and the state that decides, request by request, which
//! rule fires.
//!
//! A rule reads `VERB:FAULT[@WHEN]`, for example `create:lost-response@2,3`,
//! `list:429-text@p=0.2` or `delete:500@always` (see [`FaultRule::parse`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::util::{fnv64, mix64, unit_draw};

/// Largest request number (and largest `N-M` range) a rule may name.
const MAX_NTH: u64 = 1_000_000;
/// Most request numbers one rule may list (ranges included).
const MAX_NTH_ITEMS: usize = 100_000;

/// One kind of failure. The wire shapes are those of kube-apiserver (see the variants).
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// `429-text`: what API Priority and Fairness (and the max-in-flight filter) send:
    /// a plain-text body `Too many requests, please try again later.` with
    /// `Retry-After: 1`. The request is not processed.
    TooManyRequestsText,
    /// `429-status[:SECONDS]`: a `Status` with reason `TooManyRequests`,
    /// `details.retryAfterSeconds` and a matching `Retry-After` header (what the watch
    /// cache sends while it initialises). Default 1 second. Not processed.
    TooManyRequestsStatus {
        /// `details.retryAfterSeconds` and the `Retry-After` header value (at least 1).
        retry_after_seconds: u32,
    },
    /// `500`: an `InternalError` Status. Not processed.
    InternalError,
    /// `503`: a `ServiceUnavailable` Status with `Retry-After: 1` (what a shutting-down
    /// apiserver sends). Not processed.
    ServiceUnavailable,
    /// `504`: the request timeout filter's answer (a `Timeout` Status, sent as
    /// `text/plain` without `kind`/`apiVersion`, as the filter writes it). Not processed.
    Timeout,
    /// `504-after-write`: the request IS processed (a create creates, a delete deletes)
    /// and the client gets the 504 anyway, as when the timeout filter fires while the
    /// storage write completes.
    TimeoutAfterWrite,
    /// `reset`: the connection is closed before any response; nothing is processed.
    Reset,
    /// `delay:MS`: the server waits this long, then processes and answers the request
    /// normally (a slow apiserver, for client read timeouts).
    Delay(Duration),
    /// `lost-response`: the request is processed, then the connection is closed without
    /// a response ("the create succeeded but the answer was lost").
    LostResponse,
    /// `truncate`: the request is processed and the head goes out with the full
    /// `Content-Length`, but only half the body follows before the connection closes.
    Truncate,
    /// `410`: only for `list` requests that carry a `continue` token: 410 `Expired` with
    /// the apiserver's compaction message and a fresh token (as when etcd compacted the
    /// list's revision). Lists without a token are not affected.
    Expired,
    /// `garbage`: the request IS processed, then the answer's body is replaced by bytes
    /// that are not JSON (the status code and `Content-Type: application/json` stay), as
    /// when something between the client and the apiserver mangles the body: the client
    /// cannot tell whether a create happened.
    Garbage,
    /// `html`: a proxy in front of the apiserver answers `200 OK` with its own HTML page
    /// (a login or captive portal); the request never reaches the apiserver.
    Html,
    /// `no-kind`: the request IS processed and the answer's JSON object loses its `kind`
    /// and `apiVersion` (a body that does not say what it is, e.g. `{}` from a broken
    /// aggregated server or proxy).
    NoKind,
    /// `trickle[:MS]`: the request IS processed, the head goes out at once with the full
    /// `Content-Length`, and the body follows one byte every MS milliseconds (default
    /// 1000): no single read times out, only a total deadline ends the wait.
    Trickle(Duration),
    /// `redirect`: `307 Temporary Redirect` to a login page (`Location:
    /// https://login.example.com/...`), as an authenticating proxy answers; not processed.
    Redirect,
}

/// Which requests of the rule's verb a rule hits.
#[derive(Clone, Debug, PartialEq)]
pub enum When {
    /// Each request independently with this probability in `[0, 1]`. The draws are
    /// deterministic given `SimOptions::seed`, the rule's position and the request number.
    Probability(f64),
    /// These requests, numbered from 1 per verb (counting restarts whenever the rule set
    /// is replaced).
    Nth(Vec<u64>),
    /// Every request of the verb.
    Always,
}

/// One fault rule: `fault` hits the requests of `verb` selected by `when`.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    /// A served verb, prefixed by its resource's fault prefix: `list`, `get`, `create`,
    /// `patch`, `delete`, `deletecollection` (pods), `cm-list`, `cm-get`, `cm-create`,
    /// `cm-update`, `cm-delete` (ConfigMaps), `lease-get`, `lease-create`, `lease-update`,
    /// `lease-delete`, `ev-list`, `ev-get`, `ev-create`, `ev-patch` (Events), `ns-list`,
    /// `ns-get`, `ns-create` (Namespaces).
    pub verb: String,
    /// What happens to the request.
    pub fault: Fault,
    /// Which requests.
    pub when: When,
}

const SYNTAX: &str = "expected VERB:FAULT[@WHEN], e.g. \"create:lost-response@2,3\", \"list:429-text@p=0.2\" or \"delete:500@always\"";
const FAULT_NAMES: &str = "429-text, 429-status[:SECONDS], 500, 503, 504, 504-after-write, reset, delay:MS, lost-response, truncate, 410, garbage, html, no-kind, trickle[:MS], redirect";

impl Fault {
    /// Parses a fault name such as `429-text` or `delay:250`.
    ///
    /// # Errors
    ///
    /// A message naming the bad part and listing the valid names.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let no_arg = |f: Fault| match arg {
            None => Ok(f),
            Some(a) => Err(format!("fault {name:?} takes no argument (got {a:?})")),
        };
        match name {
            "429-text" => no_arg(Fault::TooManyRequestsText),
            "429-status" => {
                let secs = match arg {
                    None => 1,
                    Some(a) => a.parse::<u32>().ok().filter(|n| (1..=3600).contains(n)).ok_or_else(|| {
                        format!("429-status:{a}: the Retry-After seconds must be a whole number from 1 to 3600")
                    })?,
                };
                Ok(Fault::TooManyRequestsStatus {
                    retry_after_seconds: secs,
                })
            }
            "500" => no_arg(Fault::InternalError),
            "503" => no_arg(Fault::ServiceUnavailable),
            "504" => no_arg(Fault::Timeout),
            "504-after-write" => no_arg(Fault::TimeoutAfterWrite),
            "reset" => no_arg(Fault::Reset),
            "lost-response" => no_arg(Fault::LostResponse),
            "truncate" => no_arg(Fault::Truncate),
            "410" => no_arg(Fault::Expired),
            "garbage" => no_arg(Fault::Garbage),
            "html" => no_arg(Fault::Html),
            "no-kind" => no_arg(Fault::NoKind),
            "redirect" => no_arg(Fault::Redirect),
            "trickle" => {
                let ms = match arg {
                    None => 1000,
                    Some(a) => a
                        .parse::<u64>()
                        .ok()
                        .filter(|ms| (1..=60_000).contains(ms))
                        .ok_or_else(|| {
                            format!(
                                "trickle:{a}: expected whole milliseconds per byte from 1 to 60000"
                            )
                        })?,
                };
                Ok(Fault::Trickle(Duration::from_millis(ms)))
            }
            "delay" => {
                let Some(a) = arg else {
                    return Err("fault \"delay\" needs milliseconds, e.g. \"delay:1500\"".into());
                };
                let ms = a
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| *ms <= 3_600_000)
                    .ok_or_else(|| {
                        format!("delay:{a}: expected whole milliseconds from 0 to 3600000")
                    })?;
                Ok(Fault::Delay(Duration::from_millis(ms)))
            }
            _ => Err(format!(
                "unknown fault {s:?}; expected one of {FAULT_NAMES}"
            )),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::TooManyRequestsText => f.write_str("429-text"),
            Fault::TooManyRequestsStatus {
                retry_after_seconds: 1,
            } => f.write_str("429-status"),
            Fault::TooManyRequestsStatus {
                retry_after_seconds,
            } => write!(f, "429-status:{retry_after_seconds}"),
            Fault::InternalError => f.write_str("500"),
            Fault::ServiceUnavailable => f.write_str("503"),
            Fault::Timeout => f.write_str("504"),
            Fault::TimeoutAfterWrite => f.write_str("504-after-write"),
            Fault::Reset => f.write_str("reset"),
            Fault::Delay(d) => write!(f, "delay:{}", d.as_millis()),
            Fault::LostResponse => f.write_str("lost-response"),
            Fault::Truncate => f.write_str("truncate"),
            Fault::Expired => f.write_str("410"),
            Fault::Garbage => f.write_str("garbage"),
            Fault::Html => f.write_str("html"),
            Fault::NoKind => f.write_str("no-kind"),
            Fault::Redirect => f.write_str("redirect"),
            Fault::Trickle(d) if d.as_millis() == 1000 => f.write_str("trickle"),
            Fault::Trickle(d) => write!(f, "trickle:{}", d.as_millis()),
        }
    }
}

impl When {
    /// Parses `always`, `p=0.25` or request numbers such as `2,3` or `2-5,9`.
    ///
    /// # Errors
    ///
    /// A message naming the bad part.
    pub fn parse(s: &str) -> Result<When, String> {
        const WHEN_SYNTAX: &str =
            "expected \"always\", \"p=P\" (0 <= P <= 1) or 1-based request numbers such as \"2,3\" or \"2-5\"";
        if s == "always" {
            return Ok(When::Always);
        }
        if let Some(p) = s.strip_prefix("p=") {
            let p: f64 = p
                .parse()
                .map_err(|_| format!("@{s}: {p:?} is not a number; {WHEN_SYNTAX}"))?;
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("@{s}: the probability must be within [0, 1]"));
            }
            return Ok(When::Probability(p));
        }
        if s.is_empty() {
            return Err(format!("empty @WHEN; {WHEN_SYNTAX}"));
        }
        let num = |t: &str| -> Result<u64, String> {
            let n: u64 = t
                .trim()
                .parse()
                .map_err(|_| format!("@{s}: {t:?} is not a request number; {WHEN_SYNTAX}"))?;
            if n == 0 {
                return Err(format!(
                    "@{s}: request numbers are 1-based (the first request of the verb is 1)"
                ));
            }
            if n > MAX_NTH {
                return Err(format!("@{s}: request numbers go up to {MAX_NTH}"));
            }
            Ok(n)
        };
        let mut out = Vec::new();
        for part in s.split(',') {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(format!("@{s}: the range {part:?} is empty"));
                    }
                    out.extend(a..=b);
                }
                None => out.push(num(part)?),
            }
            if out.len() > MAX_NTH_ITEMS {
                return Err(format!(
                    "@{s}: at most {MAX_NTH_ITEMS} request numbers per rule"
                ));
            }
        }
        out.sort_unstable();
        out.dedup();
        Ok(When::Nth(out))
    }

    fn check(&self) -> Result<(), String> {
        match self {
            When::Probability(p) if !(0.0..=1.0).contains(p) => {
                Err(format!("probability {p} is outside [0, 1]"))
            }
            When::Nth(v) if v.contains(&0) => {
                Err("request numbers are 1-based; 0 never matches".into())
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for When {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            When::Always => f.write_str("always"),
            When::Probability(p) => write!(f, "p={p}"),
            When::Nth(v) => {
                // Consecutive numbers collapse into ranges, so the text round-trips.
                let mut parts = Vec::new();
                let mut i = 0;
                while i < v.len() {
                    let mut j = i;
                    while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
                        j += 1;
                    }
                    if j > i {
                        parts.push(format!("{}-{}", v[i], v[j]));
                    } else {
                        parts.push(v[i].to_string());
                    }
                    i = j + 1;
                }
                f.write_str(&parts.join(","))
            }
        }
    }
}

impl FaultRule {
    /// Parses `VERB:FAULT[@WHEN]` (the `podalloc sim --fault` syntax). Without `@WHEN`
    /// the rule hits every request of the verb.
    ///
    /// - VERB: `list`, `get`, `create`, `delete`, `deletecollection`, `cm-list`, `cm-get`,
    ///   `cm-create`, `cm-update`, `cm-delete`;
    /// - FAULT: `429-text`, `429-status[:SECONDS]`, `500`, `503`, `504`,
    ///   `504-after-write`, `reset`, `delay:MS`, `lost-response`, `truncate`, `410`
    ///   (`410` only with `list`), `garbage`, `html`, `no-kind`, `trickle[:MS]`, `redirect`;
    /// - WHEN: `always`, `p=P` or 1-based request numbers `2,3` / `2-5`.
    ///
    /// # Errors
    ///
    /// A message quoting the rule and saying what is wrong with it.
    pub fn parse(s: &str) -> Result<FaultRule, String> {
        let err = |m: String| format!("fault rule {s:?}: {m}");
        let (head, when) = match s.rsplit_once('@') {
            Some((h, w)) => (h, Some(w)),
            None => (s, None),
        };
        let Some((verb, fault)) = head.split_once(':') else {
            return Err(err(SYNTAX.to_string()));
        };
        let verb = verb.trim();
        if verb.is_empty() || fault.is_empty() {
            return Err(err(SYNTAX.to_string()));
        }
        check_verb(verb).map_err(err)?;
        let fault = Fault::parse(fault.trim()).map_err(err)?;
        let when = match when {
            None => When::Always,
            Some(w) => When::parse(w.trim()).map_err(err)?,
        };
        let rule = FaultRule {
            verb: verb.to_string(),
            fault,
            when,
        };
        rule.validate().map_err(err)?;
        Ok(rule)
    }

    /// Checks a rule built in code: a known verb, a fault that applies to it, a
    /// probability within `[0, 1]`, 1-based request numbers.
    ///
    /// # Errors
    ///
    /// What is wrong, as a sentence.
    pub fn validate(&self) -> Result<(), String> {
        check_verb(&self.verb)?;
        if self.fault == Fault::Expired && self.verb != "list" {
            return Err(format!(
                "fault 410 applies only to pod list pages with a continue token (verb \"list\"), not to {:?}",
                self.verb
            ));
        }
        self.when.check()
    }
}

impl FromStr for FaultRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FaultRule::parse(s)
    }
}

impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}@{}", self.verb, self.fault, self.when)
    }
}

/// Accepts a verb name a rule (or `SimOptions::forbid`) can use: a served verb with its
/// resource's prefix ([`super::resources::fault_verbs`]: `list`, `patch`, `cm-update`,
/// `lease-get`, `ev-create`, `ns-list`, …). Errors: the list of valid names.
pub(crate) fn check_verb(verb: &str) -> Result<(), String> {
    let verbs = super::resources::fault_verbs();
    if verbs.iter().any(|v| v == verb) {
        Ok(())
    } else {
        Err(format!(
            "unknown verb {verb:?}; expected one of {}",
            verbs.join(", ")
        ))
    }
}

/// The rules in force, the per-verb request counts they are matched against and the
/// running count of injected faults.
#[derive(Debug, Default)]
pub(crate) struct FaultState {
    rules: Vec<FaultRule>,
    seed: u64,
    counts: HashMap<String, u64>,
    injected: BTreeMap<String, u64>,
}

impl FaultState {
    pub(crate) fn new(rules: Vec<FaultRule>, seed: u64) -> Self {
        FaultState {
            rules,
            seed,
            ..FaultState::default()
        }
    }

    /// Replaces the rules; the per-verb request counts start again from zero.
    pub(crate) fn replace(&mut self, rules: Vec<FaultRule>) {
        self.rules = rules;
        self.counts.clear();
    }

    pub(crate) fn rules(&self) -> &[FaultRule] {
        &self.rules
    }

    /// Counts one request of `verb` and returns the fault of the first rule that hits it.
    /// `has_continue` says whether the request is a list page with a continue token (the
    /// only requests `410` applies to).
    pub(crate) fn pick(&mut self, verb: &str, has_continue: bool) -> Option<Fault> {
        let n = {
            let c = self.counts.entry(verb.to_string()).or_insert(0);
            *c += 1;
            *c
        };
        let verb_hash = fnv64(&[verb]);
        let hit = self.rules.iter().enumerate().find(|(i, r)| {
            if r.verb != verb || (r.fault == Fault::Expired && !has_continue) {
                return false;
            }
            match &r.when {
                When::Always => true,
                When::Nth(v) => v.binary_search(&n).is_ok(),
                When::Probability(p) => {
                    let stream = self.seed ^ mix64(*i as u64 + 1) ^ verb_hash;
                    unit_draw(stream, n) < *p
                }
            }
        });
        let fault = hit.map(|(_, r)| r.fault.clone())?;
        *self.injected.entry(format!("{verb}:{fault}")).or_insert(0) += 1;
        Some(fault)
    }

    /// Injected faults so far, keyed `VERB:FAULT` (e.g. `create:lost-response`); never
    /// reset.
    pub(crate) fn injected(&self) -> BTreeMap<String, u64> {
        self.injected.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_examples_and_round_trips() {
        let r = FaultRule::parse("create:lost-response@2,3").unwrap();
        assert_eq!(
            r,
            FaultRule {
                verb: "create".into(),
                fault: Fault::LostResponse,
                when: When::Nth(vec![2, 3]),
            }
        );
        assert_eq!(r.to_string(), "create:lost-response@2-3");
        let r = FaultRule::parse("list:429-text@p=0.2").unwrap();
        assert_eq!(r.when, When::Probability(0.2));
        assert_eq!(r.to_string(), "list:429-text@p=0.2");
        let r = FaultRule::parse("delete:500@always").unwrap();
        assert_eq!(
            (r.fault.clone(), r.when.clone()),
            (Fault::InternalError, When::Always)
        );
        assert_eq!(FaultRule::parse("delete:500").unwrap(), r);
        for text in [
            "get:delay:1500@1",
            "create:504-after-write@1-3,7",
            "cm-update:429-status:5@p=1",
            "list:410@2",
            "cm-get:reset@always",
            "create:truncate@4",
            "deletecollection:503@always",
            "create:garbage@p=0.2",
            "list:html@1",
            "cm-get:no-kind@always",
            "list:trickle@1",
            "get:trickle:250@2",
            "list:redirect@always",
        ] {
            let r = FaultRule::parse(text).unwrap();
            assert_eq!(FaultRule::parse(&r.to_string()).unwrap(), r, "{text}");
        }
        assert_eq!(
            FaultRule::parse("list:trickle").unwrap().fault,
            Fault::Trickle(Duration::from_secs(1))
        );
        assert!(FaultRule::parse("list:trickle:0").is_err());
        assert_eq!(
            FaultRule::parse("get:delay:1500@1").unwrap().fault,
            Fault::Delay(Duration::from_millis(1500))
        );
        assert_eq!(
            "create:429-status".parse::<FaultRule>().unwrap().fault,
            Fault::TooManyRequestsStatus {
                retry_after_seconds: 1
            }
        );
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        let e = |s: &str| FaultRule::parse(s).unwrap_err();
        assert!(
            e("create").contains("expected VERB:FAULT[@WHEN]"),
            "{}",
            e("create")
        );
        // A verb no resource serves with that name (pods have no `update`, Leases no list).
        assert!(e("update:500").contains("unknown verb \"update\"; expected one of list, get"));
        assert!(e("lease-list:500").contains("unknown verb \"lease-list\""));
        // Every verb the router serves can be named, pods' `patch` included.
        for verb in ["patch", "cm-update", "lease-get", "ev-patch", "ns-create"] {
            assert_eq!(FaultRule::parse(&format!("{verb}:500")).unwrap().verb, verb);
        }
        assert!(e("create:418").contains("unknown fault \"418\"; expected one of 429-text"));
        assert!(e("create:500@0").contains("1-based"));
        assert!(e("create:500@p=1.5").contains("within [0, 1]"));
        assert!(e("create:500@p=x").contains("is not a number"));
        assert!(e("create:500@two").contains("is not a request number"));
        assert!(e("create:500@5-2").contains("is empty"));
        assert!(e("create:500@").contains("empty @WHEN"));
        assert!(e("create:delay").contains("needs milliseconds"));
        assert!(e("create:delay:soon").contains("whole milliseconds"));
        assert!(e("create:reset:1").contains("takes no argument"));
        assert!(e("create:429-status:0").contains("from 1 to 3600"));
        assert!(e("get:410").contains("applies only to pod list pages"));
        assert!(e("x").starts_with("fault rule \"x\": "));
        let built = FaultRule {
            verb: "create".into(),
            fault: Fault::Reset,
            when: When::Nth(vec![0]),
        };
        assert!(built.validate().is_err());
    }

    #[test]
    fn nth_counts_per_verb_and_restarts_on_replace() {
        let rules = vec![
            FaultRule::parse("create:500@2,3").unwrap(),
            FaultRule::parse("create:reset@3").unwrap(),
            FaultRule::parse("list:410@always").unwrap(),
        ];
        let mut s = FaultState::new(rules.clone(), 0);
        let got: Vec<Option<Fault>> = (0..4).map(|_| s.pick("create", false)).collect();
        assert_eq!(
            got,
            vec![
                None,
                Some(Fault::InternalError),
                Some(Fault::InternalError),
                None
            ]
        );
        assert_eq!(s.pick("get", false), None);
        assert_eq!(s.pick("list", false), None, "410 needs a continue token");
        assert_eq!(s.pick("list", true), Some(Fault::Expired));
        s.replace(rules);
        assert_eq!(s.pick("create", false), None);
        assert_eq!(s.pick("create", false), Some(Fault::InternalError));
        let injected = s.injected();
        assert_eq!(injected.get("create:500"), Some(&3));
        assert_eq!(injected.get("list:410"), Some(&1));
    }

    #[test]
    fn probabilities_are_deterministic_and_roughly_right() {
        let rules = vec![FaultRule::parse("get:503@p=0.25").unwrap()];
        let run = |seed| {
            let mut s = FaultState::new(rules.clone(), seed);
            (0..4000)
                .map(|_| s.pick("get", false).is_some())
                .collect::<Vec<bool>>()
        };
        let a = run(7);
        assert_eq!(a, run(7));
        assert_ne!(a, run(8));
        let hits = a.iter().filter(|h| **h).count();
        assert!((850..1150).contains(&hits), "{hits}");
        let mut never = FaultState::new(vec![FaultRule::parse("get:503@p=0").unwrap()], 1);
        assert!((0..1000).all(|_| never.pick("get", false).is_none()));
        let mut always = FaultState::new(vec![FaultRule::parse("get:503@p=1").unwrap()], 1);
        assert!((0..1000).all(|_| always.pick("get", false).is_some()));
    }
}
