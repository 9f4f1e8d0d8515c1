#!/usr/bin/env python3
"""Many apps in one process at scale: one `podalloc apps --file` keeping --apps apps ×
--executors executors in one namespace (default 1,000 × 100: 100,000 pods).

    scripts/bench_apps_scale.py sim  [--apps 1000] [--executors 100] [--rounds 3]
    scripts/bench_apps_scale.py real [--apps 100] [--executors 100] [--rounds 3]

Both converge every app from 0 (`apps --until-converged`, --batch-size = --executors, so an
app's first tick asks for all its pods), then make --rounds steady passes (`apps --once`:
the process starts, loads every state file, lists the namespace once, ticks every app,
exits), each followed by curl fetching the same list (the floor): the same paths, query and
`Accept` header as podalloc's, with continue tokens of a list made just before it, over one
connection. Per pass: wall time, CPU and peak RSS (wait4's rusage), the server's count of
podalloc's requests. That both read the same bytes is checked on the first pass, logged at
debug level: podalloc's page paths and byte counts against curl's on those very paths.

`sim`: the built-in simulator over HTTPS on loopback (a fast kubelet model: 10 ms to
schedule, 100 ms to start; it answers Protobuf, as kube-apiserver does), passes with gzip and without, requests from
/sim/stats, and the simulator's own peak RSS (VmHWM).

`real`: kube-apiserver + etcd (scripts/controlplane.sh start, with bench_real.py's audit
policy) and the kubelet emulator running the pods (10 ms, 100 ms); podalloc as user
`podalloc-a`, its requests from the audit log; kube-apiserver + etcd CPU seconds (utime +
stime from /proc) per podalloc pass and per curl list (as the admin, the same Protobuf).

Needs: cargo, python3 (standard library), curl; `real` also scripts/controlplane.sh build.
Prints Markdown; raw logs in a temporary folder it names on stderr.
"""
import argparse
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_real  # noqa: E402
import bench_sim  # noqa: E402

ROOT = bench_real.ROOT
BIN = os.path.join(ROOT, "target/release/podalloc")
ACCEPT = "application/vnd.kubernetes.protobuf, application/json;q=0.9"
# podalloc's debug line for each response: "GET URL -> 200 (N bytes of TYPE, M ms)".
RESPONSE = re.compile(r"GET (https?://[^/\s]+)(/api/v1/namespaces/[^/]+/pods\?\S*) -> 200 \((\d+) bytes of ([^,\s]+)")


def apps_file(path, apps, execs, ns):
    with open(path, "w") as f:
        f.write("apps:\n")
        for i in range(1, apps + 1):
            f.write(f"- app-id: app-{i}\n  namespace: {ns}\n  image: spark:3.5\n  target: {execs}\n")


def measured(cmd, log):
    with open(log, "wb") as out:
        r = bench_sim.measure(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=3600)
    if r["rc"] != 0:
        sys.exit(f"bench_apps_scale: {cmd[0]} exited {r['rc']}: see {log}")
    return r


class Server:
    """What a run needs of a server: its URL, CA and a token for curl, podalloc's connection
    flags, a count of podalloc's requests, and the server's CPU seconds (None: not measured)."""

    def __init__(self, url, ca, token, podalloc_flags, work):
        self.url, self.ca, self.token, self.flags, self.work = url, ca, token, podalloc_flags, work
        self.ctx = ssl.create_default_context(cafile=ca)

    def curl(self, paths, gzip=False):
        """curl fetching every path over one connection, printing each page's bytes."""
        cfg = os.path.join(self.work, "curl.cfg")
        with open(cfg, "w") as f:
            for p in paths:
                f.write(f'url = "{self.url}{p}"\noutput = "/dev/null"\n')
        return ["curl", "-sS", "--fail", "--cacert", self.ca, "-H", f"Authorization: Bearer {self.token}",
                "-H", f"Accept: {ACCEPT}", *(["--compressed"] if gzip else []),
                "-w", "%{size_download}\\n", "-K", cfg]

    def pages(self, first):
        """The paths of a list made now from podalloc's first page path, following the
        continue tokens (as JSON: the tokens are the same in either encoding)."""
        paths, cont = [], None
        while True:
            p = first + (f"&continue={urllib.request.quote(cont, safe='')}" if cont else "")
            req = urllib.request.Request(self.url + p, headers={"Authorization": f"Bearer {self.token}"})
            paths.append(p)
            cont = json.load(urllib.request.urlopen(req, context=self.ctx))["metadata"].get("continue")
            if not cont:
                return paths

    def cpu(self):
        """The server's CPU seconds so far; None where they are not measured."""
        return None


