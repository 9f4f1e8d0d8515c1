#!/usr/bin/env python3
"""What podalloc costs a real kube-apiserver, next to a peer that does what Spark's allocator
does (tools/peer: a watch on the app's executor pods plus a full list every 30 s).

One control plane (scripts/controlplane.sh start) and the kubelet emulator
(crates/podalloc-sim/examples/kubelet.rs) serve both, one after the other, in namespaces of
their own, each with an app of --executors executors (default 100). For each, three legs:

- 0 → N: the client started with target N, until N of its executors run;
- at rest: a window of --window seconds, N running, nothing to do;
- N → 0: the target set to 0 the way a user would (`podalloc scale 0`, handed to the running
  loop through its steering queue; the peer's --target-file rewritten), until no executor
  pod of the app is left (the emulator finishes each graceful delete). podalloc runs with
  --scale-down-running: without it running executors above the target stay, as in Spark,
  where the peer deletes them as the driver's dynamic allocation does.

Reported per leg: the time it took, kube-apiserver and etcd CPU seconds (utime + stime from
/proc, both processes: the emulator's and the benchmark's own reads are in them, the same
for both clients per second of leg), and **the client's own requests** by verb and resource,
from kube-apiserver's audit log: podalloc runs as user `podalloc-a` and the peer as
`podalloc-b` (tokens of scripts/controlplane.sh), and an audit policy of this script's logs
every request of those two users at Metadata level (each counted once, a watch when it starts), so
the benchmark's polling and the emulator (user `admin`) are in no client's count. A converge
leg's and a scale-down leg's requests include the 5 s after the goal was reached (the
client's confirming tick). The first row, a window with no client, is the control plane and
the emulator alone (apiserver_request_total, watches left out).

    scripts/bench_real.py [--executors 100] [--window 120] [--podalloc-args="--no-events ..."]

Needs: scripts/controlplane.sh build, cargo, go, kubectl. Prints a Markdown table.
"""
import argparse
import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
SETTLE = 5.0
POLL = 0.2
# Every request of the two measured clients, at Metadata level (RequestReceived left out: a
# request logs one event when answered, a watch one more when it ends).
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [podalloc-a, podalloc-b]
- level: None
"""


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


class Audit:
    """kube-apiserver's audit log (JSON lines), read between marks."""

    def __init__(self, path):
        self.path = path
        self.seen = set()

    def mark(self):
        """The offset just past the last complete line."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return 0
        return data.rfind(b"\n") + 1

    def count(self, start, end, user):
        """{(VERB, resource[/subresource]): n} of `user`'s requests logged in [start, end),
        each counted once, at its first event (a watch logs one when it starts and one when
        it ends)."""
        with open(self.path, "rb") as f:
            f.seek(start)
            data = f.read(end - start)
        counts = {}
        for line in data.splitlines():
            ev = json.loads(line)
            if ev.get("user", {}).get("username") != user:
                continue
            if ev["auditID"] in self.seen:
                continue
            self.seen.add(ev["auditID"])
            verb = ev.get("verb", "")
            ref = ev.get("objectRef") or {}
            res = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            key = (verb.upper(), res or ev.get("requestURI", "").split("?")[0])
            counts[key] = counts.get(key, 0) + 1
        return counts


class Pods:
    """The benchmark's own reads of an app's executor pods, as the admin (one LIST each)."""

    def __init__(self, url, ca, token):
        self.url, self.token = url, token
        self.ctx = ssl.create_default_context(cafile=ca)

    def counts(self, ns, app):
        """(running and not being deleted, all) executor pods of `app`."""
        q = urllib.parse.urlencode({"labelSelector": f"spark-app-selector={app},spark-role=executor"})
        req = urllib.request.Request(f"{self.url}/api/v1/namespaces/{ns}/pods?{q}",
                                     headers={"Authorization": f"Bearer {self.token}"})
        items = json.load(urllib.request.urlopen(req, context=self.ctx))["items"]
        running = sum(1 for p in items if p["status"].get("phase") == "Running"
                      and not p["metadata"].get("deletionTimestamp"))
        return running, len(items)

    def wait(self, ns, app, done, what):
        """Polls every POLL s until done((running, all)); the seconds it took."""
        t0 = time.time()
        while not done(self.counts(ns, app)):
            if time.time() - t0 > 600:
                raise SystemExit(f"{what}: not reached in 10 minutes")
            time.sleep(POLL)
        return time.time() - t0


def namespace(kubectl, ns, user, extra_verbs=()):
    """Namespace `ns` with deploy/rbac.yaml's Role, its pod verbs plus `extra_verbs`, bound to
    `user` (a static-token user of scripts/controlplane.sh)."""
    rbac = open(os.path.join(ROOT, "deploy/rbac.yaml")).read().replace("namespace: batch", f"namespace: {ns}")
    verbs = '["get", "list", "create", "delete", "deletecollection"]'
    rbac = rbac.replace(verbs, verbs[:-1] + "".join(f', "{v}"' for v in extra_verbs) + "]")
    doc = (f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n{rbac}\n---\n"
           "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n"
           f"  name: podalloc-user\n  namespace: {ns}\nsubjects:\n- kind: User\n  name: {user}\n"
           "  apiGroup: rbac.authorization.k8s.io\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n"
           "  kind: Role\n  name: podalloc\n")
    subprocess.run([*kubectl, "apply", "-f", "-"], input=doc, text=True, check=True, capture_output=True)


def kubeconfig(path, url, ca, user, token):
    with open(path, "w") as f:
        f.write(f"apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n"
                f"    certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\n"
                f"contexts:\n- name: x\n  context:\n    cluster: c\n    user: {user}\n"
                "current-context: x\n")
    os.chmod(path, 0o600)


def fmt_req(r, scale=1.0):
    return ", ".join(f"{v * scale:.0f} {verb} {res}" for (verb, res), v in sorted(r.items())) or "0"


class ControlPlane:
    """A started control plane (scripts/controlplane.sh start DIR with this script's audit
    policy), its kubectl, server pids and audit log."""

    def __init__(self, d):
        self.dir = os.path.join(d, "cp")
        policy = os.path.join(d, "audit-policy.yaml")
        open(policy, "w").write(AUDIT_POLICY)
        # A second --audit-policy-file after the script's own: the last one given wins.
        env = dict(os.environ, PODALLOC_CP_WATCH_PID=str(os.getpid()),
                   PODALLOC_CP_EXTRA=f"{os.environ.get('PODALLOC_CP_EXTRA', '')} --audit-policy-file={policy}")
        print(sh("bash", os.path.join(ROOT, "scripts/controlplane.sh"), "start", self.dir, env=env).strip(),
              file=sys.stderr)
        self.kubectl = ["kubectl", "--kubeconfig", self.file("admin.kubeconfig")]
        self.pids = [int(self.read(f"{x}.pid")) for x in ("kube-apiserver", "etcd")]
        self.url = self.read("url")
        self.ca = self.file("pki/ca.crt")
        self.audit = Audit(self.file("audit.log"))
        self.pods = Pods(self.url, self.ca, self.read("admin.token"))

    def file(self, name):
        return os.path.join(self.dir, name)

    def read(self, name):
        return open(self.file(name)).read().strip()

    def cpu(self):
        return cpu_seconds(self.pids)

    def kubelet(self, namespaces, *flags):
        """The kubelet emulator (release example) for `namespaces`, as the admin."""
        cmd = [os.path.join(ROOT, "target/release/examples/kubelet"), "--server", self.url, "--ca", self.ca,
               "--token-file", self.file("admin.token"), *flags]
        for ns in namespaces:
            cmd += ["--namespace", ns]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL)

    def stop(self):
        subprocess.run(["bash", os.path.join(ROOT, "scripts/controlplane.sh"), "stop", self.dir])


def legs(cp, who, user, ns, n, start, scale_down, window):
    """The three legs of one client: rows (what, seconds, server CPU s, requests)."""
    rows = []
    m0, c0 = cp.audit.mark(), cp.cpu()
    proc = start()
    try:
        took = cp.pods.wait(ns, "bench", lambda c: c[0] >= n, f"{who}: 0 → {n}")
        up_cpu = cp.cpu() - c0
        time.sleep(SETTLE)
        m1 = cp.audit.mark()
        rows.append((f"{who}: 0 → {n}", took, up_cpu, cp.audit.count(m0, m1, user)))
        c1 = cp.cpu()
        time.sleep(window)
        m2, c2 = cp.audit.mark(), cp.cpu()
        rows.append((f"{who}: at rest, {n} executors", None, c2 - c1, cp.audit.count(m1, m2, user)))
        scale_down()
        took = cp.pods.wait(ns, "bench", lambda c: c[1] == 0, f"{who}: {n} → 0")
        down_cpu = cp.cpu() - c2
        time.sleep(SETTLE)
        rows.append((f"{who}: {n} → 0", took, down_cpu, cp.audit.count(m2, cp.audit.mark(), user)))
    finally:
        proc.terminate()
        proc.wait()
    return rows


def build(peer):
    sh("cargo", "build", "--release", "--locked", "-p", "podalloc", "-p", "podalloc-sim",
       "--example", "kubelet", cwd=ROOT)
    sh("cargo", "build", "--release", "--locked", "--bin", "podalloc", cwd=ROOT)
    sh("go", "build", "-o", peer, ".", cwd=os.path.join(ROOT, "tools/peer"))


def print_table(rows, window):
    print("| what | time | apiserver+etcd CPU s | CPU s per hour | the client's own requests (per hour at rest) | total |")
    print("|---|---|---|---|---|---|")
    per_hour = 3600 / window
    for what, took, cpu, req in rows:
        rest = took is None
        scale = per_hour if rest else 1.0
        print(f"| {what} | {'' if rest else f'{took:.1f} s'} | {cpu:.2f} | {f'{cpu * per_hour:.1f}' if rest else ''} "
              f"| {fmt_req(req, scale)} | {sum(req.values()) * scale:.0f} |")
    by = {}
    for what, took, _, req in rows[1:]:
        who = what.split(":")[0]
        if took is not None:
            t, r = by.get(who, (0.0, 0))
            by[who] = (t + took, r + sum(req.values()))
    print()
    for who, (t, r) in by.items():
        print(f"- {who}: 0 → N → 0 in {t:.1f} s of legs, {r:.0f} requests of its own")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--executors", type=int, default=100)
    ap.add_argument("--window", type=int, default=120)
    ap.add_argument("--podalloc-args", default="")
    a = ap.parse_args()

    peer = os.path.join(tempfile.gettempdir(), "podalloc-peer")
    build(peer)
    d = tempfile.mkdtemp(prefix="podalloc-bench-real-")
    cp = ControlPlane(d)
    namespace(cp.kubectl, "bench-podalloc", "podalloc-a")
    # The recipe Role has no watch (podalloc never watches): the peer's has it added.
    namespace(cp.kubectl, "bench-peer", "podalloc-b", ("watch",))
    peer_kc = os.path.join(d, "peer.kubeconfig")
    kubeconfig(peer_kc, cp.url, cp.ca, "podalloc-b", cp.read("podalloc-b.token"))
    procs = [cp.kubelet(["bench-podalloc", "bench-peer"])]
    rows = []
    n = str(a.executors)
    try:
        r0, c0 = requests(cp.kubectl), cp.cpu()
        time.sleep(a.window)
        rows.append(("nothing but the emulator", None, cp.cpu() - c0, diff(requests(cp.kubectl), r0)))
        podalloc = [os.path.join(ROOT, "target/release/podalloc"), "--server", cp.url,
                    "--token", cp.read("podalloc-a.token"), "--certificate-authority", cp.ca,
                    "-n", "bench-podalloc", "--app-id", "bench", "--image", "img",
                    "--state-file", os.path.join(d, "state.json"),
                    # Running executors above the target are kept unless asked (Spark's rule);
                    # the peer deletes them, as the driver's dynamic allocation does.
                    "--scale-down-running", *shlex.split(a.podalloc_args)]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        rows += legs(cp, "podalloc run", "podalloc-a", "bench-podalloc", a.executors,
                     lambda: subprocess.Popen([*podalloc, "run", "--target", n], **quiet),
                     lambda: subprocess.run([*podalloc, "scale", "0"], check=True, **quiet), a.window)
        target = os.path.join(d, "peer-target")
        open(target, "w").write(n)
        rows += legs(cp, "peer (Spark's API pattern)", "podalloc-b", "bench-peer", a.executors,
                     lambda: subprocess.Popen([peer, "--kubeconfig", peer_kc, "--namespace", "bench-peer",
                                               "--app-id", "bench", "--target-file", target], **quiet),
                     lambda: open(target, "w").write("0"), a.window)
    finally:
        for p in procs:
            p.terminate()
        cp.stop()
    print_table(rows, a.window)


if __name__ == "__main__":
    main()
