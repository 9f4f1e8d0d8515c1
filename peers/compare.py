#!/usr/bin/env python3
"""Spark's own ExecutorPodsAllocator beside podalloc, decision by decision (issue 6/6).

For each scenario (peers/scenarios/*.json), on a fresh `podalloc sim` each, with the same
seed and flags:
  - the Spark side runs peers/spark's harness (Spark's real allocator, snapshot store,
    polling source and lifecycle manager) against one simulator;
  - the podalloc side runs `podalloc run` with the scenario's policy against another
    (restarted with the new --target at each target change; the state file carries over).
The scenario's faults (an executor that fails, a pod deleted by hand, a pod that never
starts) are applied to both simulators at the same times after each side's start, through
the simulator's side doors and its API. Each side's decisions are read from its simulator's
request log (`GET /sim/log`: pod creates with their names, deletes by name, delete-collection
with the executor ids of its label selector) and compared decision by decision (`compare`):
which side made it, its order, its tick, how a delete is sent, where a delete falls among
the creates, its time (within one batch delay plus Spark's poll of the lag the decision before
it had: `timing`), with several resource profiles ("profiles") each executor's profile (read
from its pod's label spark-exec-resourceprofile-id by a GET as soon as the log shows its
create; on the real server from the labels the create sent, in the audit log:
created_profiles), and the executors each side leaves at the end. Each difference is keyed
by its decision ("create 6: time"); one the scenario does not name under "explained" (with the
D-number of docs/semantics.md that explains it) fails the run (exit 1). A scenario that
differs is played again only to report whether the same differences come back.

With --defaults, every scenario is played at both allocators' defaults (at_defaults).

With --real, the scenarios marked "real" are played on one real control plane instead
(peers/real.py: kube-apiserver + etcd, the kubelet emulator, a namespace per side, the
decisions read from the audit log); a scenario's "explained_real" adds differences that
only the real server may show.

Usage: peers/compare.py --jar-dir DIR [--podalloc target/release/podalloc] [--only NAME...]
       [--out DIR] [--real | --defaults] [--recompare DIR]
Python 3 standard library only.
"""

import argparse
import concurrent.futures
import itertools
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
NS = "default"
APP = "peer-app"
DRIVER = APP + "-driver"
TOKEN = "peer-token"
# A query parameter on the requests this script makes (faults), which the API ignores.
FAULT_MARK = "peerFault=1"
# What the real control plane (peers/real.py) cannot play: a pod that never starts (no
# API-only form that does not race the emulator's bind), and the simulator's flags other
# than the start-up latency.
REAL_UNSUPPORTED = ("hold",)
REAL_SIM_FLAGS = ("--startup-latency",)
EXEC_NAME = re.compile(r"-exec-([0-9]+)$")
PROFILE_LABEL = "spark-exec-resourceprofile-id"
IDS_IN = re.compile(r"spark-exec-id in \(([0-9, ]*)\)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sim:
    """One `podalloc sim` process, its side doors and its request log (peers/real.py's
    RealSide has the same interface on a real control plane)."""

    ns = NS

    def __init__(self, podalloc, seed, flags, workdir, profiles=False):
        self.dir = workdir
        # With several resource profiles: each executor's profile (its pod's label
        # spark-exec-resourceprofile-id, read by a GET as soon as the log shows its create).
        self.profiles = {} if profiles else None
        self.port = free_port()
        self.kubeconfig = workdir / "kubeconfig"
        self.ca = workdir / "ca.pem"
        cmd = [podalloc, "sim", "--write-kubeconfig", str(self.kubeconfig),
               "--ca-out", str(self.ca), "--token", TOKEN,
               "--listen", f"127.0.0.1:{self.port}", "--seed", str(seed)] + list(flags)
        self.log_file = open(workdir / "sim.log", "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not (self.kubeconfig.exists() and self.ca.exists()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podalloc sim did not start: {(workdir / 'sim.log').read_text()}")
            time.sleep(0.02)
        time.sleep(0.05)
        self.ctx = ssl.create_default_context(cafile=str(self.ca))
        self.base = f"https://127.0.0.1:{self.port}"
        self.lines = {}
        self.lock = threading.Lock()
        self.stop_poll = threading.Event()
        self.poller = threading.Thread(target=self._poll_log, daemon=True)
        self.poller.start()

    def call(self, method, path, body=None, auth=False):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", "Bearer " + TOKEN)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def _poll_log(self):
        # The log keeps the last 1000 requests: read it often enough to miss none.
        while not self.stop_poll.is_set():
            self.fetch_log()
            self.stop_poll.wait(0.2)

    def fetch_log(self):
        try:
            _, body = self.call("GET", "/sim/log")
        except OSError:
            return
        new = []
        with self.lock:
            for line in body.decode().splitlines():
                if line.strip():
                    entry = json.loads(line)
                    if entry["seq"] not in self.lines:
                        new.append(entry)
                    self.lines[entry["seq"]] = entry
        if self.profiles is not None:
            self._read_profiles(new)

    def _read_profiles(self, entries):
        for e in entries:
            m = EXEC_NAME.search(e.get("name") or "")
            if e.get("verb") != "create" or e.get("status") != 201 or not m:
                continue
            s, body = self.call("GET", f"/api/v1/namespaces/{self.ns}/pods/{e['name']}?{FAULT_MARK}", auth=True)
            if s == 200:
                labels = json.loads(body).get("metadata", {}).get("labels", {})
                self.profiles[int(m.group(1))] = int(labels.get(PROFILE_LABEL, 0))

    def log(self):
        self.fetch_log()
        with self.lock:
            seqs = sorted(self.lines)
            if seqs and seqs[-1] - seqs[0] + 1 != len(seqs):
                raise RuntimeError("the simulator's request log lost lines (poll more often)")
            return [self.lines[s] for s in seqs]

    def stats(self):
        return json.loads(self.call("GET", "/sim/stats")[1])

    def phase(self, name, mark):
        s, body = self.call("GET", f"/api/v1/namespaces/{NS}/pods/{name}?{mark}", auth=True)
        return json.loads(body).get("status", {}).get("phase") if s == 200 else None

    def set_phase(self, name, phase, exit_code=0, reason=""):
        body = {"phase": phase}
        if phase == "Failed":
            body.update(exitCode=exit_code, reason=reason)
        return self.call("POST", f"/sim/pods/{NS}/{name}/phase", body)[0]

    def delete_by_hand(self, name, mark):
        return self.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}?{mark}", auth=True)

    def relabel(self, name, labels):
        return patch_labels(self, name, labels)

    def seed_driver(self, app=APP, driver=DRIVER):
        """Driver pod `driver` of `app`, Running (as `real.RealSide.seed_driver`)."""
        pod = {"metadata": {"name": driver, "labels": {"spark-app-selector": app, "spark-role": "driver"}},
               "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:peer"}]},
               "status": {"phase": "Running"}}
        status, body = self.call("POST", f"/sim/pods/{NS}", pod)
        if status != 201:
            raise RuntimeError(f"seeding the driver pod: {status} {body[:300]}")

    def close(self):
        self.stop_poll.set()
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log_file.close()


