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
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
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


class PodWatch:
    """One watch (as the admin) on an app's executor pods in a namespace of the real control
    plane: Running and live counts as they change, without lists that would load the server
    whose CPU is measured."""

    def __init__(self, cp, ns):
        self.pods, self.peak_live, self.reached, self.error = {}, 0, None, None
        self.lock = threading.Lock()
        sel = urllib.parse.quote(f"spark-app-selector={APP},spark-role=executor")
        req = urllib.request.Request(f"{cp.url}/api/v1/namespaces/{ns}/pods?watch=1&labelSelector={sel}"
                                     "&timeoutSeconds=3600")
        req.add_header("Authorization", "Bearer " + cp.admin_token)
        self.resp = urllib.request.urlopen(req, context=cp.ctx, timeout=3600)
        self.t0 = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        try:
            for line in self.resp:
                ev = json.loads(line)
                pod = ev["object"]
                name = pod["metadata"]["name"]
                with self.lock:
                    if ev["type"] == "DELETED":
                        self.pods.pop(name, None)
                    else:
                        self.pods[name] = (pod.get("status", {}).get("phase"),
                                           pod["metadata"].get("deletionTimestamp") is not None)
                    live = sum(1 for ph, _ in self.pods.values() if ph not in ("Succeeded", "Failed"))
                    self.peak_live = max(self.peak_live, live)
                    if self.reached is None and self.t0 is not None and self.running() >= TARGET:
                        self.reached = time.monotonic() - self.t0
        except Exception as e:  # the response closed at the end, or a failure
            self.error = e

    def running(self):
        return sum(1 for ph, gone in self.pods.values() if ph == "Running" and not gone)

    def census(self):
        with self.lock:
            return self.running(), sum(1 for ph, gone in self.pods.values() if ph == "Pending" and not gone)

    def close(self):
        # Not resp.close(): it waits for the reading thread's lock. Shutting the socket ends
        # the thread's read (and the control plane's stop would anyway).
        try:
            self.resp.fp.raw._sock.shutdown(socket.SHUT_RDWR)
        except (AttributeError, OSError):
            pass


