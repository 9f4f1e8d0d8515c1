#!/usr/bin/env python3
"""Benchmark 2, convergence: `podalloc run --target N --until-converged` from 0 executors
on a fresh `podalloc sim` per run, for each allocation policy, in two scenarios:

- fixed:  every pod starts 5 s after it is scheduled (`--startup-latency 5s`), 2 % of them
          fail instead of starting (`--failure-rate 0.02`);
- jitter: start-up uniform in [2.5 s, 7.5 s] (`--startup-jitter 0.5`), 2 % failures.

In both, 10 % of the pods reaching the scheduler during the first 30 s are held Pending
with `PodScheduled=False`, reason `Unschedulable` ("0/3 nodes are available: 3
Insufficient cpu.") until t = 30 s, when "a node is added", and then start after their
start-up latency (`--unschedulable-fraction 0.1 --unschedulable-until 30s`). All of it is
the simulator's own kubelet and scheduler, deterministic from `--seed`; the 30 s count from
the simulator's start, a moment before `podalloc run` starts (the offset is recorded).

The policies: the seed's (Spark 3.0), `--max-pending 200`, adaptive batches, adaptive +
max-pending, slow-start within a tick, slow-start + max-pending (batch and pending capped at
200), and slow-start with the ReplicaSet controller's burst (`--max-batch 500`) and
`--max-pending 1000`, so the whole target of 1,000 may be pending at once.

Each run also gets its physical floor: the moment the last pod could be Running and seen,
that is the release of the unschedulable pods (relative to the start of `podalloc run`)
plus the longest start-up latency plus one tick (1 s).

All runs of a benchmark go concurrently (each policy against its own simulator): a run is
mostly asleep between 1 s ticks, and this keeps the whole benchmark within minutes. The
seed policy (Spark 3.0's: batches of 5, nothing new while anything is pending) needs about
20 minutes for 1,000 executors, so it runs for a fixed window and its time and request
count are extrapolated from its steady rate after the unschedulable period (stated as such).
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_sim  # noqa: E402

APP = "spark-bench"
NS = "default"

POLICIES = {
    "seed": [],
    "max-pending": ["--max-pending", "200"],
    "adaptive": ["--batch-size", "auto"],
    "adaptive+max-pending": ["--batch-size", "auto", "--max-pending", "200"],
    "slow-start": ["--batch-size", "slow-start"],
    "slow-start+max-pending": ["--batch-size", "slow-start", "--max-batch", "200",
                               "--max-pending", "200"],
    # The ReplicaSet controller's burst (at most 500 creates a sync) and room for the whole
    # target pending at once: what the physical floor assumes (see docs/benchmarks.md).
    "slow-start+burst": ["--batch-size", "slow-start", "--max-batch", "500",
                         "--max-pending", "1000"],
}

LATENCY = 5.0  # s, the start-up latency of both scenarios
JITTER = {"fixed": 0.0, "jitter": 0.5}
TICK = 1.0  # s, podalloc's default batch delay

TICK_RE = re.compile(r"^\[(\S+) +INFO +[^\]]*\] tick (\d+): target=(\d+) running=(\d+) "
                     r"pending=(\d+) unacknowledged=(\d+) created=(\d+) deleted=(\d+)")


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
    sim_args = ["--seed", "7", "--startup-latency", f"{LATENCY:g}s",
                "--startup-jitter", str(JITTER[scenario]),
                "--failure-rate", str(a.failure_rate),
                "--unschedulable-fraction", str(a.unschedulable),
                "--unschedulable-until", f"{a.hold_until:g}s"]
    t_start_barrier.wait()
    t_launch = time.time()
    sim = bench_sim.Sim(a.podalloc, os.path.join(d, "sim"), sim_args)
    try:
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
        with open(log_path, "wb") as log:
            r = bench_sim.measure(cmd, stderr=log, timeout=a.max_time + 60)
        stats = sim.stats()
    finally:
        sim.stop()
    ticks = parse_ticks(log_path)
    # The simulator's clock starts between t_launch and t0: the release is at most this
    # much earlier than hold_until after the start of `podalloc run`.
    sim_offset = t0 - t_launch
    release = max(0.0, a.hold_until - sim_offset) if a.unschedulable > 0 else 0.2
    floor = release + LATENCY * (1 + JITTER[scenario]) + TICK
    out = {
        "scenario": scenario, "policy": policy, "args": POLICIES[policy], "rc": r["rc"],
        "wall": r["wall"], "cpu": r["cpu"], "rss_mib": r["rss_mib"],
        "ticks": ticks[-1]["tick"] if ticks else 0, "requests": stats["requests"], "lists": stats["lists"],
        "creates": stats["creates"], "deletes": stats["deletes"],
        "max_live": stats["max_live_pods_by_app"].get(APP, 0),
        "overshoot": max(0, stats["max_live_pods_by_app"].get(APP, 0) - a.target),
        "peak_pending": max((t["pending"] + t["unack"] for t in ticks), default=0),
        "sim_offset": sim_offset, "floor": floor,
        "converged": r["rc"] == 0, "extrapolated": False,
        "running_end": ticks[-1]["running"] if ticks else 0,
        "log": log_path,
    }
    out["time"] = r["wall"]
    if policy == "seed" and r["rc"] != 0 and ticks:
        out.update(extrapolate(a, ticks, stats, t0))
    out["x_floor"] = out["time"] / floor
    return out


def extrapolate(a, ticks, stats, t0):
    """The seed policy's time to `target` and requests, from its steady rate in the second
    half of the window (after the unschedulable period): it makes a batch of 5 every
    start-up latency + a tick, so its rate is constant while nothing else changes. Requests:
    list pages, creates, deletes of failed pods, and the other requests per create (Events,
    state) at the window's rate."""
    t_end = ticks[-1]["t"] - t0
    run_end = ticks[-1]["running"]
    mid_t = max(t_end / 2, a.hold_until + LATENCY + 10)
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
    # Requests besides lists, creates and deletes (the Events podalloc records, its state
    # ConfigMap), per create, as measured in the window.
    other = stats["requests"] - stats["lists"] - stats["creates"] - stats["deletes"]
    per_create = max(0, other) / max(1, stats["creates"])
    return {
        "extrapolated": True,
        "window": t_end,
        "rate_per_s": rate,
        "time": t_end + t_more,
        "requests_measured": stats["requests"],
        "requests": int(round(stats["requests"] + pages + creates_more * (1 + per_create)
                              + fails)),
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
                    help="pods reaching the scheduler before this (s) may be unschedulable "
                         "until then")
    ap.add_argument("--failure-rate", type=float, default=0.02)
    a = ap.parse_args()
    t_begin = time.time()
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    started = datetime.fromtimestamp(t_begin, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    res = {"started": started,
           "seconds": time.time() - t_begin, "commit": commit,
           "command": " ".join(["scripts/bench_converge.py", *sys.argv[1:]]),
           "target": a.target, "seed_window": a.seed_window,
           "unschedulable": a.unschedulable, "hold_until": a.hold_until,
           "release_at": a.hold_until + LATENCY, "failure_rate": a.failure_rate,
           "policies": POLICIES, "runs": results}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    seed_req = {r["scenario"]: r["requests"] for r in results if r["policy"] == "seed"}
    for r in results:
        ok = (r["x_floor"] <= 1.3 and r["overshoot"] == 0 and r["converged"]
              and r["requests"] <= seed_req.get(r["scenario"], float("inf")))
        print(f"[converge] {r['scenario']:6} {r['policy']:22} time {r['time']:7.1f}s"
              f"{' (extrapolated)' if r['extrapolated'] else ''} floor {r['floor']:5.1f}s "
              f"({r['x_floor']:5.2f}x) requests {r['requests']:5} "
              f"peak pending {r['peak_pending']:4} overshoot {r['overshoot']} rc {r['rc']}"
              f" target {'met' if ok else 'not met'}", file=sys.stderr)

if __name__ == "__main__":
    main()
