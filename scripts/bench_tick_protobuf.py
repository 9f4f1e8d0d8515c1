#!/usr/bin/env python3
"""The tick against the wire, JSON and Protobuf side by side on the same pods: one `podalloc
reconcile --dry-run` listing N executor pods from the `pageserver` example (pages encoded
once, served from memory: never the bottleneck), next to curl fetching exactly the same
pages, each with gzip on and off.

The pods are kube-apiserver's own: the 500 of fixtures/bench/pods-500.{json,pb}.gz (recorded
by scripts/record_bench_pages.py: spec, status and managedFields as the server keeps them),
repeated to N with each copy's name, uid and spark-exec-id rewritten, in both encodings. One
pageserver serves them as JSON only (a server without Protobuf: podalloc falls back to JSON),
one also as Protobuf (podalloc asks for it, as client-go does); curl asks each for what
podalloc gets. Rounds are interleaved; medians of wall time and user+sys CPU are printed
with podalloc's ratio to curl on the same bytes. `--compare NAME=PATH` runs another podalloc
binary (e.g. the previous commit's, copied aside) in the same rounds, as `podalloc:NAME`.

    cargo build --release && cargo build --release -p podalloc-sim --example pageserver
    scripts/bench_tick_protobuf.py [--pods 10000] [--rounds 5] [--compare base=/tmp/podalloc-old]
"""
import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_tick  # noqa: E402
from bench_lists import varint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = "spark-bench"
PB = "application/vnd.kubernetes.protobuf"


def enc_varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def fields(b):
    """Every field of one message, in order: (number, wire type, raw value bytes)."""
    out, i = [], 0
    while i < len(b):
        key, i = varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 2:
            n, i = varint(b, i)
            out.append((num, wire, b[i:i + n]))
            i += n
        elif wire == 0:
            j = i
            _, i = varint(b, i)
            out.append((num, wire, b[j:i]))
        else:
            raise ValueError(f"wire type {wire}")
    return out


def join(fs):
    out = bytearray()
    for num, wire, v in fs:
        out += enc_varint(num << 3 | wire)
        if wire == 2:
            out += enc_varint(len(v))
        out += v
    return bytes(out)


def pb_items(page):
    assert page[:4] == b"k8s\x00"
    raw = next(v for n, _, v in fields(page[4:]) if n == 2)
    return [v for n, _, v in fields(raw) if n == 2]


def pb_rename(pod, name, uid, exec_id):
    """The Pod message with metadata name (1), uid (5) and the spark-exec-id label (11)."""
    out = []
    for n, w, v in fields(pod):
        if n == 1:
            meta = []
            for mn, mw, mv in fields(v):
                if mn == 1:
                    mv = name.encode()
                elif mn == 5:
                    mv = uid.encode()
                elif mn == 11 and fields(mv)[0][2] == b"spark-exec-id":
                    mv = join([(1, 2, b"spark-exec-id"), (2, 2, exec_id.encode())])
                meta.append((mn, mw, mv))
            v = join(meta)
        out.append((n, w, v))
    return join(out)


