#!/usr/bin/env python3
"""Records the pages `cargo bench --bench decode` compares JSON and Protobuf on: the same 500
executor pods (scripts/bench_pods.py --count 500, spec and status) stored in a real
kube-apiserver (scripts/controlplane.sh start), then listed once as JSON and once as Protobuf
(`limit=500`, the tick's page size), so both encodings are kube-apiserver's own bytes of the
same objects (managedFields included, as the server keeps them). Written gzipped to
fixtures/bench/pods-500.json.gz and pods-500.pb.gz.

    scripts/record_bench_pages.py
"""
import gzip
import json
import os
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APP = "spark-bench"
NS = "bench"


def call(base, token, ctx, method, path, body=None, accept="application/json"):
    req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode())
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Accept", accept)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, context=ctx) as r:
        return r.headers.get("Content-Type"), r.read()


def main():
    d = tempfile.mkdtemp(prefix="podalloc-record-")
    cp = os.path.join(d, "cp")
    env = dict(os.environ, PODALLOC_CP_WATCH_PID=str(os.getpid()))
    script = os.path.join(ROOT, "scripts/controlplane.sh")
    print(subprocess.run(["bash", script, "start", cp], env=env, check=True, capture_output=True,
                         text=True).stdout.strip(), file=sys.stderr)
    try:
        record(cp)
    finally:
        subprocess.run(["bash", script, "stop", cp])


def record(cp):
    base = open(os.path.join(cp, "url")).read().strip()
    token = open(os.path.join(cp, "admin.token")).read().strip()
    ctx = ssl.create_default_context(cafile=os.path.join(cp, "pki/ca.crt"))
    pods = json.loads(subprocess.run(["python3", os.path.join(ROOT, "scripts/bench_pods.py"), "--count", "500",
                                      "--no-managed-fields", "--app", APP], check=True,
                                     capture_output=True).stdout)["items"]
    call(base, token, ctx, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": NS}})
    for p in pods:
        status = p.pop("status", None)
        meta = p["metadata"]
        for k in ("uid", "resourceVersion", "creationTimestamp", "ownerReferences"):
            meta.pop(k, None)
        meta["namespace"] = NS
        p.update(apiVersion="v1", kind="Pod")
        _, created = call(base, token, ctx, "POST", f"/api/v1/namespaces/{NS}/pods", p)
        if status:
            obj = json.loads(created)
            obj["status"] = status
            call(base, token, ctx, "PUT", f"/api/v1/namespaces/{NS}/pods/{meta['name']}/status", obj)
    sel = urllib.parse.quote(f"spark-app-selector={APP},spark-role=executor")
    path = f"/api/v1/namespaces/{NS}/pods?labelSelector={sel}&limit=500"
    for accept, name in (("application/json", "json"), ("application/vnd.kubernetes.protobuf", "pb")):
        ctype, body = call(base, token, ctx, "GET", path, accept=accept)
        assert ctype.startswith(accept), ctype
        out = os.path.join(ROOT, "fixtures/bench", f"pods-500.{name}.gz")
        with gzip.GzipFile(out, "wb", mtime=0) as f:
            f.write(body)
        print(f"{out}: {len(body)} bytes ({ctype})", file=sys.stderr)


if __name__ == "__main__":
    main()
