#!/usr/bin/env python3
"""Benchmark 1, tick cost: one `podalloc reconcile --dry-run` against PodLists of N realistic
Spark executor pods served over HTTPS on loopback, side by side with `curl` fetching exactly
the same pages (the floor: TLS + HTTP + gunzip, no parsing) and `kubectl get pods -l ... -o
json` (client-go), with gzip on and off.

The server is the `pageserver` example of crates/podalloc-sim: every page is encoded once, up
front, as JSON and gzip (level 1, over 128 KiB, as kube-apiserver), and served from memory
with `limit`/`continue` like the real server, so a request costs it a lookup and a write and
it is never the bottleneck; curl's own throughput against it is reported to show that. A
last row serves the largest list as ONE response (a server that ignores `limit`, as
kube-apiserver does for resourceVersion=0 lists from its watch cache), for podalloc's peak RSS.

Every tool lists the same label selector with the same page size (`limit`); curl gets the
page URLs, continue tokens included, from a list made just before and fetches them in one
process over one keep-alive connection. Runs are interleaved (podalloc, curl, kubectl,
podalloc, ...) so that machine noise hits all three alike. Wall time is measured here;
user+sys CPU from wait4(2); peak RSS from GNU time's %M (a child of this Python process
would report the parent's RSS as its own peak: Linux records the pre-exec hiwater).

Writes a JSON result file; scripts/bench_report.py turns it into docs/benchmarks.md.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import base64  # noqa: E402
import http.client  # noqa: E402
import ssl  # noqa: E402
from urllib.parse import quote  # noqa: E402

import bench_pods  # noqa: E402
import bench_sim  # noqa: E402

APP = "spark-bench"
NS = "default"
SELECTOR = f"spark-app-selector={APP},spark-role=executor"


def find_kubectl(explicit):
    """kubectl, preferring a real binary over the Google Cloud SDK's version dispatcher."""
    if explicit:
        return explicit if shutil.which(explicit) else None
    k = shutil.which("kubectl")
    if not k:
        return None
    real = os.path.realpath(k)
    d = os.path.dirname(real)
    # The gcloud dispatcher execs kubectl.1.NN; run one of those directly.
    versions = sorted(
        (f for f in os.listdir(d) if f.startswith("kubectl.1.") and f[10:].isdigit()),
        key=lambda f: int(f[10:]))
    if versions:
        return os.path.join(d, versions[-1])
    return k


class PageServer:
    """The `pageserver` example serving a pods file (one pod per line) on a loopback port."""

    def __init__(self, binary, pods_file, workdir, ignore_limit=False, extra=()):
        os.makedirs(workdir, exist_ok=True)
        self.kubeconfig = os.path.join(workdir, "kubeconfig")
        self.kubeconfig_nogzip = self.kubeconfig + "-nogzip"
        self.log = open(os.path.join(workdir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "--pods", pods_file, "--write-kubeconfig", self.kubeconfig,
             *(["--ignore-limit"] if ignore_limit else []), *extra],
            stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("serving "):
            self.stop()
            raise RuntimeError(f"pageserver did not start: {line!r}")
        self.url = line.split()[1]
        kc = json.load(open(self.kubeconfig))
        self.token = kc["users"][0]["user"]["token"]
        ca = base64.b64decode(kc["clusters"][0]["cluster"]["certificate-authority-data"])
        self.ca_file = os.path.join(workdir, "ca.pem")
        with open(self.ca_file, "wb") as f:
            f.write(ca)
        self.host, port = self.url.split("://", 1)[1].rsplit(":", 1)
        self.port = int(port)
        self._ctx = ssl.create_default_context(cadata=ca.decode())

    def list_pages(self, ns, selector, limit):
        """The paths of every page of the list (following continue) and their JSON bytes."""
        base = f"/api/v1/namespaces/{ns}/pods?labelSelector={quote(selector, safe='')}"
        if limit:
            base += f"&limit={limit}"
        c = http.client.HTTPSConnection(self.host, self.port, context=self._ctx, timeout=600)
        paths, total, cont = [], 0, None
        while True:
            path = base + (f"&continue={quote(cont, safe='')}" if cont else "")
            c.request("GET", path, headers={"Authorization": "Bearer " + self.token})
            r = c.getresponse()
            body = r.read()
            assert r.status == 200, body[:300]
            paths.append(path)
            total += len(body)
            cont = json.loads(body)["metadata"].get("continue")
            if not cont:
                break
        c.close()
        return paths, total

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def write_pods(path, n):
    """Executors 1..n as the API server returns them (no managedFields), in the API server's
    order (by name, as etcd keys sort), one per line."""
    with open(path, "wb") as f:
        for i in sorted(range(1, n + 1), key=lambda i: f"{APP}-exec-{i}"):
            f.write(bench_pods.pod_bytes(APP, i, managed_fields=False) + b"\n")


def write_discovery_cache(cache_dir, sim):
    """kubectl resolves `pods` through API discovery (/api, /apis), which the simulator does
    not serve. A warm discovery cache (what kubectl has after its first call to a real
    cluster, valid for hours) is written instead, so kubectl only lists."""
    d = os.path.join(cache_dir, "discovery", f"{sim.host}_{sim.port}")
    os.makedirs(os.path.join(d, "v1"), exist_ok=True)
    with open(os.path.join(d, "servergroups.json"), "w") as f:
        json.dump({"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
            "name": "", "versions": [{"groupVersion": "v1", "version": "v1"}],
            "preferredVersion": {"groupVersion": "v1", "version": "v1"}}]}, f)
    with open(os.path.join(d, "v1", "serverresources.json"), "w") as f:
        json.dump({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
                   "resources": [{"name": "pods", "singularName": "pod", "namespaced": True,
                                  "kind": "Pod", "shortNames": ["po"], "categories": ["all"],
                                  "verbs": ["create", "delete", "deletecollection", "get",
                                            "list", "patch", "update", "watch"]}]}, f)