def write_pods(n, jsonl, records):
    page_json = json.loads(gzip.open(os.path.join(ROOT, "fixtures/bench/pods-500.json.gz")).read())
    page_pb = gzip.open(os.path.join(ROOT, "fixtures/bench/pods-500.pb.gz")).read()
    items_json, items_pb = page_json["items"], pb_items(page_pb)
    assert len(items_json) == len(items_pb) == 500
    # The API server's order: by name, as etcd keys sort.
    ids = sorted(range(1, n + 1), key=lambda i: f"{APP}-exec-{i}")
    with open(jsonl, "w") as jf, open(records, "wb") as pf:
        for k, i in enumerate(ids):
            name, uid = f"{APP}-exec-{i}", f"00000000-0000-4000-8000-{i:012d}"
            pod = json.loads(json.dumps(items_json[k % 500]))
            pod["metadata"].update(name=name, uid=uid)
            pod["metadata"]["labels"]["spark-exec-id"] = str(i)
            jf.write(json.dumps(pod, separators=(",", ":")) + "\n")
            rec = pb_rename(items_pb[k % 500], name, uid, str(i))
            pf.write(len(rec).to_bytes(4, "big") + rec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--podalloc", default=os.path.join(ROOT, "target/release/podalloc"))
    ap.add_argument("--compare", action="append", default=[], metavar="NAME=PATH",
                    help="another podalloc binary run interleaved with the first, reported as "
                         "podalloc:NAME")
    ap.add_argument("--pageserver", default=os.path.join(ROOT, "target/release/examples/pageserver"))
    a = ap.parse_args()
    a.binaries = {"podalloc": a.podalloc}
    for c in a.compare:
        name, _, path = c.partition("=")
        if not name or not path:
            sys.exit(f"bench_tick_protobuf: --compare {c!r}: expected NAME=PATH")
        a.binaries[f"podalloc:{name}"] = path
    work = tempfile.mkdtemp(prefix="podalloc-bench-pb-")
    jsonl, records = os.path.join(work, "pods.jsonl"), os.path.join(work, "pods.pb")
    write_pods(a.pods, jsonl, records)
    servers = {
        "JSON": bench_tick.PageServer(a.pageserver, jsonl, os.path.join(work, "json")),
        "Protobuf": bench_tick.PageServer(a.pageserver, jsonl, os.path.join(work, "pb"),
                                          extra=["--pods-pb", records]),
    }
    try:
        run(a, work, servers)
    finally:
        for s in servers.values():
            s.stop()


def run(a, work, servers):
    sel = f"spark-app-selector={APP},spark-role=executor"
    tools = {}
    for enc, srv in servers.items():
        paths, _ = srv.list_pages("default", sel, 500)
        cfg = os.path.join(work, f"curl-{enc}.cfg")
        with open(cfg, "w") as f:
            for p in paths:
                f.write(f'url = "{srv.url}{p}"\noutput = "/dev/null"\n')
        accept = f"{PB}, application/json;q=0.9" if enc == "Protobuf" else "application/json"
        for gz in (True, False):
            kc = srv.kubeconfig if gz else srv.kubeconfig_nogzip
            row = f"{enc}{' + gzip' if gz else ''}"
            for tool, binary in a.binaries.items():
                tools[(row, tool)] = [binary, "--kubeconfig", kc, "--app-id", APP,
                                      "--state-file", os.path.join(work, f"state-{tool}.json"),
                                      "--image", "busybox", "--log-level", "warn",
                                      "reconcile", "--dry-run", "--target", str(a.pods)]
            tools[(row, "curl")] = ["curl", "-sS", "--fail", "--cacert", srv.ca_file,
                                    "-H", "Authorization: Bearer " + srv.token, "-H", f"Accept: {accept}",
                                    *(["--compressed"] if gz else []), "-K", cfg]
    runs = {k: [] for k in tools}
    for rnd in range(a.rounds + 1):
        for k, cmd in tools.items():
            r = bench_tick.timed(cmd, work)
            if r["rc"] != 0:
                err = subprocess.run(cmd, capture_output=True, text=True).stderr[-600:]
                sys.exit(f"bench_tick_protobuf: {k} failed (exit {r['rc']}): {err}")
            if rnd > 0:
                runs[k].append(r)
    med = {k: {m: statistics.median(r[m] for r in rs) for m in ("wall", "cpu", "rss_mib")}
           for k, rs in runs.items()}
    print(f"{a.pods} pods (kube-apiserver's own bytes, managedFields included), pages of 500, "
          f"{a.rounds} interleaved rounds, medians:")
    print("| list | podalloc | wall s | curl wall s | / curl wall | CPU s | curl CPU s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for row in dict.fromkeys(r for r, _ in tools):
        c = med[(row, "curl")]
        for tool in a.binaries:
            p = med[(row, tool)]
            print(f"| {row} | {tool} | {p['wall']:.3f} | {c['wall']:.3f} | {p['wall'] / c['wall']:.2f}× | "
                  f"{p['cpu']:.3f} | {c['cpu']:.3f} | {p['rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