def pod_name(i):
    return f"{APP}-exec-{i}"


def patch_labels(sim, name, labels):
    req = urllib.request.Request(f"{sim.base}/api/v1/namespaces/{NS}/pods/{name}?{FAULT_MARK}",
                                 data=json.dumps({"metadata": {"labels": labels}}).encode(), method="PATCH")
    req.add_header("Content-Type", "application/merge-patch+json")
    req.add_header("Authorization", "Bearer " + TOKEN)
    try:
        with urllib.request.urlopen(req, context=sim.ctx, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def phase_of(sim, name):
    return sim.phase(name, FAULT_MARK)


def drive_faults(sim, events, t0, stop):
    """Applies the scenario's faults at their times after t0 (time.monotonic())."""
    timers = []
    for ev in events:
        if "target" in ev:
            continue
        at = t0 + ev.get("at_ms", 0) / 1000.0

        def act(ev=ev, at=at):
            while time.monotonic() < at and not stop.is_set():
                time.sleep(min(0.01, max(0.0, at - time.monotonic())))
            if "when_running_ms" in ev:
                # Relative to the pod's start, not the allocator's: the same fault on both
                # sides however long each took to create the pod.
                target = ev.get("fail", ev.get("succeed", ev.get("delete")))
                while not stop.is_set() and phase_of(sim, pod_name(target)) != "Running":
                    time.sleep(0.05)
                stop.wait(ev["when_running_ms"] / 1000.0)
                if stop.is_set():
                    return
            if "fail" in ev:
                sim.set_phase(pod_name(ev["fail"]), "Failed", ev.get("exit_code", 1), "Error")
            elif "succeed" in ev:
                sim.set_phase(pod_name(ev["succeed"]), "Succeeded")
            elif "delete" in ev:
                # By hand, as `kubectl delete pod` does (default grace period).
                # The marker parameter keeps it out of the decisions.
                sim.delete_by_hand(pod_name(ev["delete"]), FAULT_MARK)
            elif "hide" in ev:
                # Never reported: relabelled (spark-role) as soon as it exists, so no list
                # of the app's executors shows it.
                pending = set(ev["hide"])
                while pending and not stop.is_set():
                    for i in sorted(pending):
                        s, _ = sim.relabel(pod_name(i), {"spark-role": "hidden"})
                        if s == 200:
                            pending.discard(i)
                    time.sleep(0.005)
            elif "hold" in ev:
                # Never starts: pinned Pending (unscheduled) as soon as the pod exists.
                pending = set(ev["hold"])
                while pending and not stop.is_set():
                    for i in sorted(pending):
                        s, _ = sim.call("POST", f"/sim/pods/{NS}/{pod_name(i)}/phase", {"phase": "Pending"})
                        if s == 200:
                            pending.discard(i)
                    time.sleep(0.02)

        t = threading.Thread(target=act, daemon=True)
        t.start()
        timers.append(t)
    return timers


def mark_t0(sim):
    """A request this script marks, whose log time is the side's start in the server's clock."""
    sim.call("GET", f"/api/v1/namespaces/{sim.ns}/pods/{DRIVER}?{FAULT_MARK}&t0=1", auth=True)


def t0_of(log):
    for e in log:
        if e.get("query", {}).get("t0") == "1":
            return e["ms"]
    raise RuntimeError("the start marker is not in the request log")


def decisions(log, t0_ms, ns=NS):
    """The pod creates and deletes of a request log: [(ms after t0, op, [ids], status)]."""
    out = []
    prefix = f"/api/v1/namespaces/{ns}/pods"
    for e in log:
        if not e["path"].startswith(prefix) or e.get("user") is None or "peerFault" in e.get("query", {}):
            continue
        verb = e.get("verb")
        ms = e["ms"] - t0_ms
        if verb == "create":
            m = EXEC_NAME.search(e.get("name") or "")
            if m:
                out.append((ms, "create", [int(m.group(1))], e["status"]))
        elif verb == "delete":
            m = EXEC_NAME.search(e["path"])
            if m:
                out.append((ms, "delete", [int(m.group(1))], e["status"], "by name"))
        elif verb == "deletecollection":
            sel = e.get("query", {}).get("labelSelector", "")
            m = IDS_IN.search(sel)
            ids = sorted(int(x) for x in m.group(1).split(",") if x.strip()) if m else []
            tag = "delete" if m else "delete-all"
            field = e.get("query", {}).get("fieldSelector", "")
            out.append((ms, tag, ids, e["status"], "collection" + (f" {field}" if field else "")))
    return out


def created_profiles(log):
    """Each executor's resource profile from a request log whose pod creates carry the labels
    sent ("labels": the real server's audit log, where the allocators' pod creates are logged
    at level Request, peers/real.py): {id: profile}, the pod's label
    spark-exec-resourceprofile-id, profile 0 where it is absent. Only the allocator's
    creates that made a pod count (status 201)."""
    out = {}
    for e in log:
        m = EXEC_NAME.search(e.get("name") or "")
        if e.get("verb") != "create" or e.get("status") != 201 or e.get("user") is None or not m:
            continue
        if "labels" not in e:
            raise RuntimeError(f"the create of {e.get('name')} carries no labels (not logged at level Request)")
        out[int(m.group(1))] = int(e["labels"].get(PROFILE_LABEL, 0))
    return out


def run_spark(args, sc, sim, workdir, t_start, started):
    scen = workdir / "scenario.json"
    scen.write_text(json.dumps(sc))
    out = workdir / "spark-decisions.jsonl"
    cp = (Path(args.jar_dir) / "classpath.txt").read_text().strip()
    jar = Path(args.jar_dir) / "spark-peer.jar"
    cmd = ["java", "-Xss4m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
           "-cp", f"{jar}:{cp}", "podalloc.peer.SparkPeer",
           "--kubeconfig", str(sim.kubeconfig), "--scenario", str(scen), "--out", str(out),
           "--namespace", sim.ns, "--app-id", APP, "--driver-pod", DRIVER]
    env = dict(os.environ, SPARK_USER="peer", SPARK_LOCAL_IP="127.0.0.1")
    for k in list(env):
        if k.startswith("KUBERNETES_"):
            del env[k]
    err = open(workdir / "spark.stderr", "w")
    proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 120
    while True:
        if out.exists() and out.read_text().startswith("{"):
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the Spark harness did not start:\n{(workdir / 'spark.stderr').read_text()[-3000:]}")
        time.sleep(0.01)
    t0 = time.monotonic()
    mark_t0(sim)
    started.set()
    first = json.loads(out.read_text().splitlines()[0])
    stop = threading.Event()
    drive_faults(sim, sc.get("events", []), t0 - first["ms"] / 1000.0, stop)
    try:
        proc.wait(sc.get("duration_ms", 20000) / 1000.0 + 60)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    err.close()
    if proc.returncode != 0:
        raise RuntimeError(f"the Spark harness exited {proc.returncode}:\n{(workdir / 'spark.stderr').read_text()[-3000:]}")
    version = first.get("spark", "?")
    return (t0 - first["ms"] / 1000.0 - t_start) * 1000.0, version


def state_dir(workdir):
    """Where the podalloc side keeps its state file: in memory (/dev/shm) where there is one.
    Each tick saves the state twice with fsync (file and directory); on a disk busy with
    other work that took up to 2.6 s a tick, which Spark, keeping its state in memory, never
    pays (docs/semantics.md D7)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = shm / ("podalloc-peer-" + str(abs(hash(str(workdir)))))
        d.mkdir(exist_ok=True)
        return d
    return workdir


def target_changes(sc):
    """The scenario's target changes as [(at_ms, {profile: target})], each with the targets of
    every profile that has one by then (a target event without "profile" is profile 0's);
    the first at 0 ms (profile 0's target 0 unless the scenario sets one then)."""
    by_time = {}
    for e in sc.get("events", []):
        if "target" in e:
            by_time.setdefault(e.get("at_ms", 0), []).append(e)
    current, out = {0: 0}, []
    for at in sorted(set(by_time) | {0}):
        for e in by_time.get(at, []):
            p = int(e.get("profile", 0))
            if p != 0 and str(p) not in sc.get("profiles", {}):
                raise ValueError(f"{sc.get('name')}: a target for profile {p}, not under \"profiles\"")
            current[p] = e["target"]
        out.append((at, dict(current)))
    return out


def podalloc_cmd(args, sc, sim, workdir, target):
    """`podalloc run` for the scenario with `target`: a number (profile 0's) or
    {profile: target} (resource profiles other than 0 as --profile-target P=N)."""
    targets = target if isinstance(target, dict) else {0: target}
    ms = lambda v: f"{int(v)}ms"
    cmd = [args.podalloc, "--kubeconfig", str(sim.kubeconfig), "--app-id", APP, "-n", sim.ns,
           "--image", sc.get("image", "spark:peer"), "--driver-pod", DRIVER,
           "--policy", sc.get("policy", "spark-3.x"),
           "--state-file", str(state_dir(workdir) / "state.json"), "--no-events", "--log-format", "json"]
    if sc.get("defaults"):
        # podalloc's own defaults for everything the scenario leaves out (at_defaults).
        for flag, key in (("--batch-size", "batch_size"), ("--batch-delay", "batch_delay_ms"),
                          ("--executor-idle-timeout", "executor_idle_timeout_ms"),
                          ("--creation-timeout", "creation_timeout_ms"), ("--max-pending", "max_pending")):
            if key in sc:
                cmd += [flag, str(sc[key]) if flag in ("--batch-size", "--max-pending") else ms(sc[key])]
        return cmd + list(sc.get("podalloc_flags", [])) + run_args(targets)
    cmd += ["--batch-delay", ms(sc.get("batch_delay_ms", 1000))]
    if "--batch-size" not in sc.get("podalloc_flags", []):
        cmd += ["--batch-size", str(sc.get("batch_size", 5))]
    if "executor_idle_timeout_ms" in sc:
        cmd += ["--executor-idle-timeout", ms(sc["executor_idle_timeout_ms"])]
    if "creation_timeout_ms" in sc:
        cmd += ["--creation-timeout", ms(max(sc["creation_timeout_ms"], 5 * sc.get("batch_delay_ms", 1000)))]
    if "max_pending" in sc:
        cmd += ["--max-pending", str(sc["max_pending"])]
    cmd += list(sc.get("podalloc_flags", []))
    # Each target change restarts `run` (the state carries over): --force-target makes the
    # new --target the store's (without it --target only seeds a store that has none), and
    # the loop ticks every batch delay at rest too (--idle-interval), as the Spark side polls
    # at a fixed pace whether or not anything is in flight.
    return cmd + run_args(targets, ms(sc.get("batch_delay_ms", 1000)))


def run_args(targets, idle=None):
    """`run` with the targets of every profile ({profile: n}) forced, and the idle interval."""
    cmd = ["run", "--target", str(targets.get(0, 0)), "--force-target"]
    if idle:
        cmd += ["--idle-interval", idle]
    for p, n in sorted(targets.items()):
        if p != 0:
            cmd += ["--profile-target", f"{p}={n}"]
    return cmd


# What "at the allocators' defaults" leaves out of a scenario: each side then runs with its
# own defaults (Spark 3.5: batch 5; 4.0: batch 10; batch delay 1 s; polling every 30 s with
# the watch source on; idle timeout 60 s; creation timeout 600 s; no pending limit; podalloc
# --policy spark-3.x: batch 5, batch delay 1 s, idle interval 30 s, the same timeouts).
TUNABLES = ("batch_size", "batch_delay_ms", "poll_ms", "executor_idle_timeout_ms", "creation_timeout_ms",
            "max_pending")


def at_defaults(sc):
    """The scenario at both allocators' defaults: its tunables left out, its name with
    "@defaults" (the same faults, targets and simulator)."""
    out = {k: v for k, v in sc.items() if k not in TUNABLES}
    out.update(name=sc["name"] + "@defaults", defaults=True)
    return out


def explanations(sc, real=False):
    """The decisions a scenario expects to differ: "explained", with "explained_real" on the
    real control plane and "explained_defaults" at the allocators' defaults."""
    e = dict(sc.get("explained", {}))
    if real:
        e.update(sc.get("explained_real", {}))
    if sc.get("defaults"):
        e.update(sc.get("explained_defaults", {}))
    return e


def run_podalloc(args, sc, sim, workdir, t_start):
    targets = target_changes(sc)
    log = open(workdir / "podalloc.log", "w")
    t0 = time.monotonic()
    mark_t0(sim)
    stop = threading.Event()
    drive_faults(sim, sc.get("events", []), t0, stop)
    try:
        for i, (at_ms, target) in enumerate(targets):
            at = t0 + at_ms / 1000.0
            end = t0 + (targets[i + 1][0] if i + 1 < len(targets) else sc.get("duration_ms", 20000)) / 1000.0
            time.sleep(max(0.0, at - time.monotonic()))
            proc = subprocess.Popen(podalloc_cmd(args, sc, sim, workdir, target), stdout=log, stderr=log)
            time.sleep(max(0.0, end - time.monotonic()))
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            rc = proc.wait(30)
            if rc not in (0, -signal.SIGTERM):
                raise RuntimeError(f"podalloc run exited {rc}: {(workdir / 'podalloc.log').read_text()[-2000:]}")
    finally:
        stop.set()
        log.close()
        sd = state_dir(workdir)
        if sd != workdir:
            for f in sd.iterdir():
                if f.name == "state.json":
                    (workdir / "state.json").write_bytes(f.read_bytes())
                f.unlink()
            sd.rmdir()
    return (t0 - t_start) * 1000.0


def batches(ds, op, window_ms):
    """The ids of `op` decisions grouped by tick: a gap of half a batch delay ends a group."""
    out, last = [], None
    for d in ds:
        if d[1] != op:
            continue
        if last is None or d[0] - last > window_ms / 2:
            out.append([])
        out[-1].extend(d[2])
        last = d[0]
    return out


def lag_ms(spark, pa):
    """The largest delay of a Spark decision behind podalloc's same decision (informative)."""
    at = {}
    for d in pa:
        for i in d[2]:
            at.setdefault((d[1], i), d[0])
    lags = [d[0] - at[(d[1], i)] for d in spark for i in d[2] if (d[1], i) in at]
    return int(max(lags)) if lags else 0


def cumulative(ds, window_ms, end_ms):
    n = int(end_ms // window_ms) + 2
    c = [0] * n
    for d in ds:
        k = max(0, int(d[0] // window_ms))
        if k < n:
            c[k] += len(d[2])
    for k in range(1, n):
        c[k] += c[k - 1]
    return c


def within_windows(a, b, w):
    for k in range(len(a)):
        lo = b[max(0, k - w)]
        hi = b[min(len(b) - 1, k + w)]
        if not lo <= a[k] <= hi:
            return False, k
    return True, None


def without_resent_deletes(ds):
    """The decisions less each delete of an id the same side had already asked to delete (D8:
    Spark's lifecycle manager sends a delete again while the pod is still terminating in its
    next snapshot; a second delete of a terminating pod changes nothing, so it is the same
    decision)."""
    seen, out = set(), []
    for d in ds:
        if d[1] == "delete":
            ids = [i for i in d[2] if i not in seen]
            seen.update(d[2])
            if not ids:
                continue
            d = (d[0], d[1], ids, *d[3:])
        out.append(d)
    return out


def tolerance_ms(sc):
    """How far apart the two sides' same decision may be: one batch delay (the allocator's
    tick) plus Spark's poll period (a change reaches Spark's allocator at its next poll, then
    its next tick; podalloc lists and decides in one tick), D6. At the defaults: 1 s + 30 s."""
    b = sc.get("batch_delay_ms", 1000)
    return b + sc.get("poll_ms", 30000 if sc.get("defaults") else b)


def timing(sc, spark, pa):
    """Each decision made by both sides, in podalloc's order, with Spark's lag behind
    podalloc's (ms, negative when Spark was first), and what the lag may be: within the
    tolerance of the lag the decision before it already had (clamped at 0), since Spark's
    delays add up over dependent steps (D6: each next batch waits for the last to be seen).
    Returns [(op, id, lag, lo, hi)]."""
    at_s = {}
    for d in spark:
        for i in d[2]:
            at_s.setdefault((d[1], i), d[0])
    t = tolerance_ms(sc)
    out, prev = [], 0.0
    for d in sorted(pa, key=lambda d: d[0]):
        for i in d[2]:
            if (d[1], i) not in at_s:
                continue
            lag = at_s[(d[1], i)] - d[0]
            lo, hi = min(0.0, prev) - t, max(0.0, prev) + t
            out.append((d[1], i, lag, lo, hi))
            prev = lag
    return out


def timing_summary(sc, spark, pa):
    """(decisions timed, Spark's largest lag, the largest part of a lag beyond the decision
    before it (what the tolerance bounds), the tolerance), in ms."""
    t = timing(sc, without_resent_deletes(spark), without_resent_deletes(pa))
    tol = tolerance_ms(sc)
    if not t:
        return 0, 0, 0, tol
    used = [max(lag - (hi - tol), (lo + tol) - lag) for _, _, lag, lo, hi in t]
    return len(t), int(max(lag for _, _, lag, _, _ in t)), int(max(used)), tol


def compare(sc, spark, pa, profiles=None, ends=None):
    """Differences between the two decision lists, one per decision, as {key: description}: a
    key names the decision ("create 6: time", "delete 3: request"), so a scenario explains
    the decisions it expects to differ, never a whole kind of difference. `profiles`: each
    side's {executor id: resource profile} (scenarios with "profiles"); `ends`: each side's
    executors left at the end ({id: phase}, live pods only).

    Per decision made by either side:
      "<op> N: spark only" / "podalloc only"  made by one side only;
      "<op> N: order"     another place among that side's creates (or deletes), or (a delete)
                          after another number of creates than the other side's;
      "<op> N: tick"      sent in a tick with other decisions than the other side's same one;
      "delete N: request" sent another way (one delete-collection, or by name);
      "<op> N: time"      further from the other side's than tolerance_ms (see timing);
      "create N: profile" of another resource profile;
      "end N: ..."        left at the end by one side only;
      "delete-all"        a delete by label naming no ids (Spark's, never expected)."""
    spark, pa = without_resent_deletes(spark), without_resent_deletes(pa)
    diffs = {}
    window = sc.get("batch_delay_ms", 1000)
    for op in ("create", "delete"):
        s = [i for d in spark if d[1] == op for i in d[2]]
        p = [i for d in pa if d[1] == op for i in d[2]]
        for i in s:
            if i not in p:
                diffs[f"{op} {i}: spark only"] = f"spark {s} / podalloc {p}"
        for i in p:
            if i not in s:
                diffs[f"{op} {i}: podalloc only"] = f"spark {s} / podalloc {p}"
        common = [i for i in s if i in p]
        cp = [i for i in p if i in s]
        for a, b in zip(common, cp):
            if a != b:
                diffs[f"{op} {a}: order"] = f"{op}s: spark {common} / podalloc {cp}"
        # Ticks: the decisions of one allocator tick go out back to back (Spark's one after
        # another, ~20 ms apart; podalloc's within a few ms), a tick apart from the next.
        gs = {i: b for b in batches(spark, op, window) for i in b}
        gp = {i: b for b in batches(pa, op, window) for i in b}
        for i in common:
            ws, wp = sorted(set(gs[i]) & set(cp)), sorted(set(gp[i]) & set(common))
            if ws != wp:
                diffs[f"{op} {i}: tick"] = f"spark's tick {gs[i]} / podalloc's {gp[i]}"
    # The interleaving: how many of the creates both made come before each delete.
    both_c = {i for d in spark if d[1] == "create" for i in d[2]} & {i for d in pa if d[1] == "create" for i in d[2]}
    def before(ds):
        n, out = 0, {}
        for d in ds:
            if d[1] == "create":
                n += len([i for i in d[2] if i in both_c])
            elif d[1] == "delete":
                for i in d[2]:
                    out[i] = n
        return out
    bs, bp = before(spark), before(pa)
    for i in bs:
        if i in bp and bs[i] != bp[i]:
            diffs[f"delete {i}: order"] = f"after {bs[i]} creates in spark / {bp[i]} in podalloc"
    # How each delete is sent: one delete-collection (by label, maybe only Pending) or by name.
    hs = {i: d[4] for d in spark if d[1] == "delete" for i in d[2]}
    hp = {i: d[4] for d in pa if d[1] == "delete" for i in d[2]}
    for i in hs:
        if i in hp and hs[i] != hp[i]:
            diffs[f"delete {i}: request"] = f"spark {hs[i]} / podalloc {hp[i]}"
    for op, i, lag, lo, hi in timing(sc, spark, pa):
        if not lo <= lag <= hi:
            diffs[f"{op} {i}: time"] = (f"spark {int(lag)} ms after podalloc (allowed {int(lo)}..{int(hi)}: "
                                        f"{tolerance_ms(sc)} ms beyond the decision before it)")
    if sc.get("profiles"):
        sp, pp = profiles or ({}, {})
        for i in sorted(both_c):
            if sp.get(i) != pp.get(i):
                diffs[f"create {i}: profile"] = f"spark's profile {sp.get(i)} / podalloc's {pp.get(i)}"
    if ends is not None:
        es, ep = ends
        for i in sorted(set(es) | set(ep)):
            if i not in ep:
                diffs[f"end {i}: spark only"] = f"left by spark ({es[i]}), not by podalloc"
            elif i not in es:
                diffs[f"end {i}: podalloc only"] = f"left by podalloc ({ep[i]}), not by spark"
    extra = [d for d in spark if d[1] == "delete-all"]
    if extra:
        diffs["delete-all"] = f"spark deletes by label without ids: {extra}"
    return diffs


def end_state(sim):
    """The executors a side left: {id: phase} of its app's executor pods not being deleted
    (the script's own list, marked, so not a decision)."""
    sel = urllib.parse.quote(f"spark-app-selector={APP},spark-role=executor")
    s, body = sim.call("GET", f"/api/v1/namespaces/{sim.ns}/pods?labelSelector={sel}&{FAULT_MARK}", auth=True)
    if s != 200:
        raise RuntimeError(f"listing the executors left: {s} {body[:300]}")
    out = {}
    for pod in json.loads(body).get("items", []):
        m = EXEC_NAME.search(pod["metadata"]["name"])
        phase = pod.get("status", {}).get("phase")
        if m and not pod["metadata"].get("deletionTimestamp") and phase in ("Pending", "Running", None):
            out[int(m.group(1))] = phase or "Pending"
    return out


def run_side(args, sc, side, d, started, result, server=None):
    """One side on its own fresh simulator (or `server`, its namespace on a real control
    plane); `started` is set once its allocator runs."""
    try:
        sim = server or Sim(args.podalloc, sc.get("seed", 1), sc.get("sim", []), d, bool(sc.get("profiles")))
        try:
            sim.seed_driver(APP, DRIVER)
            if side == "spark":
                t0_ms, version = run_spark(args, sc, sim, d, sim.started, started)
                result["version"] = version
            else:
                started.wait(180)
                t0_ms = run_podalloc(args, sc, sim, d, sim.started)
            ends = end_state(sim)
            log = sim.log()
            stats = sim.stats()
        finally:
            sim.close()
        (d / "end.json").write_text(json.dumps(ends, sort_keys=True) + "\n")
        result["end"] = ends
        (d / "requests.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
        (d / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
        ds = decisions(log, t0_of(log), sim.ns)
        (d / "decisions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in ds))
        result["decisions"], result["stats"] = ds, stats
        # The simulator reads each profile by a GET as the create is logged; the real server's
        # audit log carries the labels each create sent.
        result["profiles"] = (created_profiles(log) if server is not None and sc.get("profiles")
                              else getattr(sim, "profiles", None) or {})
        (d / "profiles.json").write_text(json.dumps(result["profiles"], sort_keys=True) + "\n")
    except Exception as e:  # reported by run_scenario
        result["error"] = e
    finally:
        started.set()


def real_sides(args, sc, work):
    """Both sides' namespaces on the real control plane (args.real), fresh for this run, and
    the kubelet emulator over them with the scenario's start-up latency."""
    import real
    unsupported = sorted({k for ev in sc.get("events", []) for k in REAL_UNSUPPORTED if k in ev}
                         | {f for f in sc.get("sim", []) if f.startswith("--") and f not in REAL_SIM_FLAGS})
    if unsupported:
        raise RuntimeError(f"not playable on the real control plane: {unsupported}")
    run = next(args.real_runs)
    base = re.sub(r"[^a-z0-9]+", "-", sc["name"].lower())[:40].strip("-")
    sides = {}
    for side in ("spark", "podalloc"):
        ns = f"{base}-{side}-{run}"
        args.real.namespace(ns, side)
        sides[side] = real.RealSide(args.real, ns)
    # The simulator's schedule (200 ms) and stop (500 ms) latencies, so both servers' pods
    # move alike.
    emu = real.Emulator(args.real, [s.ns for s in sides.values()], real.startup_ms(sc.get("sim", [])), work,
                        schedule_ms=200, stop_ms=500)
    try:
        # The driver pods first, Running before either allocator starts, as the simulator
        # seeds them (podalloc creates no executor while its driver pod is pending).
        for s in sides.values():
            s.seed_driver(APP, DRIVER)
        for s in sides.values():
            s.wait_running(DRIVER, 60)
    except Exception:
        emu.close()
        raise
    return sides, emu


def run_scenario(args, sc, outdir):
    """Runs both sides of scenario `sc` at once, each on its own simulator (or, with --real,
    in its own namespace of one real control plane): the podalloc side starts when the Spark
    harness has started its allocator (after the JVM's start-up), so the two runs overlap and
    neither waits for the other's CPU-heavy start."""
    name = sc["name"]
    work = outdir / name
    work.mkdir(parents=True, exist_ok=True)
    results = {"spark": {}, "podalloc": {}}
    started = threading.Event()
    threads = []
    servers, emu = real_sides(args, sc, work) if getattr(args, "real", None) else ({}, None)
    try:
        for side in ("spark", "podalloc"):
            d = work / side
            d.mkdir(parents=True, exist_ok=True)
            t = threading.Thread(target=run_side,
                                 args=(args, sc, side, d, started, results[side], servers.get(side)))
            t.start()
            threads.append(t)
        for t in threads:
            t.join()
    finally:
        if emu:
            emu.close()
    for side in ("spark", "podalloc"):
        if "error" in results[side]:
            raise RuntimeError(f"{side} side: {results[side]['error']}")
    diffs = compare(sc, results["spark"]["decisions"], results["podalloc"]["decisions"],
                    (results["spark"]["profiles"], results["podalloc"]["profiles"]),
                    (results["spark"]["end"], results["podalloc"]["end"]))
    explained = explanations(sc, bool(getattr(args, "real", None)))
    unexplained = {k: v for k, v in diffs.items() if k not in explained}
    return {"name": sc["name"], "spark_version": results["spark"].get("version", "?"), "diffs": diffs,
            "unexplained": unexplained,
            "explained_not_seen": sorted(k for k in explained if k not in diffs),
            "spark": (results["spark"]["decisions"], results["spark"]["stats"]),
            "podalloc": (results["podalloc"]["decisions"], results["podalloc"]["stats"]),
            "profiles": (results["spark"]["profiles"], results["podalloc"]["profiles"]),
            "end": (results["spark"]["end"], results["podalloc"]["end"])}


def recompare(sc, outdir):
    """The comparison of the decisions an earlier run kept in outdir (--out)."""
    def load(side, f, empty):
        p = outdir / sc["name"] / side / f
        return json.loads(p.read_text()) if p.exists() else empty
    spark, pa = ([tuple(json.loads(l)) for l in
                  (outdir / sc["name"] / side / "decisions.jsonl").read_text().splitlines()]
                 for side in ("spark", "podalloc"))
    profiles = tuple({int(k): v for k, v in load(side, "profiles.json", {}).items()} for side in ("spark", "podalloc"))
    ends = tuple(load(side, "end.json", None) for side in ("spark", "podalloc"))
    ends = None if None in ends else tuple({int(k): v for k, v in e.items()} for e in ends)
    diffs = compare(sc, spark, pa, profiles, ends)
    explained = explanations(sc)
    return {"name": sc["name"], "spark_version": "(recompared)", "diffs": diffs,
            "unexplained": {k: v for k, v in diffs.items() if k not in explained},
            "explained_not_seen": sorted(k for k in explained if k not in diffs),
            "spark": (spark, {}), "podalloc": (pa, {}), "profiles": profiles, "end": ends}


def fmt(ds, profiles=None):
    """c1,2@120 (created 1 and 2 at 120 ms); with profiles c1,2/1@120 (of profile 1)."""
    def one(d):
        ps = sorted({profiles.get(i) for i in d[2]}, key=str) if profiles else []
        tag = "/" + ",".join(map(str, ps)) if ps and ps != [0] else ""
        return f"{d[1][0]}{','.join(map(str, d[2]))}{tag}@{int(d[0])}"
    return " ".join(one(d) for d in ds) or "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jar-dir", required=True, help="the harness build dir (spark-peer.jar, classpath.txt)")
    ap.add_argument("--podalloc", default=str(HERE.parent / "target/release/podalloc"))
    ap.add_argument("--scenarios", default=str(HERE / "scenarios"))
    ap.add_argument("--only", nargs="*", help="scenario names (default: all)")
    ap.add_argument("--out", help="keep each run's logs here (default: a temporary dir, removed "
                                  "when every scenario passes)")
    ap.add_argument("--verbose", action="store_true", help="print both decision lists")
    ap.add_argument("--jobs", type=int, default=2,
                    help="scenarios run at once (each on its own two simulators; default 2)")
    ap.add_argument("--real", action="store_true",
                    help="on one real control plane (scripts/controlplane.sh, the kubelet emulator) instead of "
                         "simulators; only the scenarios marked \"real\": true (those it can play)")
    ap.add_argument("--defaults", action="store_true",
                    help="play the scenarios at both allocators' defaults (their tunables left out)")
    ap.add_argument("--recompare", metavar="DIR",
                    help="compare the decisions an earlier --out DIR kept, without running anything")
    a = ap.parse_args()
    outdir = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="spark-peer-"))
    files = sorted(Path(a.scenarios).glob("*.json"))
    if a.only:
        files = [f for f in files if any(f.stem.startswith(o) for o in a.only)]
    a.real_runs = itertools.count(1)
    if not a.real:
        # "real_only": a scenario the simulator cannot serve (Spark's watch source).
        files = [f for f in files if not json.loads(f.read_text()).get("real_only")]
    if a.real and not a.recompare:
        import real
        files = [f for f in files if json.loads(f.read_text()).get("real")]
        if not files:
            print("spark-peer: no scenario marked \"real\" is selected" + (" (--only)" if a.only else ""))
            sys.exit(0 if a.only else 1)
        a.real = real.ControlPlane(outdir / "controlplane")
        print(f"spark-peer: real control plane at {a.real.url} (files in {outdir / 'controlplane'})", flush=True)
    else:
        a.real = None
    def one(f):
        t = time.monotonic()
        try:
            sc = json.loads(f.read_text())
            if a.defaults:
                sc = at_defaults(sc)
            r = recompare(sc, Path(a.recompare)) if a.recompare else run_scenario(a, sc, outdir)
            r["sc"] = sc
            # A scenario that differs fails. It is played once more, on fresh simulators, only
            # to say whether the difference comes back (the same unexplained keys) or comes
            # and goes; a clean second run does not make it pass.
            if r["unexplained"] and not a.recompare:
                again = outdir / "again"
                again.mkdir(exist_ok=True)
                r["second_run"] = run_scenario(a, sc, again)
        except Exception as e:  # a harness failure is a failure, never a skip
            return f, None, e, time.monotonic() - t
        return f, r, None, time.monotonic() - t

    failed = 0
    with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for f, r, err, took in pool.map(one, files):
            if err is not None:
                print(f"FAIL {f.stem}: {err}", flush=True)
                failed += 1
                continue
            status = "ok" if not r["unexplained"] else "FAIL"
            failed += bool(r["unexplained"])
            n, lag, step, tol = timing_summary(r["sc"], r["spark"][0], r["podalloc"][0])
            where = "real kube-apiserver, " if a.real else ""
            print(f"{status:4} {r['name']} ({where}Spark {r['spark_version']}, {took:.0f}s; {n} decisions timed, "
                  f"Spark's at most {lag} ms behind, at most {step} ms beyond the decision before; allowed {tol})")
            for k, v in r["diffs"].items():
                tag = "explained" if k not in r["unexplained"] else "UNEXPLAINED"
                print(f"     {tag} {k}: {v}")
            if "second_run" in r:
                sr = r["second_run"]
                same = sorted(sr["unexplained"]) == sorted(r["unexplained"])
                print(f"     played again: {'the same unexplained differences' if same else 'other differences'}"
                      f" ({', '.join(sr['unexplained']) or 'none'})")
                for k in sr["unexplained"]:
                    if k not in r["unexplained"]:
                        print(f"       second run: {k}: {sr['diffs'][k]}")
            for k in r["explained_not_seen"]:
                print(f"     (explained difference {k} not seen this run)")
            if a.verbose or r["unexplained"]:
                print(f"     spark:    {fmt(r['spark'][0], r['profiles'][0])}")
                print(f"     podalloc: {fmt(r['podalloc'][0], r['profiles'][1])}")
            sys.stdout.flush()
    if a.real:
        a.real.stop()
    if not a.out and not failed:
        # Nothing to look at: the temporary directory goes (--out DIR keeps the logs).
        shutil.rmtree(outdir, ignore_errors=True)
        print("logs removed: every scenario passed (--out DIR keeps them)")
    else:
        print(f"logs in {outdir}")
    print(f"spark-peer: {len(files) - failed} passed, {failed} failed" + (" (real control plane)" if a.real else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