class SimServer(Server):
    def __init__(self, sim, work, gzip):
        super().__init__(sim.url, sim.ca_file, sim.token,
                         ["--kubeconfig", sim.kubeconfig if gzip else sim.kubeconfig_nogzip], work)
        self.sim = sim

    def requests(self):
        return self.sim.stats()["requests"]

    def requests_since(self, mark):
        return {("all", "requests"): self.requests() - mark - 1}  # less the stats read itself


class RealServer(Server):
    def __init__(self, cp, work):
        super().__init__(cp.url, cp.ca, cp.read("admin.token"),
                         ["--server", cp.url, "--token", cp.read("podalloc-a.token"),
                          "--certificate-authority", cp.ca, "-n", "apps"], work)
        self.cp = cp

    def requests(self):
        return self.cp.audit.mark()

    def requests_since(self, mark):
        return self.cp.audit.count(mark, self.cp.audit.mark(), "podalloc-a")

    def cpu(self):
        return self.cp.cpu()


def one_pass(srv, pa, work, name, first, gzip=False):
    """One `apps --once` pass, then curl on a fresh list of the same pages from path `first`:
    two result dicts (wall, cpu, rss_mib, server_cpu where measured, and podalloc's requests)."""
    mark, c0 = srv.requests(), srv.cpu()
    r = measured(pa(srv, "warn", "--once"), os.path.join(work, f"{name}.log"))
    c1 = srv.cpu()
    r["requests"] = srv.requests_since(mark)
    fresh = srv.pages(first)
    c2 = srv.cpu()
    cr = measured(srv.curl(fresh, gzip), os.path.join(work, "curl.out"))
    c3 = srv.cpu()
    if c0 is not None:
        r["server_cpu"], cr["server_cpu"] = c1 - c0, c3 - c2
    return r, cr


def same_bytes(srv, pa, work):
    """One untimed pass at debug level (no gzip), podalloc's (path, bytes) per page against
    curl's on those very paths: (first page's path, pages, bytes) when they agree; exits
    naming the difference otherwise."""
    log = os.path.join(work, "check-pass.log")
    measured(pa(srv, "debug", "--once"), log)
    found = RESPONSE.findall(open(log).read())
    pages = [(p, int(b)) for _, p, b, _ in found]
    if not pages:
        sys.exit(f"bench_apps_scale: no pod list in {log}")
    out = subprocess.run(srv.curl([p for p, _ in pages]), capture_output=True, text=True, check=True).stdout
    theirs, ours = [int(x) for x in out.split()], [b for _, b in pages]
    if theirs != ours:
        sys.exit(f"bench_apps_scale: bytes differ: podalloc {ours[:5]}…, curl {theirs[:5]}…")
    kind = "Protobuf" if all("protobuf" in f[3] for f in found) else "JSON"
    return pages[0][0], len(ours), sum(ours), kind


def converge(pa, srv, work):
    log = os.path.join(work, "converge.log")
    c0 = srv.cpu()
    r = measured(pa(srv, "info", "--until-converged", "--timeout", "3600s"), log)
    m = re.findall(r"after (\d+) round", open(log).read())
    r["passes"] = m[-1] if m else "?"
    r["server_cpu"] = None if c0 is None else srv.cpu() - c0
    return r


def med(runs, key):
    return statistics.median(r[key] for r in runs)


