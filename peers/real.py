#!/usr/bin/env python3
"""The real control plane for peers/compare.py and peers/bench.py: an unmodified
kube-apiserver and etcd (scripts/controlplane.sh start) and the kubelet emulator
(crates/podalloc-sim/examples/kubelet.rs), with the interface of compare.Sim.

Each side of a scenario gets a namespace of its own on one server, both served by one
emulator (the scenario's start-up latency). The two sides run at once and alike: user
`podalloc`, a Role in each namespace (podalloc's: deploy/rbac.yaml; Spark's: what a Spark
driver's service account is usually granted on pods, with deletecollection and watch).
The decisions are read from kube-apiserver's audit log (--audit-log-path, level Metadata:
verb, user, requestURI, objectRef, response code and a microsecond time per request), which
this module turns into the simulator's request-log lines, so compare.decisions() reads both;
the allocators' pod creates alone are logged at level Request (the pod sent, so its labels:
each executor's resource profile, compare.created_profiles), so the log stays small.
Faults go through the API as the admin, as `kubectl` would: an executor that fails (its
status written Failed, exit code 1, through pods/NAME/status once it runs: the emulator then
leaves it), a pod deleted by hand (DELETE, default grace period), a pod never listed
(relabelled spark-role=hidden as soon as it exists, as on the simulator). A pod that never
starts has no API-only form that does not race the emulator's bind: scenarios with "hold"
are simulator-only (compare.REAL_UNSUPPORTED).

Python 3 standard library only.
"""

import collections
import json
import os
import re
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TICK = os.sysconf("SC_CLK_TCK")

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Request
  users: ["podalloc"]
  verbs: ["create"]
  resources: [{group: "", resources: ["pods"]}]
- level: Metadata
  users: ["podalloc"]
- level: Metadata
  users: ["admin"]
  verbs: ["get"]
  resources: [{group: "", resources: ["pods"]}]
- level: None
"""

SPARK_ROLE = """apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: spark-driver
  namespace: {ns}
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "watch", "create", "delete", "deletecollection"]
"""

BINDING = """apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: peer-user
  namespace: {ns}
