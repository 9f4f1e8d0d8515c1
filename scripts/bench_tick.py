#!/usr/bin/env python3
"""Benchmark 1, tick cost: one `podalloc reconcile --dry-run` against PodLists of N realistic
Spark executor pods served by `podalloc sim` over HTTPS on loopback, side by side with
`curl` fetching exactly the same pages (the floor: TLS + HTTP + gunzip, no parsing) and
`kubectl get pods -l ... -o json` (client-go), with gzip on and off.

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
    ap.add_argument("--kubectl", default="", help="kubectl binary (default: found on PATH)")
    ap.add_argument("--sizes", default="1000,10000,50000")
    ap.add_argument("--repeats", default="7,5,3", help="runs per tool and gzip mode, per size")
    ap.add_argument("--kubectl-runs", default="3,1,1",
                    help="kubectl runs per gzip mode, per size (it takes ~2 s per 1,000 pods "
                         "and ~150 MiB per 1,000 pods; 0 skips it)")
    ap.add_argument("--kubectl-gzip-only-above", type=int, default=10000,
                    help="above this many pods, run kubectl with gzip on only")
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

    result = {"page_size": a.page_size, "selector": SELECTOR, "sizes": [],
              "kubectl": None, "curl": None, "podalloc": a.podalloc}
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

    sim = bench_sim.Sim(a.podalloc, os.path.join(work, "sim"))
    try:
        st, body = sim.request("POST", f"/sim/pods/{NS}",
                               json.dumps(bench_pods.driver_pod(APP)).encode())
        assert st == 201, body
        driver_uid = json.loads(body)["metadata"]["uid"]
        cache_dir = os.path.join(work, "kubectl-cache")
        write_discovery_cache(cache_dir, sim)
        seeded = 0
        for size, repeats, krep in zip(sizes, reps, kreps):
            t0 = time.time()
            sim.seed(NS, (bench_pods.seed_bytes(APP, n, driver_uid)
                          for n in range(seeded + 1, size + 1)))
            seeded = size
            seed_s = time.time() - t0
            print(f"[tick] {size} pods seeded in {seed_s:.1f}s", file=sys.stderr, flush=True)
            kruns = krep if (size <= a.kubectl_gzip_only_above) else 0
            row = run_size(a, sim, work, size, repeats, kubectl, curl, cache_dir,
                           {"gzip": krep, "identity": kruns})
            row["seed_seconds"] = seed_s
            result["sizes"].append(row)
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        sim.stop()
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


def run_size(a, sim, work, size, repeats, kubectl, curl, cache_dir, kubectl_runs):
    paths, raw_bytes = sim.list_pages(NS, SELECTOR, a.page_size)
    listed_at = time.time()
    row = {"pods": size, "pages": len(paths), "bytes": raw_bytes, "repeats": repeats,
           "runs": {}}
    curl_cfg = os.path.join(work, "curl.cfg")

    def refresh_pages():
        nonlocal paths, listed_at
        # Continue tokens expire after 5 minutes (as the apiserver's); list again well before.
        if time.time() - listed_at > 200:
            paths, _ = sim.list_pages(NS, SELECTOR, a.page_size)
            listed_at = time.time()
        with open(curl_cfg, "w") as f:
            for p in paths:
                f.write(f'url = "{sim.url}{p}"\noutput = "/dev/null"\n')

    for gzip in (True, False):
        mode = "gzip" if gzip else "identity"
        kc = sim.kubeconfig if gzip else sim.kubeconfig_nogzip
        state = os.path.join(work, "state.json")
        tools = {
            "podalloc": [a.podalloc, "--kubeconfig", kc, "--app-id", APP,
                         "--state-file", state, "--image", "busybox", "--log-level", "warn",
                         "--page-size", str(a.page_size),
                         "reconcile", "--dry-run", "--target", str(size)],
        }
        if curl:
            tools["curl"] = [curl, "-sS", "--fail", "--cacert", sim.ca_file,
                             "-H", "Authorization: Bearer " + sim.token,
                             *(["--compressed"] if gzip else []), "-K", curl_cfg]
        if kubectl and kubectl_runs[mode] > 0:
            tools["kubectl"] = [kubectl, "--kubeconfig", kc, "--cache-dir", cache_dir,
                                "get", "pods", "-n", NS, "-l", SELECTOR, "-o", "json",
                                f"--chunk-size={a.page_size}"]
        runs = {t: [] for t in tools}
        # Bytes on the wire: one untimed curl run printing each page's download size.
        if curl:
            refresh_pages()
            sizes = subprocess.run(tools["curl"] + ["-w", "%{size_download}\n"],
                                   capture_output=True, text=True)
            row.setdefault("wire_bytes", {})[mode] = sum(
                int(x) for x in sizes.stdout.split() if x.isdigit())
        # One warm-up each (page cache, TLS session setup paths), not recorded.
        for rep in range(repeats + 1):
            for t, cmd in tools.items():
                if t == "kubectl" and not (rep == 0 and size <= 1000) and \
                        len(runs[t]) >= kubectl_runs[mode]:
                    continue  # kubectl is slow: fewer runs, warm-up at the smallest size only
                if t == "curl":
                    refresh_pages()
                r = timed(cmd, work)
                if r["rc"] != 0:
                    err = subprocess.run(cmd, capture_output=True, text=True).stderr[-800:]
                    raise SystemExit(f"bench_tick: {t} failed (exit {r['rc']}): {err}")
                if rep > 0 or (t == "kubectl" and size > 1000):
                    runs[t].append(r)
        row["runs"][mode] = runs
        med = {t: {k: bench_sim.median([r[k] for r in rs]) for k in ("wall", "cpu", "rss_mib")}
               for t, rs in runs.items()}
        row.setdefault("median", {})[mode] = med
        line = "  ".join(f"{t}: {m['wall']:.3f}s wall {m['cpu']:.3f}s cpu {m['rss_mib']:.1f}MiB"
                         for t, m in med.items())
        print(f"[tick] {size} pods, {mode}: {line}", file=sys.stderr, flush=True)
    return row


if __name__ == "__main__":
    main()
