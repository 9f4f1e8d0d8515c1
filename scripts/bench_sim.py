"""Helpers shared by the benchmark scripts: start/stop `podalloc sim`, talk to it over
HTTPS (seeding, /sim/stats), and measure a child process (wall, CPU, peak RSS) with
wait4(2)'s rusage.  Loopback only.  Python 3.8+, standard library only."""

import base64
import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import time
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_pods  # noqa: E402


class Sim:
    """A `podalloc sim` child process serving HTTPS on an ephemeral loopback port."""

    def __init__(self, podalloc, workdir, args=()):
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self.kubeconfig = os.path.join(workdir, "kubeconfig")
        self.log = open(os.path.join(workdir, "sim.log"), "wb")
        self.proc = subprocess.Popen(
            [podalloc, "--log-level", "warn", "sim", "--write-kubeconfig", self.kubeconfig,
             *args],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("serving "):
            self.stop()
            raise RuntimeError(f"podalloc sim did not start: {line!r} (see {workdir}/sim.log)")
        # The rest of stdout is not needed; drain it so the child never blocks on it.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.url = line.split()[1]
        deadline = time.time() + 10
        while not os.path.exists(self.kubeconfig) and time.time() < deadline:
            time.sleep(0.02)
        kc = json.load(open(self.kubeconfig))
        cluster = kc["clusters"][0]["cluster"]
        self.token = kc["users"][0]["user"]["token"]
        self.ca_pem = base64.b64decode(cluster["certificate-authority-data"])
        self.ca_file = os.path.join(workdir, "ca.pem")
        with open(self.ca_file, "wb") as f:
            f.write(self.ca_pem)
        self.token_file = os.path.join(workdir, "token")
        with open(self.token_file, "w") as f:
            f.write(self.token)
        # The same cluster without gzip (kubectl and podalloc both read this field).
        kc2 = json.loads(json.dumps(kc))
        kc2["clusters"][0]["cluster"]["disable-compression"] = True
        self.kubeconfig_nogzip = os.path.join(workdir, "kubeconfig-nogzip")
        with open(self.kubeconfig_nogzip, "w") as f:
            json.dump(kc2, f)
        hostport = self.url.split("://", 1)[1]
        self.host, port = hostport.rsplit(":", 1)
        self.port = int(port)
        self._ctx = ssl.create_default_context(cadata=self.ca_pem.decode())

    def conn(self):
        return http.client.HTTPSConnection(self.host, self.port, context=self._ctx, timeout=600)

    def request(self, method, path, body=None, conn=None, headers=None):
        c = conn or self.conn()
        h = {"Authorization": "Bearer " + self.token}
        if body is not None:
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        return r.status, data

    def stats(self):
        st, body = self.request("GET", "/sim/stats")
        assert st == 200, body
        return json.loads(body)

    def seed(self, ns, bodies, max_bytes=2 << 20):
        """Seeds pods (JSON bodies, bytes, without the fields the server sets) through the
        simulator's bulk side door: `POST /sim/pods/{ns}` with a `PodList` of as many pods
        as fit in `max_bytes` (the server takes at most 3 MiB a request, as kube-apiserver),
        over one keep-alive connection. The simulator stores each item as it stores a pod
        created through the API (uid, resourceVersion, creationTimestamp, and the kubelet
        model's status for a given `status.phase`). Returns the number of pods seeded."""
        head, tail = b'{"kind":"PodList","apiVersion":"v1","items":[', b"]}"
        c = self.conn()
        n, batch, size = 0, [], 0

        def flush():
            st, data = self.request("POST", f"/sim/pods/{ns}",
                                    head + b",".join(batch) + tail, conn=c)
            if st != 201:
                raise RuntimeError(f"seeding failed after {n} pods: {st} {data[:300]!r}")

        for b in bodies:
            if batch and size + len(b) + 1 > max_bytes - len(head) - len(tail):
                flush()
                n += len(batch)
                batch, size = [], 0
            batch.append(b)
            size += len(b) + 1
        if batch:
            flush()
            n += len(batch)
        c.close()
        return n

    def list_pages(self, ns, selector, limit):
        """The URLs (path+query) of every page of a list, following continue tokens, and the
        total bytes of the (uncompressed) pages."""
        base = f"/api/v1/namespaces/{ns}/pods?labelSelector={quote(selector, safe='')}"
        if limit:
            base += f"&limit={limit}"
        paths, total, cont = [], 0, None
        c = self.conn()
        while True:
            p = base + (f"&continue={quote(cont, safe='')}" if cont else "")
            st, body = self.request("GET", p, conn=c)
            assert st == 200, body[:300]
            paths.append(p)
            total += len(body)
            cont = json.loads(body).get("metadata", {}).get("continue")
            if not cont:
                break
        c.close()
        return paths, total

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def measure(cmd, env=None, stdout=subprocess.DEVNULL, stderr=None, timeout=600):
    """Runs `cmd`; returns dict(wall, user, sys, cpu, rss_mib, rc). CPU and peak RSS come from
    wait4(2) on that one child (its own rusage, not the simulator's)."""
    err = stderr if stderr is not None else subprocess.DEVNULL
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=err, stdin=subprocess.DEVNULL)
    killer = threading.Timer(timeout, p.kill)
    killer.start()
    _, status, ru = os.wait4(p.pid, 0)
    killer.cancel()
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return {
        "wall": wall, "user": ru.ru_utime, "sys": ru.ru_stime,
        "cpu": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024.0,
        "rc": p.returncode,
    }


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if n == 0:
        return float("nan")
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
