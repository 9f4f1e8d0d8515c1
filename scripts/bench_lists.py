#!/usr/bin/env python3
"""What one list of an app's executor pods costs a real kube-apiserver, by read option and
encoding: a consistent list (resourceVersion unset: etcd, or the watch cache once it has
caught up, KEP-2340), resourceVersion=0 (any version the watch cache holds),
resourceVersionMatch=NotOlderThan with the last list's resourceVersion (the watch cache, never
older than what the client saw), each in JSON, JSON with gzip, and Protobuf.

One control plane (scripts/controlplane.sh start), --pods executor pods created in one
namespace (not run: no kubelet is needed to list them), then --lists lists per variant,
paginated with limit=500 as podalloc lists, made by curl so the client is the same for
every variant. Reported: kube-apiserver + etcd CPU milliseconds per list (utime + stime from
/proc), client wall milliseconds per list, and bytes per list.

    scripts/bench_lists.py [--pods 10000] [--lists 20]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def cpu(pids):
    t = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        t += int(fields[11]) + int(fields[12])
    return t / TICK


def curl(url, token, ca, accept, gzip):
    args = ["curl", "-sS", "--cacert", ca, "-H", f"Authorization: Bearer {token}", "-H", f"Accept: {accept}",
            "-o", "-", "-w", "\n%{size_download}"]
    if gzip:
        args.append("--compressed")
    out = subprocess.run(args + [url], check=True, capture_output=True).stdout
    body, size = out.rsplit(b"\n", 1)
    return body, int(size)


def varint(b, i):
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return n, i


def fields(b):
    """The length-delimited fields of one Protobuf message: {number: bytes} (last wins)."""
    out, i = {}, 0
    while i < len(b):
        key, i = varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 2:
            n, i = varint(b, i)
            out[num] = b[i:i + n]
            i += n
        elif wire == 0:
            _, i = varint(b, i)
        else:
            raise ValueError(f"wire type {wire}")
    return out


def proto_list_meta(body):
    """ListMeta of a Protobuf PodList: the envelope `k8s\\0` + runtime.Unknown (raw = field 2),
    whose field 1 is ListMeta (resourceVersion 2, continue 3), as strings."""
    assert body[:4] == b"k8s\x00", body[:16]
    raw = fields(body[4:])[2]
    meta = fields(fields(raw)[1]) if 1 in fields(raw) else {}
    return {k: v.decode() for k, v in meta.items()}


def list_all(base, ns, token, ca, accept, gzip, rv_params):
    """One paginated list; returns (bytes, the list's resourceVersion)."""
    sel = urllib.parse.quote("spark-app-selector=bench,spark-role=executor")
    cont, total, rv = "", 0, ""
    while True:
        q = f"labelSelector={sel}&limit=500"
        if cont:
            q += f"&continue={cont}"
        else:
            q += rv_params
        body, size = curl(f"{base}/api/v1/namespaces/{ns}/pods?{q}", token, ca, accept, gzip)
        total += size
        if accept.startswith("application/json"):
            meta = json.loads(body)["metadata"]
            cont, rv = meta.get("continue", ""), rv or meta.get("resourceVersion", "")
        else:
            meta = proto_list_meta(body)
            cont, rv = meta.get(3, ""), rv or meta.get(2, "")
        if not cont:
            return total, rv


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=10000)
    ap.add_argument("--lists", type=int, default=20)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="podalloc-bench-lists-")
    cp = os.path.join(d, "cp")
    env = dict(os.environ, PODALLOC_CP_WATCH_PID=str(os.getpid()))
    print(subprocess.run(["bash", os.path.join(ROOT, "scripts/controlplane.sh"), "start", cp], env=env,
                         check=True, capture_output=True, text=True).stdout.strip(), file=sys.stderr)
    try:
        run(a, cp)
    finally:
        subprocess.run(["bash", os.path.join(ROOT, "scripts/controlplane.sh"), "stop", cp])


def run(a, cp):
    base = open(os.path.join(cp, "url")).read().strip()
    token = open(os.path.join(cp, "admin.token")).read().strip()
    ca = os.path.join(cp, "pki/ca.crt")
    pids = [int(open(os.path.join(cp, f)).read()) for f in ("kube-apiserver.pid", "etcd.pid")]
    kubectl = ["kubectl", "--kubeconfig", os.path.join(cp, "admin.kubeconfig")]
    subprocess.run([*kubectl, "create", "namespace", "bench"], check=True, capture_output=True)
    # The pods, realistic in size: Spark's labels, env and resources (created by kubectl in
    # chunks of 500 objects).
    t0 = time.time()
    for start in range(0, a.pods, 500):
        items = []
        for i in range(start, min(start + 500, a.pods)):
            items.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"bench-exec-{i + 1}", "namespace": "bench",
                "labels": {"spark-app-selector": "bench", "spark-role": "executor", "spark-exec-id": str(i + 1)}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "executor", "image": "registry.example/spark:3.5.0",
                    "args": ["executor"],
                    "env": [{"name": "SPARK_EXECUTOR_ID", "value": str(i + 1)},
                            {"name": "SPARK_APPLICATION_ID", "value": "bench"},
                            {"name": "SPARK_EXECUTOR_MEMORY", "value": "4g"}],
                    "resources": {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "4Gi"}}}]}})
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        subprocess.run([*kubectl, "create", "-f", "-"], input=doc.encode(), check=True, capture_output=True)
    print(f"created {a.pods} pods in {time.time() - t0:.0f} s", file=sys.stderr)
    time.sleep(2)
    _, last_rv = list_all(base, "bench", token, ca, "application/json", False, "")
    variants = [
        ("consistent (resourceVersion unset)", ""),
        ("resourceVersion=0", "&resourceVersion=0"),
        ("NotOlderThan the last list", f"&resourceVersion={last_rv}&resourceVersionMatch=NotOlderThan"),
    ]
    encodings = [
        ("JSON", "application/json", False),
        ("JSON + gzip", "application/json", True),
        ("Protobuf", "application/vnd.kubernetes.protobuf", False),
    ]
    print("| read | encoding | apiserver+etcd CPU ms per list | client wall ms per list | bytes per list |")
    print("|---|---|---|---|---|")
    for rname, params in variants:
        for ename, accept, gz in encodings:
            list_all(base, "bench", token, ca, accept, gz, params)  # warm
            c0, w0 = cpu(pids), time.time()
            size = 0
            for _ in range(a.lists):
                size, _ = list_all(base, "bench", token, ca, accept, gz, params)
            c1, w1 = cpu(pids), time.time()
            print(f"| {rname} | {ename} | {(c1 - c0) * 1000 / a.lists:.0f} | {(w1 - w0) * 1000 / a.lists:.0f} | {size} |")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
