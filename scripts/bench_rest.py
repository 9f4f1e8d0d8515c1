#!/usr/bin/env python3
"""Requests per converged tick, by verb and resource: a `podalloc run` of 3 executors on the
simulator, converged, observed for a few seconds through the simulator's request log
(`GET /sim/log`). Three forms: the file store, the ConfigMap store (holder record), and the
ConfigMap store with `--leader-elect`. Ticks are counted as pod lists.

    scripts/bench_rest.py PODALLOC [--label NAME] [--same-rate] [--seconds S]

`--same-rate` passes `--idle-interval 100ms` so that converged ticks come as often as
`--interval 100ms` (a build without that flag ticks every `--interval` anyway); without it the
build's own idle interval applies (30 s by default: most windows then hold no tick at all).
Prints one Markdown table row per form (label, form, converged ticks in the window, requests
per tick by verb and resource, state writes per tick — the state file's, or the ConfigMap's
creates and updates — and Lease writes per second) and writes nothing else. Loopback only; Python 3.8+,
standard library only.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sim import Sim  # noqa: E402

FORMS = {
    "file": [],
    "configmap": ["--state-store", "configmap:rest-state"],
    "configmap + leader-elect": ["--state-store", "configmap:rest-state", "--leader-elect",
                                 "--leader-elect-lease-duration", "3s",
                                 "--leader-elect-renew-deadline", "2s",
                                 "--leader-elect-retry-period", "500ms"],
}


def sim_log(sim):
    _, body = sim.request("GET", "/sim/log")
    return [json.loads(line) for line in body.decode().splitlines() if line.strip()]


def resource(path):
    parts = path.split("/")
    if "namespaces" in parts:
        i = parts.index("namespaces")
        return parts[i + 2] if len(parts) > i + 2 else "namespaces"
    return "other"


def live_running(sim, app):
    _, body = sim.request(
        "GET", f"/api/v1/namespaces/default/pods?labelSelector=spark-app-selector%3D{app}")
    items = json.loads(body)["items"]
    return sum(1 for p in items if p["status"].get("phase") == "Running"
               and not p["metadata"].get("deletionTimestamp"))


def measure(podalloc, form, extra, seconds, same_rate, workdir):
    sim = Sim(podalloc, os.path.join(workdir, form.replace(" ", "-").replace("+", "")))
    app = "rest-app"
    state = os.path.join(sim.workdir, "state.json")
    cmd = [podalloc, "--kubeconfig", sim.kubeconfig, "--app-id", app, "--image", "img",
           "--state-file", state, "--log-level", "warn", *extra[:2],
           "run", "--target", "3", "--interval", "100ms", *extra[2:]]
    if same_rate:
        cmd += ["--idle-interval", "100ms"]
    env = dict(os.environ, POD_NAME="rest-pod")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while live_running(sim, app) < 3:
            if time.time() > deadline:
                raise RuntimeError("did not converge")
            time.sleep(0.1)
        time.sleep(2)
        since = max((r["seq"] for r in sim_log(sim)), default=0)
        # State file writes: the distinct modification times seen polling every millisecond
        # (a lower bound: two saves within one millisecond count once).
        mtimes, end = set(), time.time() + seconds
        while time.time() < end:
            try:
                mtimes.add(os.stat(state).st_mtime_ns)
            except FileNotFoundError:
                pass
            time.sleep(0.001)
        by = collections.Counter(
            f'{r["verb"]} {resource(r["path"])}' for r in sim_log(sim) if r["seq"] > since)
        return by, max(len(mtimes) - 1, 0) if form == "file" else None
    finally:
        proc.terminate()
        proc.wait()
        sim.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("podalloc")
    ap.add_argument("--label", default="")
    ap.add_argument("--same-rate", action="store_true")
    ap.add_argument("--seconds", type=float, default=5.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        for form, extra in FORMS.items():
            by, file_writes = measure(a.podalloc, form, extra, a.seconds, a.same_rate, workdir)
            ticks = by.get("list pods", 0)
            per = ", ".join(f"{k} {v / max(ticks, 1):.2f}" for k, v in sorted(by.items()))
            state_writes = sum(v for k, v in by.items()
                               if any(w in k.split()[0] for w in ("create", "update", "patch"))
                               and k.endswith("configmaps"))
            lease = sum(v for k, v in by.items() if k.endswith("leases"))
            writes = state_writes if form != "file" else file_writes
            writes = f"{writes / max(ticks, 1):.2f}"
            print(f"| {a.label} | {form} | {ticks} in {a.seconds:.0f} s | {per} | {writes} | "
                  f"{lease / a.seconds:.1f}/s |")


if __name__ == "__main__":
    main()