subjects:
  - kind: User
    name: podalloc
    apiGroup: rbac.authorization.k8s.io
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {role}
"""


def _ts_ms(s):
    """An audit timestamp (RFC 3339, microseconds) as ms since the epoch."""
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() * 1000.0


class ControlPlane:
    """One kube-apiserver + etcd with an audit log, stopped with this process at the latest."""

    def __init__(self, workdir):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        self.audit_path = self.dir / "audit.log"
        extra = (f"--audit-log-path={self.audit_path} --audit-policy-file={policy} "
                 "--audit-log-maxsize=0 --audit-log-mode=blocking")
        env = dict(os.environ, PODALLOC_CP_WATCH_PID=str(os.getpid()), PODALLOC_CP_EXTRA=extra)
        cp = self.dir / "cp"
        r = subprocess.run(["bash", str(ROOT / "scripts/controlplane.sh"), "start", str(cp)], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"the control plane did not start: {r.stdout}{r.stderr}")
        self.cp = cp
        self.url = (cp / "url").read_text().strip()
        self.ca = cp / "pki/ca.crt"
        self.admin_token = (cp / "admin.token").read_text().strip()
        self.kubeconfig = cp / "podalloc.kubeconfig"
        self.pids = [int((cp / f).read_text()) for f in ("kube-apiserver.pid", "etcd.pid")]
        self.ctx = ssl.create_default_context(cafile=str(self.ca))
        self._audit_pos = 0
        self._audit = []
        self._lock = threading.Lock()

    def cpu_seconds(self):
        """kube-apiserver + etcd CPU (utime + stime) so far, from /proc."""
        total = 0
        for pid in self.pids:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / TICK

    def call(self, method, path, body=None, content_type="application/json"):
        """A request as the admin: (status, body)."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", content_type)
        req.add_header("Authorization", "Bearer " + self.admin_token)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=20) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def apply(self, doc):
        """Objects from YAML, by kubectl as the admin."""
        subprocess.run(["kubectl", "--kubeconfig", str(self.cp / "admin.kubeconfig"), "apply", "-f", "-"],
                       input=doc, text=True, check=True, capture_output=True)

    def namespace(self, ns, side):
        """A namespace for one side: podalloc's Role (deploy/rbac.yaml) or a Spark driver's."""
        if side == "spark":
            role, name = SPARK_ROLE.format(ns=ns), "spark-driver"
        else:
            role = (ROOT / "deploy/rbac.yaml").read_text().replace("namespace: batch", f"namespace: {ns}")
            name = "podalloc"
        self.apply(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n---\n{role}\n---\n"
                   + BINDING.format(ns=ns, role=name))

    def audit(self):
        """Every audit event so far (ResponseComplete), in the order written."""
        with self._lock:
            return list(self._read_audit())

    def _read_audit(self):
        with open(self.audit_path) as f:
            f.seek(self._audit_pos)
            chunk = f.read()
        end = chunk.rfind("\n") + 1
        self._audit_pos += len(chunk[:end].encode())
        for line in chunk[:end].splitlines():
            if line.strip():
                self._audit.append(json.loads(line))
        return self._audit

    def log(self, ns):
        """The audit events of namespace `ns` as the simulator's request-log lines."""
        out = []
        for seq, e in enumerate(self.audit()):
            ref = e.get("objectRef") or {}
            if ref.get("namespace") != ns or e.get("stage") != "ResponseComplete":
                continue
            uri = urllib.parse.urlsplit(e["requestURI"])
            user = e.get("user", {}).get("username")
            line = {"seq": seq, "ms": _ts_ms(e["requestReceivedTimestamp"]), "path": uri.path,
                    "verb": e["verb"], "status": e.get("responseStatus", {}).get("code"),
                    "query": dict(urllib.parse.parse_qsl(uri.query)),
                    # Only the allocator's requests are decisions: the admin's (faults, the
                    # start marker) have no user here, as the simulator's side doors.
                    "user": user if user == "podalloc" else None, "name": ref.get("name"),
                    "resource": ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")}
            sent = e.get("requestObject")
            if isinstance(sent, dict):
                # An allocator's pod create (level Request): the labels it sent.
                line["labels"] = (sent.get("metadata") or {}).get("labels") or {}
            out.append(line)
        return out

    def stop(self):
        subprocess.run(["bash", str(ROOT / "scripts/controlplane.sh"), "stop", str(self.cp)],
                       capture_output=True)


class Emulator:
    """The kubelet emulator over some namespaces (target/release/examples/kubelet)."""

    def __init__(self, cp, namespaces, startup_ms, workdir, schedule_ms=50, stop_ms=100):
        exe = ROOT / "target/release/examples/kubelet"
        args = [str(exe), "--server", cp.url, "--ca", str(cp.ca), "--token-file", str(cp.cp / "admin.token"),
                "--startup-ms", str(startup_ms), "--schedule-ms", str(schedule_ms), "--stop-ms", str(stop_ms)]
        for ns in namespaces:
            args += ["--namespace", ns]
        self.log = open(Path(workdir) / "kubelet.log", "w")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        first = self.proc.stdout.readline()
        if not first.startswith("emulating"):
            self.close()
            raise RuntimeError(f"the kubelet emulator did not start: {first}")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def startup_ms(flags):
    """The scenario's --startup-latency (a `podalloc sim` flag) in ms; the simulator's default 1 s."""
    for i, f in enumerate(flags):
        if f == "--startup-latency" and i + 1 < len(flags):
            m = re.fullmatch(r"([0-9.]+)(ms|s)", flags[i + 1])
            if not m:
                raise ValueError(f"--startup-latency {flags[i + 1]}")
            return int(float(m.group(1)) * (1 if m.group(2) == "ms" else 1000))
    return 1000


def creating(pod):
    """Whether the emulator has reported pod's containers ContainerCreating (bound, starting)."""
    cs = pod.get("status", {}).get("containerStatuses") or []
    return bool(cs) and all((c.get("state") or {}).get("waiting", {}).get("reason") == "ContainerCreating"
                            for c in cs)


def running(pod):
    """Pod with the status a kubelet writes once its containers started (the emulator's)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    st = pod.setdefault("status", {})
    st["phase"] = "Running"
    st.setdefault("podIP", "10.244.255.1")
    for c in st.get("containerStatuses", []):
        c.update(ready=True, started=True, state={"running": {"startedAt": now}})
    conds = {c["type"]: c for c in st.get("conditions", [])}
    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        conds[t] = dict(conds.get(t, {}), type=t, status="True", lastTransitionTime=now)
        conds[t].pop("reason", None)
        conds[t].pop("message", None)
    st["conditions"] = list(conds.values())
    return pod


class RealSide:
    """One side's namespace on a ControlPlane, with the interface compare.py uses of Sim."""

    def __init__(self, cp, ns):
        self.cp, self.ns = cp, ns
        self.kubeconfig = cp.kubeconfig
        self.started = time.monotonic()
        self.seeded = False

    def call(self, method, path, body=None, auth=False):
        return self.cp.call(method, path, body)

    def seed_driver(self, app, driver):
        """Driver pod `driver` of `app`, which the emulator runs (compare.real_sides seeds it,
        then waits)."""
        if self.seeded:
            return
        self.seeded = True
        APP, DRIVER = app, driver
        pod = {"metadata": {"name": DRIVER, "labels": {"spark-app-selector": APP, "spark-role": "driver"}},
               "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:peer"}]}}
        s, body = self.cp.call("POST", f"/api/v1/namespaces/{self.ns}/pods", pod)
        if s != 201:
            raise RuntimeError(f"seeding the driver pod: {s} {body[:300]}")

    def wait_running(self, name, timeout):
        """Waits until pod `name` (the driver) runs. Once the emulator has bound it and said its
        containers are being created, its start is written as the admin, as the kubelet
        reports it (the simulator seeds its driver Running): the scenario's start-up latency
        is the executors', and may be longer than the run (m02)."""
        deadline = time.monotonic() + timeout
        path = f"/api/v1/namespaces/{self.ns}/pods/{name}"
        while True:
            s, body = self.cp.call("GET", path)
            pod = json.loads(body) if s == 200 else {}
            st = pod.get("status", {})
            if st.get("phase") == "Running":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.ns}/{name} not Running after {timeout} s")
            if creating(pod):
                self.cp.call("PUT", path + "/status", running(pod))
            time.sleep(0.05)
        self.started = time.monotonic()

    def phase(self, name, mark):
        s, body = self.cp.call("GET", f"/api/v1/namespaces/{self.ns}/pods/{name}?{mark}")
        return json.loads(body).get("status", {}).get("phase") if s == 200 else None

    def set_phase(self, name, phase, exit_code=0, reason=""):
        """The kubelet's report of a pod whose containers ended: status through pods/NAME/status."""
        path = f"/api/v1/namespaces/{self.ns}/pods/{name}"
        for _ in range(5):
            s, body = self.cp.call("GET", path)
            if s != 200:
                return s
            pod = json.loads(body)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            st = pod.setdefault("status", {})
            st["phase"] = phase
            for c in st.get("containerStatuses", []):
                c["ready"], c["started"] = False, False
                c["state"] = {"terminated": {"exitCode": exit_code, "reason": reason or phase,
                                             "startedAt": now, "finishedAt": now}}
            for cond in st.get("conditions", []):
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond["status"] = "False"
            s, _ = self.cp.call("PUT", path + "/status", pod)
            if s != 409:
                return s
        return s

    def relabel(self, name, labels):
        """A merge patch of the pod's labels, as `kubectl label --overwrite` (a pod never listed)."""
        body = json.dumps({"metadata": {"labels": labels}}).encode()
        return self.cp.call("PATCH", f"/api/v1/namespaces/{self.ns}/pods/{name}", body,
                            "application/merge-patch+json")

    def delete_by_hand(self, name, mark):
        return self.cp.call("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}?{mark}")

    def log(self):
        return self.cp.log(self.ns)

    def stats(self):
        ours = [e for e in self.log() if e["user"]]
        return {"requests": len(ours),
                "by_verb": dict(collections.Counter(f"{e['verb']} {e['resource']}" for e in ours))}

    def close(self):
        pass