def timed(cmd, work, stdout=None):
    """bench_sim.measure under GNU time for the peak RSS of the command itself."""
    rss_file = os.path.join(work, "rss")
    out = stdout if stdout is not None else subprocess.DEVNULL
    r = bench_sim.measure(["/usr/bin/time", "-f", "%M", "-o", rss_file, *cmd], stdout=out)
    try:
        r["rss_mib"] = int(open(rss_file).read().split()[-1]) / 1024.0
    except (OSError, ValueError, IndexError):
        r["rss_mib"] = float("nan")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--podalloc", required=True)
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=PATH",
                    help="another podalloc binary run interleaved with the first (e.g. the "
                         "previous commit's), reported as podalloc:NAME")
    ap.add_argument("--pageserver", required=True, help="the pageserver example binary")
    ap.add_argument("--kubectl", default="", help="kubectl binary (default: found on PATH)")
    ap.add_argument("--sizes", default="10000,50000")
    ap.add_argument("--repeats", default="7,3", help="runs per tool and gzip mode, per size")
    ap.add_argument("--kubectl-runs", default="1,0",
                    help="kubectl runs (gzip on only), per size (it takes ~2 s of CPU and "
                         "~150 MiB per 1,000 pods; 0 skips it)")
    ap.add_argument("--single-page-runs", type=int, default=3,
                    help="runs against the largest list served as one response (0 skips)")
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default="")
    a = ap.parse_args()

    sizes = [int(x) for x in a.sizes.split(",")]
    reps = [int(x) for x in a.repeats.split(",")]
    reps += [reps[-1]] * (len(sizes) - len(reps))
    kreps = [int(x) for x in a.kubectl_runs.split(",")]
    kreps += [kreps[-1]] * (len(sizes) - len(kreps))
    work = a.workdir or tempfile.mkdtemp(prefix="podalloc-bench-tick-")
    os.makedirs(work, exist_ok=True)
    kubectl = find_kubectl(a.kubectl)
    curl = shutil.which("curl")
    if not os.path.exists("/usr/bin/time"):
        sys.exit("bench_tick: /usr/bin/time (GNU time) is needed: apt-get install time")
    binaries = {"podalloc": a.podalloc}
    for c in a.compare:
        name, path = c.split("=", 1)
        binaries[f"podalloc:{name}"] = path

    result = {"page_size": a.page_size, "selector": SELECTOR, "sizes": [],
              "server": "pageserver", "kubectl": None, "curl": None, "podalloc": a.podalloc,
              "compare": a.compare}
    if kubectl:
        v = subprocess.run([kubectl, "version", "--client", "-o", "json"],
                           capture_output=True, text=True)
        try:
            result["kubectl"] = {"path": kubectl, "version":
                                 json.loads(v.stdout)["clientVersion"]["gitVersion"]}
        except (ValueError, KeyError):
            result["kubectl"] = {"path": kubectl, "version": "unknown"}
    if curl:
        result["curl"] = {"path": curl, "version": subprocess.run(
            [curl, "--version"], capture_output=True, text=True).stdout.split("\n")[0]}

    for size, repeats, krep in zip(sizes, reps, kreps):
        pods_file = os.path.join(work, f"pods-{size}.jsonl")
        t0 = time.time()
        write_pods(pods_file, size)
        print(f"[tick] {size} pods written in {time.time() - t0:.1f}s", file=sys.stderr,
              flush=True)
        single = a.single_page_runs if size == max(sizes) else 0
        for one_page in ([False, True] if single else [False]):
            srv = PageServer(a.pageserver, pods_file,
                             os.path.join(work, f"server-{size}{'-1' if one_page else ''}"),
                             ignore_limit=one_page)
            try:
                row = run_size(a, srv, work, size, single if one_page else repeats,
                               binaries, kubectl if not one_page else None, curl, krep)
            finally:
                srv.stop()
            row["single_page"] = one_page
            result["sizes"].append(row)
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
        os.remove(pods_file)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


