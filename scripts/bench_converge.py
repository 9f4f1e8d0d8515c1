#!/usr/bin/env python3
"""Benchmark 2, convergence: `podalloc run --target N --until-converged` from 0 executors
on a fresh `podalloc sim` per run, for each allocation policy, in two scenarios:

- fixed:  every pod starts 5 s after it is scheduled (the simulator's start-up latency),
          2 % of them fail instead of starting (the simulator's failure rate);
- jitter: start-up uniform in [2.5 s, 7.5 s] (mean 5 s), 2 % failures.

In both, 10 % of the pods created during the first 30 s of the run cannot be scheduled
until t = 30 s, when "a node is added", and then start 5 s later (t = 35 s).

The simulator has no per-pod start-up jitter and no "some pods unschedulable" mode, so a
helper thread per simulator plays that part of the kubelet/scheduler through the
simulator's side door, which the API request counts do not include: it polls
`GET /sim/stats` for newly created executor ids every 50 ms and pins pods with
`POST /sim/pods/{ns}/{name}/phase` (Pending to hold one, Running or Failed to start or fail
it). A held pod is Pending without a node, but shows no `PodScheduled=False/Unschedulable`
condition (the simulator sets that only with zero nodes), so the adaptive policy sees
it as "not yet scheduled", not as "unschedulable".

All runs of a benchmark go concurrently (each policy against its own simulator): a run is
mostly asleep between 1 s ticks, and this keeps the whole benchmark within minutes. The
seed policy (batches of 5, nothing new while anything is pending) needs about 20 minutes
for 1,000 executors, so it runs for a fixed window and its time and request count are
extrapolated from its steady rate after the unschedulable period (stated as such).
"""

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from datetime import datetime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_sim  # noqa: E402

APP = "spark-bench"
NS = "default"

POLICIES = {
    "seed": [],
    "max-pending": ["--max-pending", "200"],
    "adaptive": ["--batch-size", "auto"],
    "adaptive+max-pending": ["--batch-size", "auto", "--max-pending", "200"],
}

TICK_RE = re.compile(r"^\[(\S+) +INFO +\S+\] tick (\d+): target=(\d+) running=(\d+) "
                     r"pending=(\d+) unacknowledged=(\d+) created=(\d+) deleted=(\d+)")


class Helper(threading.Thread):
    """The emulated part of the scheduler/kubelet (see the module doc)."""

    def __init__(self, sim, t0, jitter, hold_until, release_at, unsched_frac, fail_rate,
                 seed):
        super().__init__(daemon=True)
        self.sim, self.t0, self.jitter = sim, t0, jitter
        self.hold_until, self.release_at = hold_until, release_at
        self.unsched_frac, self.fail_rate = unsched_frac, fail_rate
        self.rng = random.Random(seed)
        self.stop_flag = threading.Event()
        self.seen = 0
        self.due = []  # (t, name, body)
        self.held = 0
        self.samples = []  # (t, requests)
        self.errors = 0

    def post_phase(self, conn, name, body):
        st, _ = self.sim.request("POST", f"/sim/pods/{NS}/{name}/phase",
                                 json.dumps(body).encode(), conn=conn)
        if st not in (200, 404):  # 404: podalloc deleted it meanwhile
            self.errors += 1

    def run(self):
        conn = self.sim.conn()
        while not self.stop_flag.is_set():
            now = time.time() - self.t0
            st, body = self.sim.request("GET", "/sim/stats", conn=conn)
            if st == 200:
                s = json.loads(body)
                self.samples.append((now, s["requests"]))
                ids = s["executor_ids_created"].get(APP, [])
                for i in ids[self.seen:]:
                    name = f"{APP}-exec-{i}"
                    r = random.Random(i * 7919 + 17)
                    if now < self.hold_until and r.random() < self.unsched_frac:
                        self.held += 1
                        self.post_phase(conn, name, {"phase": "Pending"})
                        self.due.append((self.release_at, name, {"phase": "Running"}))
                    elif self.jitter:
                        d = self.rng.uniform(2.5, 7.5)
                        body = ({"phase": "Failed", "exitCode": 1, "reason": "Error"}
                                if self.rng.random() < self.fail_rate else {"phase": "Running"})
                        self.due.append((now + d, name, body))
                self.seen = len(ids)
            keep = []
            for t, name, body in self.due:
                if t <= now:
                    self.post_phase(conn, name, body)
                else:
                    keep.append((t, name, body))
            self.due = keep
            self.stop_flag.wait(0.05)
        conn.close()


def parse_ticks(log_path):
    ticks = []
    t_first = None
    for line in open(log_path, errors="replace"):
        m = TICK_RE.match(line)
        if not m:
            continue
        t = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        ticks.append({"t": t, "tick": int(m.group(2)), "running": int(m.group(4)),
                      "pending": int(m.group(5)), "unack": int(m.group(6)),
                      "created": int(m.group(7)), "deleted": int(m.group(8))})
        t_first = t_first or t
    return ticks


