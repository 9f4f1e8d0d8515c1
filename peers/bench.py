#!/usr/bin/env python3
"""The performance anchor: Spark's own allocator and podalloc, 0 -> 300 -> 0 executors.

Every allocator runs at once, each against its own fresh `podalloc sim` with the same flags
and seed (start-up jitter and an Unschedulable fraction). The target is 300 from the start;
once an allocator's app has 300 running executors (or after --max-time), its target goes to
0 and it runs for --tail more seconds. Reported per allocator: time to target (300
running), requests by verb during the whole run (the simulator's request log and
`GET /sim/stats`, less this script's own progress lists), peak live pods and overshoot
(most live executor pods - 300), and what is left after the target went to 0.

Usage: peers/bench.py --jar-dir DIR [--podalloc target/release/podalloc] [--out FILE.json]
Python 3 standard library only.
"""

import argparse
import collections
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import compare
from compare import APP, NS, FAULT_MARK, Sim

SIM_FLAGS = ["--startup-latency", "3s", "--startup-jitter", "0.5",
             "--unschedulable-fraction", "0.1", "--unschedulable-until", "20s"]
SEED = 7
UNSCHEDULABLE_UNTIL = 20.0  # s after the simulator's start
MAX_STARTUP = 4.5  # 3 s start-up latency, jitter 0.5
TARGET = 300


def census(sim):
    """(running, pending) executor pods of the app, by a list this script marks."""
    s, body = sim.call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=spark-app-selector%3D{APP},"
                              f"spark-role%3Dexecutor&{FAULT_MARK}", auth=True)
    if s != 200:
        return None
    phases = collections.Counter(
        p["status"].get("phase") for p in json.loads(body)["items"] if not p["metadata"].get("deletionTimestamp"))
    return phases.get("Running", 0), phases.get("Pending", 0)


class Side:
    def __init__(self, name, kind, flags, args, workdir):
        self.name, self.kind, self.flags, self.args = name, kind, flags, args
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.result = {"allocator": name, "flags": " ".join(flags) or "(defaults)"}
        self.ready = threading.Event()  # a Spark side's JVM is up
        self.go = threading.Event()  # every JVM is up: start the simulators

    def run(self):
        try:
            self._run()
        except Exception as e:
            self.result["error"] = repr(e)
        finally:
            self.ready.set()

    def _run(self):
        a = self.args
        polls = 0
        max_time, tail = a.max_time, a.tail
        sc = {"name": "bench", "batch_size": 5, "batch_delay_ms": 1000, "poll_ms": 1000,
              "duration_ms": int((max_time + tail) * 1000), "policy": "spark-3.x",
              "podalloc_flags": self.flags}
        go = self.dir / "go"
        if self.kind == "spark":
            # The JVM starts first and waits (--wait-for) until every simulator is up.
            scen = self.dir / "scenario.json"
            flag = self.dir / "target-zero"
            sc["events"] = [{"at_ms": 0, "target": TARGET}]
            sc["target_file"] = str(flag)
            scen.write_text(json.dumps(sc))
            out = self.dir / "spark-decisions.jsonl"
            cp = (Path(a.jar_dir) / "classpath.txt").read_text().strip()
            jar = Path(a.jar_dir) / "spark-peer.jar"
            err = open(self.dir / "spark.stderr", "w")
            proc = subprocess.Popen(
                ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{jar}:{cp}",
                 "podalloc.peer.SparkPeer", "--kubeconfig", str(self.dir / "kubeconfig"), "--scenario", str(scen),
                 "--out", str(out), "--namespace", NS, "--app-id", APP, "--driver-pod", compare.DRIVER,
                 "--wait-for", str(go)],
                stdout=err, stderr=subprocess.STDOUT,
                env={**os.environ, "SPARK_USER": "peer", "SPARK_LOCAL_IP": "127.0.0.1"})
            while not Path(str(go) + ".ready").exists():
                if proc.poll() is not None:
                    raise RuntimeError((self.dir / "spark.stderr").read_text()[-2000:])
                time.sleep(0.02)
            self.ready.set()
        self.go.wait(600)
        sim = Sim(a.podalloc, SEED, SIM_FLAGS, self.dir)
        try:
            sim.seed_driver()
            if self.kind == "spark":
                go.write_text("go\n")
                while not (out.exists() and out.read_text().startswith("{")):
                    if proc.poll() is not None:
                        raise RuntimeError((self.dir / "spark.stderr").read_text()[-2000:])
                    time.sleep(0.01)
                set_zero = lambda: flag.write_text("0")
            else:
                cmd = lambda n: compare.podalloc_cmd(a, sc, sim, self.dir, n)
                log = open(self.dir / "podalloc.log", "w")
                proc = subprocess.Popen(cmd(TARGET), stdout=log, stderr=log)

                def set_zero():
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(30)
                    self.proc = subprocess.Popen(cmd(0), stdout=log, stderr=log)
            self.proc = proc
            t0 = time.monotonic()
            # The Unschedulable window counts from the simulator's start, which precedes the
            # allocator's by the JVM's start-up on the Spark side: the floor is per side.
            offset = t0 - sim.started
            self.result["start_after_sim_s"] = round(offset, 1)
            self.result["physical_floor_s"] = round(max(0.0, UNSCHEDULABLE_UNTIL - offset) + MAX_STARTUP + 1.0, 1)
            reached = None
            while time.monotonic() - t0 < max_time:
                c = census(sim)
                polls += 1
                if c and c[0] >= TARGET:
                    reached = time.monotonic() - t0
                    break
                time.sleep(0.25)
            self.result["time_to_target_s"] = round(reached, 1) if reached is not None else None
            if reached is None:
                self.result["running_at_max_time"] = c[0] if c else None
            set_zero()
            time.sleep(tail)
            c = census(sim)
            polls += 1
            self.result["after_zero"] = {"running": c[0], "pending": c[1]} if c else None
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            lines = sim.log()
            stats = sim.stats()
        finally:
            sim.close()
            sd = compare.state_dir(self.dir)
            if sd != self.dir:
                for f in sd.iterdir():
                    f.unlink()
                sd.rmdir()
        ours = [e for e in lines if "peerFault" not in e.get("query", {}) and e["path"].startswith("/api")]
        verbs = collections.Counter(e.get("verb") or "other" for e in ours)
        self.result.update({
            "requests": stats["requests"] - polls,
            "requests_by_verb": dict(sorted(verbs.items())),
            "sim_stats": {k: stats[k] for k in ("lists", "creates", "deletes", "create_conflicts")},
            "peak_live_executor_pods": stats["max_live_pods_by_app"].get(APP, 0) - 1,
            # The driver pod carries the app's label too: not an executor.
            "overshoot": max(0, stats["max_live_pods_by_app"].get(APP, 0) - 1 - TARGET),
            "executors_created": len(stats["executor_ids_created"].get(APP, [])),
        })
        self.result["sim_stats"]["lists"] -= polls


