#!/usr/bin/env python3
"""What podalloc costs a real kube-apiserver, next to a peer that does what Spark's allocator
does (tools/peer: a watch on the app's executor pods plus a full list every 30 s).

One control plane (scripts/controlplane.sh start) and the kubelet emulator
(crates/podalloc-sim/examples/kubelet.rs) serve both, one after the other, in namespaces of
their own, each with an app of --executors executors (default 100). For each: the time from
0 to the target, then a window of --window seconds at rest. Reported per window: kube-apiserver
and etcd CPU seconds (utime + stime from /proc, both processes), the API requests by verb and
resource (kube-apiserver's own apiserver_request_total, the emulator's share measured in a
baseline window with no client and subtracted), and the same per hour.

    scripts/bench_real.py [--executors 100] [--window 120] [--podalloc-args "..."]

Needs: scripts/controlplane.sh build, cargo, go, kubectl. Prints a Markdown table.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def sh(*args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def requests(kubectl):
    """apiserver_request_total summed by (verb, resource), watches and our own reads left out."""
    out = sh(*kubectl, "get", "--raw", "/metrics")
    counts = {}
    for line in out.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("resource") in ("", None) or labels.get("verb") in ("WATCH",):
            continue
        key = (labels["verb"], labels["resource"])
        counts[key] = counts.get(key, 0) + float(line.rsplit(" ", 1)[1])
    return counts


def diff(after, before):
    out = {}
    for k, v in after.items():
        d = v - before.get(k, 0)
        if d:
            out[k] = d
    return out


def window(kubectl, pids, seconds):
    r0, c0 = requests(kubectl), cpu_seconds(pids)
    time.sleep(seconds)
    r1, c1 = requests(kubectl), cpu_seconds(pids)
    # The reads of /metrics itself are GETs of no resource: already left out.
    return round(c1 - c0, 3), diff(r1, r0)


def live(kubectl, ns, app):
    out = json.loads(sh(*kubectl, "get", "pods", "-n", ns, "-l",
                        f"spark-app-selector={app},spark-role=executor", "-o", "json"))
    return sum(1 for p in out["items"]
               if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))


def namespace(kubectl, ns):
    rbac = open(os.path.join(ROOT, "deploy/rbac.yaml")).read().replace("namespace: batch", f"namespace: {ns}")
    doc = (f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n{rbac}\n---\n"
           "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n"
           f"  name: podalloc-user\n  namespace: {ns}\nsubjects:\n- kind: User\n  name: podalloc\n"
           "  apiGroup: rbac.authorization.k8s.io\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n"
           "  kind: Role\n  name: podalloc\n")
    subprocess.run([*kubectl, "apply", "-f", "-"], input=doc, text=True, check=True, capture_output=True)


def fmt_req(r, seconds):
    per_hour = 3600 / seconds
    parts = [f"{v * per_hour:.0f} {verb} {res}" for (verb, res), v in sorted(r.items())]
    return ", ".join(parts) or "0"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--executors", type=int, default=100)
    ap.add_argument("--window", type=int, default=120)
    ap.add_argument("--podalloc-args", default="")
    a = ap.parse_args()

    sh("cargo", "build", "--release", "--locked", "-p", "podalloc", "-p", "podalloc-sim",
       "--example", "kubelet", cwd=ROOT)
    sh("cargo", "build", "--release", "--locked", "--bin", "podalloc", cwd=ROOT)
    peer = os.path.join(tempfile.gettempdir(), "podalloc-peer")
    sh("go", "build", "-o", peer, ".", cwd=os.path.join(ROOT, "tools/peer"))
    d = tempfile.mkdtemp(prefix="podalloc-bench-real-")
    cp = os.path.join(d, "cp")
    env = dict(os.environ, PODALLOC_CP_WATCH_PID=str(os.getpid()))
    print(sh("bash", os.path.join(ROOT, "scripts/controlplane.sh"), "start", cp, env=env).strip(), file=sys.stderr)
    kubectl = ["kubectl", "--kubeconfig", os.path.join(cp, "admin.kubeconfig")]
    pids = [int(open(os.path.join(cp, f)).read()) for f in ("kube-apiserver.pid", "etcd.pid")]
    url = open(os.path.join(cp, "url")).read().strip()
    ca = os.path.join(cp, "pki/ca.crt")
    for ns in ("bench-podalloc", "bench-peer"):
        namespace(kubectl, ns)
    kubelet = subprocess.Popen(
        [os.path.join(ROOT, "target/release/examples/kubelet"), "--server", url, "--ca", ca,
         "--token-file", os.path.join(cp, "admin.token"), "--namespace", "bench-podalloc",
         "--namespace", "bench-peer"], stdout=subprocess.DEVNULL)
    procs = [kubelet]
    rows = []
    try:
        cpu, base = window(kubectl, pids, a.window)
        rows.append(("nothing but the emulator", "", cpu, base))
        n = str(a.executors)
        podalloc = [os.path.join(ROOT, "target/release/podalloc"), "--server", url,
                    "--token", open(os.path.join(cp, "podalloc.token")).read().strip(),
                    "--certificate-authority", ca, "-n", "bench-podalloc", "--app-id", "bench",
                    "--image", "img", "--state-file", os.path.join(d, "state.json"),
                    *shlex.split(a.podalloc_args), "run", "--target", n]
        for who, cmd, ns in (
            ("podalloc run", podalloc, "bench-podalloc"),
            ("peer (Spark's API pattern)", None, "bench-peer"),
        ):
            if cmd is None:
                target = os.path.join(d, "peer-target")
                open(target, "w").write(n)
                # The recipe Role has no watch (podalloc never watches): the peer runs as the admin.
                cmd = [peer, "--kubeconfig", os.path.join(cp, "admin.kubeconfig"), "--namespace", ns,
                       "--app-id", "bench", "--target-file", target]
            r0, c0, t0 = requests(kubectl), cpu_seconds(pids), time.time()
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(p)
            while live(kubectl, ns, "bench") < a.executors:
                if time.time() - t0 > 600:
                    raise SystemExit(f"{who}: not converged in 10 minutes")
                time.sleep(0.2)
            took = time.time() - t0
            up_cpu, up = cpu_seconds(pids) - c0, diff(requests(kubectl), r0)
            rows.append((f"{who}: 0 → {n}", f"{took:.1f} s", round(up_cpu, 3), up))
            time.sleep(5)
            cpu, req = window(kubectl, pids, a.window)
            rows.append((f"{who}: at rest, {n} executors", "", cpu, diff(req, base)))
            p.terminate()
            p.wait()
    finally:
        for p in procs:
            p.terminate()
        subprocess.run(["bash", os.path.join(ROOT, "scripts/controlplane.sh"), "stop", cp])
    print(f"| what | time | apiserver+etcd CPU s | per hour | requests (per hour at rest; the emulator's baseline subtracted) |")
    print("|---|---|---|---|---|")
    for what, took, cpu, req in rows:
        rest = "at rest" in what or "nothing" in what
        per_hour = f"{cpu * 3600 / a.window:.1f}" if rest else ""
        shown = fmt_req(req, a.window) if rest else ", ".join(f"{v:.0f} {k[0]} {k[1]}" for k, v in sorted(req.items()))
        print(f"| {what} | {took} | {cpu} | {per_hour} | {shown} |")


if __name__ == "__main__":
    main()
