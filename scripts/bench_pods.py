#!/usr/bin/env python3
"""Realistic Spark executor pods for the podalloc benchmarks (scripts/bench.sh).

A pod as kube-apiserver returns it for a Spark 3.5 executor started by the Spark driver
(or by podalloc from a Spark executor template): the Spark labels, an ownerReference to
the driver, ~30 environment variables (SPARK_JAVA_OPT_n, the driver URL, fieldRef'd pod
IP and name), requests/limits, the spark-local-dir emptyDir, the spark-conf ConfigMap, the
projected service-account token volume, the two default tolerations, the scheduler's and
kubelet's status (five conditions, a running container status) and managedFields for the
three field managers that touch a real executor pod (the driver's fabric8 client, the
scheduler, the kubelet). About 5.5 KB of compact JSON with managedFields; the simulator
drops managedFields on create (they are server-owned), so the pod it serves is about 4.4 KB.

    python3 scripts/bench_pods.py --count 1000 --app spark-bench > podlist.json
    python3 -c 'import bench_pods; print(len(bench_pods.pod_bytes("a", 1)))'

Deterministic: pod n of app a is always the same bytes.
"""

import argparse
import hashlib
import json
import sys

IMAGE = "registry.example.com/data-platform/spark:3.5.1-scala2.12-java17-python3-ubuntu"


def _hex(seed: str, n: int) -> str:
    out = ""
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{i}".encode()).hexdigest()
        i += 1
    return out[:n]


def _uid(seed: str) -> str:
    h = _hex(seed, 32)
    return f"{h[0:8]}-{h[8:12]}-4{h[13:16]}-a{h[17:20]}-{h[20:32]}"


def _ts(sec: int) -> str:
    # 2026-03-02T08:MM:SSZ, minutes/seconds from sec
    return f"2026-03-02T{8 + sec // 3600 % 12:02d}:{sec // 60 % 60:02d}:{sec % 60:02d}Z"