def one_run(a, work, scenario, policy, t_start_barrier):
    name = f"{scenario}-{policy}"
    d = os.path.join(work, name)
    sim_args = ["--seed", "7"]
    if scenario == "fixed":
        sim_args += ["--startup-latency", "5s", "--failure-rate", str(a.failure_rate)]
    else:
        # Upper end of the jitter: the helper starts (or fails) each pod before this.
        sim_args += ["--startup-latency", "7500ms", "--failure-rate", "0"]
    sim = bench_sim.Sim(a.podalloc, os.path.join(d, "sim"), sim_args)
    try:
        t_start_barrier.wait()
        cmd = [a.podalloc, "--kubeconfig", sim.kubeconfig, "--app-id", APP,
               "--image", "busybox", "--state-file", os.path.join(d, "state.json"),
               "--log-level", "info", *POLICIES[policy],
               "run", "--target", str(a.target), "--until-converged"]
        if policy == "seed":
            cmd += ["--timeout", f"{a.seed_window}s"]
        else:
            cmd += ["--timeout", f"{a.max_time}s"]
        log_path = os.path.join(d, "podalloc.log")
        t0 = time.time()
        helper = Helper(sim, t0, scenario == "jitter", a.hold_until, a.release_at,
                        a.unschedulable, a.failure_rate, seed=zlib.crc32(name.encode()))
        helper.start()
        with open(log_path, "wb") as log:
            r = bench_sim.measure(cmd, stderr=log, timeout=a.max_time + 60)
        helper.stop_flag.set()
        helper.join()
        stats = sim.stats()
    finally:
        sim.stop()
    ticks = parse_ticks(log_path)
    out = {
        "scenario": scenario, "policy": policy, "args": POLICIES[policy], "rc": r["rc"],
        "wall": r["wall"], "cpu": r["cpu"], "rss_mib": r["rss_mib"],
        "ticks": len(ticks), "requests": stats["requests"], "lists": stats["lists"],
        "creates": stats["creates"], "deletes": stats["deletes"],
        "max_live": stats["max_live_pods_by_app"].get(APP, 0),
        "overshoot": max(0, stats["max_live_pods_by_app"].get(APP, 0) - a.target),
        "peak_pending": max((t["pending"] + t["unack"] for t in ticks), default=0),
        "held": helper.held, "helper_errors": helper.errors,
        "converged": r["rc"] == 0, "extrapolated": False,
        "running_end": ticks[-1]["running"] if ticks else 0,
        "log": log_path,
    }
    out["time"] = r["wall"]
    if policy == "seed" and r["rc"] != 0 and ticks:
        out.update(extrapolate(a, ticks, helper.samples, stats, t0))
    return out


def extrapolate(a, ticks, samples, stats, t0):
    """The seed policy's time to `target` and requests, from its steady rate in the second
    half of the window (after the unschedulable period): it makes a batch of 5 every
    start-up latency + a tick, so its rate is constant while nothing else changes."""
    t_end = ticks[-1]["t"] - t0
    run_end = ticks[-1]["running"]
    mid_t = max(t_end / 2, a.release_at + 10)
    mid = next((t for t in ticks if t["t"] - t0 >= mid_t), ticks[0])
    dt = (ticks[-1]["t"] - mid["t"])
    rate = (run_end - mid["running"]) / dt if dt > 0 else 0.0
    if rate <= 0:
        return {"extrapolated": True, "time": float("inf"), "requests_est": float("inf")}
    remaining = a.target - run_end
    t_more = remaining / rate
    tick_dt = dt / max(1, ticks[-1]["tick"] - mid["tick"])
    n_ticks = t_more / tick_dt
    # Each tick lists ceil(pods/500) pages; creates (and deletes of failed pods) on top.
    pages = 0.0
    steps = max(1, int(n_ticks))
    for k in range(steps):
        pods = run_end + remaining * (k + 0.5) / steps
        pages += math.ceil(max(pods, 1) / 500)
    pages *= n_ticks / steps
    fails = remaining * a.failure_rate / (1 - a.failure_rate)
    creates_more = remaining + fails
    return {
        "extrapolated": True,
        "window": t_end,
        "rate_per_s": rate,
        "time": t_end + t_more,
        "requests_measured": stats["requests"],
        "requests": int(round(stats["requests"] + pages + creates_more + fails)),
        "ticks_est": int(round(ticks[-1]["tick"] + n_ticks)),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--podalloc", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--target", type=int, default=1000)
    ap.add_argument("--scenarios", default="fixed,jitter")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seed-window", type=int, default=180,
                    help="seconds the seed policy runs before its result is extrapolated")
    ap.add_argument("--max-time", type=int, default=420,
                    help="--timeout for the other policies")
    ap.add_argument("--unschedulable", type=float, default=0.10)
    ap.add_argument("--hold-until", type=float, default=30.0,
                    help="pods created before this (s) may be unschedulable")
    ap.add_argument("--release-at", type=float, default=35.0,
                    help="when held pods start (node added at --hold-until, + start-up)")
    ap.add_argument("--failure-rate", type=float, default=0.02)
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="podalloc-bench-converge-")
    os.makedirs(work, exist_ok=True)
    combos = [(s, p) for s in a.scenarios.split(",") for p in a.policies.split(",")]
    barrier = threading.Barrier(len(combos))
    results = [None] * len(combos)
    errors = []

    def worker(i, s, p):
        try:
            results[i] = one_run(a, work, s, p, barrier)
        except Exception as e:  # noqa: BLE001
            errors.append(f"{s}/{p}: {e!r}")
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(i, s, p)) for i, (s, p) in
               enumerate(combos)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit("bench_converge: " + "; ".join(errors))
    res = {"target": a.target, "seed_window": a.seed_window,
           "unschedulable": a.unschedulable, "hold_until": a.hold_until,
           "release_at": a.release_at, "failure_rate": a.failure_rate,
           "policies": POLICIES, "runs": results}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    for r in results:
        print(f"[converge] {r['scenario']:6} {r['policy']:21} time {r['time']:7.1f}s"
              f"{' (extrapolated)' if r['extrapolated'] else ''} requests {r['requests']:5} "
              f"peak pending {r['peak_pending']:4} overshoot {r['overshoot']} "
              f"held {r['held']} rc {r['rc']}", file=sys.stderr)


if __name__ == "__main__":
    main()