def main():
    global TARGET
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jar-dir", required=True, help="the Spark 3.5 harness build dir")
    ap.add_argument("--jar-dir-4", help="also the Spark 4.0 harness, from this build dir")
    ap.add_argument("--podalloc", default=str(compare.HERE.parent / "target/release/podalloc"))
    ap.add_argument("--max-time", type=float, default=180.0)
    ap.add_argument("--tail", type=float, default=15.0)
    ap.add_argument("--target", type=int, default=TARGET, help="executors (default 300)")
    ap.add_argument("--out")
    a = ap.parse_args()
    TARGET = a.target
    work = Path(tempfile.mkdtemp(prefix="spark-peer-bench-"))
    sides = [Side("spark", "spark", [], a, work)]
    if a.jar_dir_4:
        sides.append(Side("spark-4.0", "spark", [], argparse.Namespace(**{**vars(a), "jar_dir": a.jar_dir_4}), work))
    sides += [
             Side("podalloc spark-3.x", "podalloc", [], a, work),
             Side("podalloc spark-3.x slow-start+burst", "podalloc",
                  ["--batch-size", "slow-start", "--max-batch", "500", "--max-pending", "1000"], a, work)]
    for s in sides:
        if s.kind == "spark":
            s.result["allocator"] = "Spark " + ("4.0" if s.name == "spark-4.0" else "3.5")
    threads = [threading.Thread(target=s.run) for s in sides]
    start = time.time()
    for t in threads:
        t.start()
    for s in sides:
        if s.kind == "spark":
            s.ready.wait(600)
    for s in sides:
        s.go.set()
    for t in threads:
        t.join()
    report = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)), "sim_flags": SIM_FLAGS,
              "seed": SEED, "target": TARGET, "results": [s.result for s in sides], "workdir": str(work)}
    text = json.dumps(report, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