def executor_pod(app: str, n: int, phase: str = "Running", managed_fields: bool = True,
                 driver_uid: str = "") -> dict:
    """Executor `n` (1-based) of application `app`, as the API server would return it.
    `driver_uid`: the driver pod's uid for the ownerReference (default: a made-up one)."""
    name = f"{app}-exec-{n}"
    node = f"ip-10-12-{n // 250 % 256}-{n % 250 + 1}.eu-west-1.compute.internal"
    pod_ip = f"10.40.{n // 250 % 256}.{n % 250 + 1}"
    host_ip = f"10.12.{n // 250 % 256}.{n % 250 + 1}"
    created = _ts(1000 + n)
    started = _ts(1006 + n)
    driver = f"{app}-driver"
    driver_uid = driver_uid or _uid(app + "/driver")
    token_vol = "kube-api-access-" + _hex(name, 5)
    java_opts = [
        "-Djava.net.preferIPv6Addresses=false",
        "-XX:+IgnoreUnrecognizedVMOptions",
        "--add-opens=java.base/java.lang=ALL-UNNAMED",
        "--add-opens=java.base/java.lang.invoke=ALL-UNNAMED",
        "--add-opens=java.base/java.nio=ALL-UNNAMED",
        "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
        "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
        "-Dspark.driver.port=7078",
        "-XX:+UseG1GC",
    ]
    env = [
        {"name": "SPARK_USER", "value": "etl"},
        {"name": "SPARK_DRIVER_URL",
         "value": f"spark://CoarseGrainedScheduler@{driver}-svc.batch.svc:7078"},
        {"name": "SPARK_EXECUTOR_CORES", "value": "4"},
        {"name": "SPARK_EXECUTOR_MEMORY", "value": "14g"},
        {"name": "SPARK_APPLICATION_ID", "value": app},
        {"name": "SPARK_CONF_DIR", "value": "/opt/spark/conf"},
        {"name": "SPARK_EXECUTOR_ID", "value": str(n)},
        {"name": "SPARK_RESOURCE_PROFILE_ID", "value": "0"},
        {"name": "SPARK_EXECUTOR_POD_IP",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
        {"name": "SPARK_EXECUTOR_POD_NAME",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
        {"name": "SPARK_LOCAL_DIRS", "value": "/var/data/spark-" + _uid(name + "/ld")},
        {"name": "AWS_ROLE_ARN", "value": "arn:aws:iam::123456789012:role/spark-etl-executor"},
    ] + [{"name": f"SPARK_JAVA_OPT_{i}", "value": v} for i, v in enumerate(java_opts)]
    conditions = [
        ("PodReadyToStartContainers", started), ("Initialized", created),
        ("Ready", started), ("ContainersReady", started), ("PodScheduled", created),
    ]
    pod = {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": _uid(name),
            "resourceVersion": str(100000 + n),
            "creationTimestamp": created,
            "labels": {
                "spark-app-name": "nightly-etl",
                "spark-app-selector": app,
                "spark-exec-id": str(n),
                "spark-exec-resourceprofile-id": "0",
                "spark-role": "executor",
                "spark-version": "3.5.1",
                "team": "data-platform",
            },
            "annotations": {
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "4040",
            },
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": driver, "uid": driver_uid,
                "controller": True,
            }],
        },
        "spec": {
            "volumes": [
                {"name": "spark-local-dir-1", "emptyDir": {"sizeLimit": "100Gi"}},
                {"name": "spark-conf-volume-exec", "configMap": {
                    "name": f"spark-exec-{_hex(app, 16)}-conf-map", "defaultMode": 420}},
                {"name": token_vol, "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                                   "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                        "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ], "defaultMode": 420}},
            ],
            "containers": [{
                "name": "spark-kubernetes-executor",
                "image": IMAGE,
                "args": ["executor"],
                "ports": [{"name": "spark-ui", "containerPort": 4040, "protocol": "TCP"}],
                "env": env,
                "resources": {
                    "limits": {"cpu": "4", "memory": "16Gi", "ephemeral-storage": "100Gi"},
                    "requests": {"cpu": "4", "memory": "16Gi", "ephemeral-storage": "20Gi"},
                },
                "volumeMounts": [
                    {"name": "spark-local-dir-1", "mountPath": "/var/data/spark-" + _uid(name + "/ld")},
                    {"name": "spark-conf-volume-exec", "mountPath": "/opt/spark/conf"},
                    {"name": token_vol, "readOnly": True,
                     "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"},
                ],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
                "securityContext": {"runAsUser": 185, "runAsNonRoot": True,
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "spark-etl",
            "serviceAccount": "spark-etl",
            "nodeName": node,
            "securityContext": {"fsGroup": 185},
            "hostname": name[:63],
            "schedulerName": "default-scheduler",
            "nodeSelector": {"node.kubernetes.io/instance-type": "r6i.2xlarge"},
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": phase,
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts}
                for t, ts in conditions
            ],
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": created,
            "containerStatuses": [{
                "name": "spark-kubernetes-executor",
                "state": {"running": {"startedAt": started}},
                "lastState": {},
                "ready": True,
                "restartCount": 0,
                "image": IMAGE,
                "imageID": "registry.example.com/data-platform/spark@sha256:" + _hex(IMAGE, 64),
                "containerID": "containerd://" + _hex(name + "/c", 64),
                "started": True,
            }],
            "qosClass": "Guaranteed",
        },
    }
    if managed_fields:
        pod["metadata"]["managedFields"] = [
            {"manager": "fabric8-kubernetes-client", "operation": "Update", "apiVersion": "v1",
             "time": created, "fieldsType": "FieldsV1", "fieldsV1": {
                 "f:metadata": {"f:labels": {".": {}, **{f"f:{k}": {} for k in pod["metadata"]["labels"]}},
                                "f:ownerReferences": {".": {}, f'k:{{"uid":"{driver_uid}"}}': {}}},
                 "f:spec": {"f:containers": {'k:{"name":"spark-kubernetes-executor"}': {
                     ".": {}, "f:args": {}, "f:env": {".": {}, **{
                         f'k:{{"name":"{e["name"]}"}}': {".": {}, "f:name": {}, "f:value": {}}
                         for e in env[:4]}},
                     "f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:resources": {}}},
                     "f:restartPolicy": {}, "f:volumes": {}}}},
            {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": started,
             "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {"f:status": {
                 "f:conditions": {f'k:{{"type":"{t}"}}': {".": {}, "f:lastProbeTime": {},
                                                         "f:lastTransitionTime": {}, "f:status": {},
                                                         "f:type": {}} for t, _ in conditions[:4]},
                 "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {},
                 "f:startTime": {}}}},
        ]
    return pod


def pod_bytes(app: str, n: int, **kw) -> bytes:
    return json.dumps(executor_pod(app, n, **kw), separators=(",", ":")).encode()


def seed_bytes(app: str, n: int, driver_uid: str) -> bytes:
    """The body for the simulator's `POST /sim/pods/{ns}`: the pod without the fields only
    the server sets (the simulator refuses a resourceVersion and drops managedFields)."""
    p = executor_pod(app, n, managed_fields=False, driver_uid=driver_uid)
    for k in ("resourceVersion", "uid", "creationTimestamp"):
        del p["metadata"][k]
    return json.dumps(p, separators=(",", ":")).encode()


def driver_pod(app: str) -> dict:
    """The driver pod the executors' ownerReference points at (label spark-role=driver, so
    the executor label selector leaves it out). Seed it first: the simulator garbage-collects
    pods whose owner does not exist."""
    return {
        "metadata": {"name": f"{app}-driver", "labels": {
            "spark-app-selector": app, "spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": IMAGE,
                                 "args": ["driver"]}],
                 "restartPolicy": "Never", "nodeName": "ip-10-12-0-1.eu-west-1.compute.internal"},
        "status": {"phase": "Running"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--app", default="spark-bench")
    ap.add_argument("--no-managed-fields", action="store_true")
    a = ap.parse_args()
    out = sys.stdout.buffer
    out.write(b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[')
    for n in range(1, a.count + 1):
        if n > 1:
            out.write(b",")
        out.write(pod_bytes(a.app, n, managed_fields=not a.no_managed_fields))
    out.write(b"]}\n")


if __name__ == "__main__":
    main()