def real_side(a, name, kind, jar_dir, flags, d):
    """One allocator from 0 to TARGET and back to 0 on a fresh control plane of its own."""
    import real
    d.mkdir(parents=True, exist_ok=True)
    result = {"allocator": name, "flags": " ".join(flags) or "(defaults)"}
    sc = {"name": "bench", "batch_size": 5, "batch_delay_ms": 1000, "poll_ms": 1000,
          "duration_ms": int((a.max_time + a.tail + 60) * 1000), "policy": "spark-3.x", "podalloc_flags": flags}
    cp = real.ControlPlane(d / "controlplane")
    emu = proc = None
    try:
        cp.namespace("bench", kind)
        side = real.RealSide(cp, "bench")
        if kind == "spark":
            flag, go, out = d / "target-zero", d / "go", d / "spark-decisions.jsonl"
            sc["events"] = [{"at_ms": 0, "target": TARGET}]
            sc["target_file"] = str(flag)
            (d / "scenario.json").write_text(json.dumps(sc))
            cp_txt = (Path(jar_dir) / "classpath.txt").read_text().strip()
            err = open(d / "spark.stderr", "w")
            proc = subprocess.Popen(
                ["java", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{Path(jar_dir) / 'spark-peer.jar'}:{cp_txt}",
                 "podalloc.peer.SparkPeer", "--kubeconfig", str(cp.kubeconfig), "--scenario", str(d / "scenario.json"),
                 "--out", str(out), "--namespace", "bench", "--app-id", APP, "--driver-pod", compare.DRIVER,
                 "--wait-for", str(go)],
                stdout=err, stderr=subprocess.STDOUT, env={**os.environ, "SPARK_USER": "peer", "SPARK_LOCAL_IP": "127.0.0.1"})
            while not Path(str(go) + ".ready").exists():
                if proc.poll() is not None:
                    raise RuntimeError((d / "spark.stderr").read_text()[-2000:])
                time.sleep(0.02)
        emu = real.Emulator(cp, ["bench"], a.real_startup_ms, d)
        side.seed_driver(APP, compare.DRIVER)
        side.wait_running(compare.DRIVER, 60)
        watch = PodWatch(cp, "bench")
        # The control plane, the emulator and the watch alone, as a baseline rate.
        time.sleep(2)
        b0 = cp.cpu_seconds()
        time.sleep(a.baseline)
        baseline = (cp.cpu_seconds() - b0) / a.baseline
        c0 = cp.cpu_seconds()
        t0 = watch.t0 = time.monotonic()
        if kind == "spark":
            go.write_text("go\n")
            set_zero = lambda: flag.write_text("0")
        else:
            log = open(d / "podalloc.log", "w")
            cmd = lambda n: compare.podalloc_cmd(a, sc, side, d, n)
            proc = subprocess.Popen(cmd(TARGET), stdout=log, stderr=log)

            def set_zero():
                nonlocal proc
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
                proc = subprocess.Popen(cmd(0), stdout=log, stderr=log)
        while watch.reached is None and time.monotonic() - t0 < a.max_time:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}")
            time.sleep(0.05)
        up_cpu = cp.cpu_seconds() - c0
        result["time_to_target_s"] = round(watch.reached, 1) if watch.reached is not None else None
        if watch.reached is None:
            result["running_at_max_time"] = watch.census()[0]
        set_zero()
        time.sleep(a.tail)
        total_cpu = cp.cpu_seconds() - c0
        running, pending = watch.census()
        result["after_zero"] = {"running": running, "pending": pending}
        took = time.monotonic() - t0
        ours = [e for e in cp.log("bench") if e["user"]]
        verbs = collections.Counter(e["verb"] for e in ours)
        result.update({
            "requests": len(ours), "requests_by_verb": dict(sorted(verbs.items())),
            "peak_live_executor_pods": watch.peak_live, "overshoot": max(0, watch.peak_live - TARGET),
            "executors_created": sum(1 for e in ours if e["verb"] == "create" and e["status"] == 201
                                     and e["resource"] == "pods"),
            "server_cpu_s_to_target": round(up_cpu, 2), "server_cpu_s_whole_run": round(total_cpu, 2),
            "run_s": round(took, 1), "baseline_cpu_s_per_s": round(baseline, 3),
            "server_cpu_s_above_baseline": round(total_cpu - baseline * took, 2)})
        watch.close()
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if emu:
            emu.close()
        cp.stop()
        sd = compare.state_dir(d)
        if sd != d:
            for f in sd.iterdir():
                f.unlink()
            sd.rmdir()
    return result


def run_real(a):
    """--real: each allocator in turn on a fresh control plane of its own, in one run."""
    work = Path(tempfile.mkdtemp(prefix="spark-peer-bench-real-"))
    sides = [("Spark 3.5", "spark", a.jar_dir, [])]
    if a.jar_dir_4:
        sides.append(("Spark 4.0", "spark", a.jar_dir_4, []))
    sides += [("podalloc spark-3.x", "podalloc", None, []),
              ("podalloc spark-3.x slow-start+burst", "podalloc", None,
               ["--batch-size", "slow-start", "--max-batch", "500", "--max-pending", "1000"])]
    start = time.time()
    results = []
    for i, (name, kind, jar, flags) in enumerate(sides):
        try:
            results.append(real_side(a, name, kind, jar, flags, work / f"side{i}"))
        except Exception as e:
            results.append({"allocator": name, "error": repr(e)})
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)), "server": "real control plane",
            "startup_ms": a.real_startup_ms, "target": TARGET, "results": results, "workdir": str(work)}


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
    ap.add_argument("--real", action="store_true",
                    help="each allocator in turn on a fresh real control plane (peers/real.py) instead of simulators, "
                         "with kube-apiserver + etcd CPU")
    ap.add_argument("--real-startup-ms", type=int, default=3000, help="--real: the emulator's start-up latency")
    ap.add_argument("--baseline", type=float, default=10.0, help="--real: seconds of the server at rest before each run")
    a = ap.parse_args()
    TARGET = a.target
    if a.real:
        report = run_real(a)
        text = json.dumps(report, indent=1)
        if a.out:
            Path(a.out).write_text(text + "\n")
        print(text)
        sys.exit(1 if any("error" in r for r in report["results"]) else 0)
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