def run_sim(a, work, pa):
    sim = bench_sim.Sim(BIN, os.path.join(work, "sim"),
                        ["--schedule-latency", "10ms", "--startup-latency", "100ms", "--nodes", "100",
                         "--namespaces", "default,kube-system,one"])
    try:
        srv = {gz: SimServer(sim, work, gz) for gz in (True, False)}
        s0 = sim.stats()["requests"]
        conv = converge(pa, srv[True], work)
        conv["requests"] = sim.stats()["requests"] - s0
        live = sim.stats()["live_pods"]
        if live < a.apps * a.executors:
            sys.exit(f"bench_apps_scale: {live} live pods after converging")
        first, pages, nbytes, kind = same_bytes(srv[False], pa, work)
        runs = {}
        for rnd in range(a.rounds):
            for gz in (True, False):
                r, c = one_pass(srv[gz], pa, work, f"pass-{rnd}-{'gzip' if gz else 'plain'}", first, gz)
                runs.setdefault(("podalloc", gz), []).append(r)
                runs.setdefault(("curl", gz), []).append(c)
        with open(f"/proc/{sim.proc.pid}/status") as f:
            hwm = next(int(x.split()[1]) / 1024 for x in f if x.startswith("VmHWM:"))
    finally:
        sim.stop()
    n = a.apps * a.executors
    print(f"{a.apps:,} apps × {a.executors} executors ({n:,} pods) in one namespace, release build, "
          f"simulator over HTTPS on loopback; medians of {a.rounds} passes:\n")
    print(f"- converge from 0: {conv['wall']:.1f} s ({conv['passes']} rounds), {conv['requests']:,} requests, "
          f"podalloc CPU {conv['cpu']:.1f} s, peak RSS {conv['rss_mib']:.0f} MiB")
    per_pass = sorted({r["requests"][("all", "requests")] for gz in (True, False) for r in runs[("podalloc", gz)]})
    print(f"- one steady pass: {pages} pages, {nbytes:,} bytes of {kind} (podalloc's and curl's the same, page "
          f"by page); requests per pass: {', '.join(map(str, per_pass))}")
    print(f"- the simulator's peak RSS: {hwm:.0f} MiB\n")
    print("| one steady pass | podalloc wall s | curl wall s | podalloc / curl | podalloc CPU s | curl CPU s "
          "| podalloc peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for gz in (True, False):
        p, c = runs[("podalloc", gz)], runs[("curl", gz)]
        print(f"| {kind + ' + gzip' if gz else kind} | {med(p, 'wall'):.2f} | {med(c, 'wall'):.2f} "
              f"| {med(p, 'wall') / med(c, 'wall'):.2f}× | {med(p, 'cpu'):.2f} | {med(c, 'cpu'):.2f} "
              f"| {med(p, 'rss_mib'):.0f} |")


def run_real(a, work, pa):
    cp = bench_real.ControlPlane(work)
    bench_real.namespace(cp.kubectl, "apps", "podalloc-a")
    kubelet = cp.kubelet(["apps"], "--schedule-ms", "10", "--startup-ms", "100")
    try:
        srv = RealServer(cp, work)
        conv = converge(pa, srv, work)
        first, pages, nbytes, kind = same_bytes(srv, pa, work)
        rows = [one_pass(srv, pa, work, f"pass-{rnd}", first) for rnd in range(a.rounds)]
    finally:
        kubelet.terminate()
        cp.stop()
    n = a.apps * a.executors
    print(f"{a.apps:,} apps × {a.executors} executors ({n:,} pods) in one namespace on kube-apiserver + etcd, "
          "the kubelet emulator running them:\n")
    print(f"- converge from 0: {conv['wall']:.1f} s ({conv['passes']} rounds), apiserver+etcd "
          f"{conv['server_cpu']:.1f} CPU s, podalloc CPU {conv['cpu']:.1f} s, peak RSS {conv['rss_mib']:.0f} MiB")
    print(f"- one steady pass: {pages} pages, {nbytes:,} bytes of {kind} (podalloc's and curl's the same, "
          "page by page)\n")
    print("| pass | podalloc wall s | podalloc CPU s | podalloc peak RSS MiB | apiserver+etcd CPU s "
          "| podalloc's requests | curl (same list) wall s | apiserver+etcd CPU s for curl's |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (r, c) in enumerate(rows):
        print(f"| {i + 1} | {r['wall']:.2f} | {r['cpu']:.2f} | {r['rss_mib']:.0f} | {r['server_cpu']:.2f} "
              f"| {bench_real.fmt_req(r['requests'])} | {c['wall']:.2f} | {c['server_cpu']:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("where", choices=("sim", "real"))
    ap.add_argument("--apps", type=int, help="default: 1,000 on the simulator, 100 on the real server")
    ap.add_argument("--executors", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    a.apps = a.apps or (1000 if a.where == "sim" else 100)
    for args in (["--bin", "podalloc"], ["-p", "podalloc-sim", "--example", "kubelet"]):
        subprocess.run(["cargo", "build", "--release", "--locked", *args], cwd=ROOT, check=True, capture_output=True)
    work = tempfile.mkdtemp(prefix=f"podalloc-bench-apps-{a.where}-")
    print(f"raw logs: {work}", file=sys.stderr)
    apps_yaml = os.path.join(work, "apps.yaml")
    apps_file(apps_yaml, a.apps, a.executors, "one" if a.where == "sim" else "apps")
    state = os.path.join(work, "state")

    def pa(srv, level, *flags):
        """podalloc apps on `srv` at log `level` with `flags`."""
        return [BIN, *srv.flags, "--batch-size", str(a.executors), "--batch-delay", "200ms", "--log-level", level,
                "apps", "--file", apps_yaml, "--state-dir", state, *flags]
    (run_sim if a.where == "sim" else run_real)(a, work, pa)


if __name__ == "__main__":
    main()
