//! The simulated scheduler and kubelet: a timeline of due events (schedule, start, image
//! pull back-off, stop, remove, garbage collection) per pod, applied in due order before
//! every request (`Store::advance`), and what each event does to the pod's status (node
//! and host IP, containers' states through `containers.rs`, phases, restart counts). The
//! API half of the store (`mod.rs`) queues the events; this half carries them out.

use std::cmp::Reverse;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::*;

impl Store {
    /// Queues the kubelet event `kind` of pod `key` (uid `uid`, so that a pod recreated
    /// under the same name is not touched) for `due`.
    pub(super) fn push(&mut self, due: Instant, kind: EvKind, key: &str, uid: &str) {
        self.order += 1;
        self.events.push(Reverse(Event {
            due,
            order: self.order,
            kind,
            key: key.to_string(),
            uid: uid.to_string(),
        }));
    }

    /// [`Store::push`] for the pod now stored at `key`.
    pub(super) fn push_current(&mut self, due: Instant, kind: EvKind, key: &str) {
        let uid = self
            .pods
            .get(key)
            .map(|e| e.uid.clone())
            .unwrap_or_default();
        self.push(due, kind, key, &uid);
    }

    /// When the next kubelet event falls due, if any.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.events.peek().map(|Reverse(e)| e.due)
    }

    /// Applies every event due at or before `now`, in order, and drops stale snapshots.
    pub(crate) fn advance(&mut self, now: Instant) {
        while let Some(Reverse(e)) = self.events.peek() {
            if e.due > now {
                break;
            }
            let Some(Reverse(e)) = self.events.pop() else {
                break;
            };
            let current = self.pods.get(&e.key).is_some_and(|p| p.uid == e.uid);
            if !current {
                continue;
            }
            match e.kind {
                EvKind::Schedule => self.on_schedule(&e.key, e.due),
                EvKind::Start => self.on_start(&e.key, e.due),
                EvKind::BackOff => self.on_back_off(&e.key),
                EvKind::Stop => self.on_stop(&e.key, e.due),
                EvKind::Remove => {
                    if self.pods.get(&e.key).is_some_and(|p| p.deletion.is_some()) {
                        self.remove_or_hold(&e.key, e.due);
                    }
                }
                EvKind::Gc => self.on_gc(&e.key, e.due),
            }
        }
        if !self.snapshots.is_empty() {
            let ttl = self.cfg.continue_ttl;
            self.snapshots
                .retain(|_, s| now.saturating_duration_since(s.created) <= ttl);
        }
    }

    fn on_schedule(&mut self, key: &str, due: Instant) {
        let Some(e) = self.pods.get(key) else { return };
        let retry = e.stage == Stage::Unschedulable && self.cfg.nodes > 0;
        if (e.stage != Stage::Unscheduled && !retry) || e.pinned || e.deletion.is_some() {
            return;
        }
        let preset = e.pod.fields.node_name.clone();
        let seq = e.seq;
        let t = self.reg.clock.rfc3339(due);
        let v: Value = serde_json::from_str(&e.pod.json).unwrap_or_default();
        if preset.is_empty() && pod::is_gated(&v) {
            // Not looked at until its gates are removed (`patch` schedules it then).
            self.rewrite(key, |v, _| pod::mark_gated(v, &t));
            return;
        }
        let node = if !preset.is_empty() {
            preset
        } else if self.cfg.nodes == 0 {
            let msg = "0/0 nodes are available: no nodes available to schedule pods.";
            self.rewrite(key, |v, e| {
                pod::mark_unschedulable(v, &t, msg);
                e.stage = Stage::Unschedulable;
            });
            return;
        } else if let Some(until) = self.held_until(seq, due).filter(|_| !retry) {
            let n = self.cfg.nodes;
            let msg = format!("0/{n} nodes are available: {n} Insufficient cpu.");
            self.rewrite(key, |v, e| {
                pod::mark_unschedulable(v, &t, &msg);
                e.stage = Stage::Unschedulable;
            });
            self.push_current(until, EvKind::Schedule, key);
            return;
        } else {
            node_name((seq as usize - 1) % self.cfg.nodes)
        };
        let ip = host_ip(&node);
        self.rewrite(key, |v, e| {
            pod::mark_scheduled(v, &node, &ip, &t);
            containers::mark_initializing(v, &t);
            e.stage = Stage::Creating;
        });
        self.push_current(due + self.startup_latency(seq), EvKind::Start, key);
    }

    /// When the pod with creation number `seq`, reaching the scheduler at `due`, can be
    /// scheduled if it is one of the pods held Unschedulable (`None`: it is not).
    fn held_until(&self, seq: u64, due: Instant) -> Option<Instant> {
        let until = self.reg.clock.start() + self.cfg.unschedulable_until;
        let frac = self.cfg.unschedulable_fraction;
        let held = frac > 0.0 && due < until && unit_draw(self.cfg.seed ^ HOLD_STREAM, seq) < frac;
        held.then_some(until)
    }

    /// The start-up latency of the pod with creation number `seq` (with the jitter).
    pub(super) fn startup_latency(&self, seq: u64) -> Duration {
        let j = self.cfg.startup_jitter.clamp(0.0, 1.0);
        if j == 0.0 {
            return self.cfg.startup_latency;
        }
        let u = 2.0 * unit_draw(self.cfg.seed ^ JITTER_STREAM, seq) - 1.0;
        self.cfg.startup_latency.mul_f64(1.0 + j * u)
    }

    fn on_start(&mut self, key: &str, due: Instant) {
        let Some(e) = self.pods.get(key) else { return };
        if e.stage != Stage::Creating || e.pinned || e.deletion.is_some() {
            return;
        }
        let fail =
            self.cfg.failure_rate > 0.0 && unit_draw(self.cfg.seed, e.seq) < self.cfg.failure_rate;
        let never = e.restart_policy == "Never";
        let (uid, ip) = (e.uid.clone(), pod_ip(e.seq));
        let t = self.reg.clock.rfc3339(due);
        if !fail && self.start_containers(key, due) {
            return;
        }
        self.rewrite(key, |v, e| {
            if !fail {
                pod::mark_running(v, &uid, &ip, &t);
                e.stage = Stage::Started;
            } else if never {
                pod::mark_running(v, &uid, &ip, &t);
                pod::mark_terminated(
                    v,
                    &uid,
                    &pod::Termination::exited(Phase::Failed, 1, "Error"),
                    &t,
                );
                e.stage = Stage::Stopped;
            } else {
                pod::mark_crash_loop(v, &uid, &ip, &t);
                e.stage = Stage::Started;
            }
        });
    }

    /// The kubelet's start of a pod with init containers, a missing image or a volume that
    /// cannot mount (see [`containers`]). Returns false for other pods (the plain path).
    fn start_containers(&mut self, key: &str, due: Instant) -> bool {
        let Some(e) = self.pods.get(key) else {
            return true;
        };
        let v: Value = serde_json::from_str(&e.pod.json).unwrap_or_default();
        let ns = e.pod.namespace().to_string();
        let cm_exists = |name: &str| self.reg.contains(Kind::ConfigMap, &ns, name);
        if containers::unmountable_volume(&v, cm_exists).is_some() {
            return true; // never mounts: the containers stay waiting, the pod Pending
        }
        let images = |key: &str| -> Vec<String> {
            let list = v.pointer(&format!("/spec/{key}")).and_then(Value::as_array);
            let images = list
                .into_iter()
                .flatten()
                .filter_map(|c| c["image"].as_str());
            images.map(str::to_string).collect()
        };
        let missing = (images("containers")
            .into_iter()
            .chain(images("initContainers")))
        .any(|i| self.missing_images.contains(&i));
        if !missing && !containers::has_init(&v) {
            return false;
        }
        let (uid, ip) = (e.uid.clone(), pod_ip(e.seq));
        let t = self.reg.clock.rfc3339(due);
        let missing_images = self.missing_images.clone();
        let mut outcome = containers::Started::Running;
        self.rewrite(key, |v, e| {
            outcome = containers::start(v, &uid, &t, &missing_images);
            if outcome == containers::Started::Running {
                pod::set_pod_ip(v, &ip);
                e.stage = Stage::Started;
            }
        });
        if outcome == containers::Started::PullFailed {
            self.push(due + self.cfg.startup_latency, EvKind::BackOff, key, &uid);
        }
        true
    }

    fn on_back_off(&mut self, key: &str) {
        let Some(e) = self.pods.get(key) else { return };
        if e.stage != Stage::Creating || e.pinned || e.deletion.is_some() {
            return;
        }
        self.rewrite(key, |v, _| containers::back_off(v));
    }

    /// Sets the images the simulated registry does not have (see
    /// [`crate::options::SimOptions::missing_images`]).
    pub(crate) fn set_missing_images(&mut self, images: Vec<String>) {
        self.missing_images = images;
    }

    /// One container of a running pod ends (see [`containers::terminate`]); the kubelet
    /// leaves the pod alone from then on (but still carries out a deletion).
    pub(crate) fn terminate_container(
        &mut self,
        ns: &str,
        name: &str,
        container: &str,
        exit_code: i64,
        reason: Option<&str>,
        now: Instant,
    ) -> Result<(), String> {
        self.advance(now);
        let key = format!("{ns}/{name}");
        if !self.pods.contains_key(&key) {
            return Err(format!("pods {name:?} not found"));
        }
        let t = self.reg.clock.rfc3339(now);
        let mut out = Ok(());
        self.rewrite(&key, |v, e| {
            match containers::terminate(v, container, exit_code, reason, &t) {
                Ok(terminal) => {
                    e.pinned = true;
                    if terminal {
                        e.stage = Stage::Stopped;
                    }
                }
                Err(why) => out = Err(why),
            }
        });
        out
    }

    fn on_stop(&mut self, key: &str, due: Instant) {
        let Some(e) = self.pods.get(key) else { return };
        let Some(d) = &e.deletion else { return };
        if d.stopped || d.stop_due != due {
            return;
        }
        // A node that stopped reporting cannot stop anything: the pod stays terminating.
        if e.phase == Phase::Unknown {
            return;
        }
        let killed = d.stop_due >= d.deadline;
        let terminal = e.phase.is_terminal();
        let uid = e.uid.clone();
        let t = self.reg.clock.rfc3339(due);
        if terminal {
            if let Some(d) = self.pods.get_mut(key).and_then(|e| e.deletion.as_mut()) {
                d.stopped = true;
            }
        } else {
            self.rewrite(key, |v, e| {
                let exit = if killed { 137 } else { 143 };
                pod::mark_terminated(v, &uid, &pod::Termination::killed(exit), &t);
                e.stage = Stage::Stopped;
                if let Some(d) = e.deletion.as_mut() {
                    d.stopped = true;
                }
            });
        }
        let delay = REMOVAL_DELAY.min(self.cfg.stop_latency);
        self.push(due + delay, EvKind::Remove, key, &uid);
    }

    fn on_gc(&mut self, key: &str, due: Instant) {
        let Some(e) = self.pods.get(key) else { return };
        if e.deletion.is_some() || e.other_owners || e.pod_owners.is_empty() {
            return;
        }
        if e.pod_owners.iter().any(|o| self.uids.contains_key(o)) {
            return;
        }
        let (ns, name) = (e.pod.namespace().to_string(), e.pod.name().to_string());
        let _ = self.delete_at(&ns, &name, &DeleteOptions::default(), false, due);
    }
}