def run_size(a, srv, work, size, repeats, binaries, kubectl, curl, kubectl_runs):
    paths, raw_bytes = srv.list_pages(NS, SELECTOR, a.page_size)
    row = {"pods": size, "pages": len(paths), "bytes": raw_bytes, "repeats": repeats,
           "runs": {}}
    curl_cfg = os.path.join(work, "curl.cfg")
    with open(curl_cfg, "w") as f:
        for p in paths:
            f.write(f'url = "{srv.url}{p}"\noutput = "/dev/null"\n')
    cache_dir = os.path.join(work, "kubectl-cache")
    if kubectl:
        write_discovery_cache(cache_dir, srv)
    state = os.path.join(work, "state.json")
    for gzip in (True, False):
        mode = "gzip" if gzip else "identity"
        kc = srv.kubeconfig if gzip else srv.kubeconfig_nogzip
        tools = {name: [path, "--kubeconfig", kc, "--app-id", APP,
                        "--state-file", state, "--image", "busybox", "--log-level", "warn",
                        "--page-size", str(a.page_size),
                        "reconcile", "--dry-run", "--target", str(size)]
                 for name, path in binaries.items()}
        if curl:
            tools["curl"] = [curl, "-sS", "--fail", "--cacert", srv.ca_file,
                             "-H", "Authorization: Bearer " + srv.token,
                             *(["--compressed"] if gzip else []), "-K", curl_cfg]
        krun = kubectl_runs if (kubectl and gzip) else 0
        if krun:
            tools["kubectl"] = [kubectl, "--kubeconfig", kc, "--cache-dir", cache_dir,
                                "get", "pods", "-n", NS, "-l", SELECTOR, "-o", "json",
                                f"--chunk-size={a.page_size}"]
        runs = {t: [] for t in tools}
        if curl:
            sizes = subprocess.run(tools["curl"] + ["-w", "%{size_download}\n"],
                                   capture_output=True, text=True)
            row.setdefault("wire_bytes", {})[mode] = sum(
                int(x) for x in sizes.stdout.split() if x.isdigit())
        # One warm-up round (not recorded), then interleaved rounds: every tool once per round.
        for rep in range(repeats + 1):
            for t, cmd in tools.items():
                if t == "kubectl" and (rep == 0 or len(runs[t]) >= krun):
                    continue
                r = timed(cmd, work)
                if r["rc"] != 0:
                    err = subprocess.run(cmd, capture_output=True, text=True).stderr[-800:]
                    raise SystemExit(f"bench_tick: {t} failed (exit {r['rc']}): {err}")
                if rep > 0:
                    runs[t].append(r)
        row["runs"][mode] = runs
        med = {t: {k: bench_sim.median([r[k] for r in rs]) for k in ("wall", "cpu", "rss_mib")}
               for t, rs in runs.items() if rs}
        if "curl" in med:
            med["curl"]["mb_per_s"] = raw_bytes / 1e6 / med["curl"]["wall"]
        row.setdefault("median", {})[mode] = med
        line = "  ".join(f"{t}: {m['wall']:.3f}s wall {m['cpu']:.3f}s cpu {m['rss_mib']:.1f}MiB"
                         for t, m in med.items())
        print(f"[tick] {size} pods{' one page' if len(paths) == 1 else ''}, {mode}: {line}",
              file=sys.stderr, flush=True)
    return row


if __name__ == "__main__":
    main()
