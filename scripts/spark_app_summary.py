#!/usr/bin/env python3
"""The verdict of scripts/spark-app.sh: reads OUT/driver.log, OUT/executors/*.log and
OUT/audit.log (kube-apiserver's audit log, Metadata level, every request in the app's
namespace; pod creates at Request level, so with the pod's labels), writes OUT/summary.json and
exits 1 unless every check holds:

- answer: the driver printed `podalloc-spark-app: result=X expected=X` with X equal;
- podalloc_created_all (allocator podalloc only): every executor pod create that succeeded was
  made by user `podalloc`, at least one was, and none by the driver's user `spark-driver`;
- executors_ran_tasks >= 2: executor processes whose log shows a task run;
- released_in_gap >= 1: executor processes that ended between the end of phase one and the
  start of phase two (the driver's `event=` lines; the process kubelet's log, OUT/kubelet.log:
  an executor released by dynamic allocation exits 0 and its pod is then deleted, one by one or
  in a deletecollection whose audit event names no pod);
- phase2_creates >= 1: executor pods created after phase two started;
- kills_ended: the driver killed executors (dynamic allocation's idle timeout: `Executors
  1,2 removed due to idle timeout.` in driver.log), and each one's process ended within
  60 s of that request (Spark's scheduler backend kills them, with allocator `direct` by
  deleting their pods, with podalloc's plugin by handing them to podalloc as a removal);
- killed_not_replaced: no executor pod was created after a kill and before the driver next
  asked for executors (`Requesting N new executor(s)`): a killed executor is not replaced;
- with --profiles 0,1 (the job's second resource profile; allocator podalloc only):
  profiles_created_by_podalloc: user `podalloc` created executor pods labelled
  `spark-exec-resourceprofile-id` with each of those profiles, and every created executor pod
  carries one of them.

Besides the checks, summary.json has what scripts/spark-app.sh's comparison with Spark's own
allocator needs: the driver's wall time, the time from the driver's start to the first
executor pod create, executor-seconds (each executor process's start to its end, from the
process kubelet's log), the API requests by user, verb and resource, the CPU seconds of
kube-apiserver, etcd and podalloc (OUT/cpu.json), and each kill: when the driver asked, when
the pod was deleted and by whom, when the process ended.
"""

import argparse
import collections
import datetime
import json
import re
import statistics
import sys
from pathlib import Path

DRIVER_USER = "spark-driver"
PODALLOC_USER = "podalloc"
# The process kubelet's user: it ends a graceful delete with a delete of its own.
KUBELET_USER = "admin"
PROFILE_LABEL = "spark-exec-resourceprofile-id"
# How soon an executor the driver kills must be gone: Spark's own allocator deletes a killed
# executor's pod after spark.kubernetes.dynamicAllocation.deleteGracePeriod (5 s) at the
# latest; both allocators are given ten times that.
KILL_ENDS_MS = 60_000


def parse_time(text):
    """An audit timestamp (RFC 3339, microseconds, Z) as epoch milliseconds."""
    t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(t.timestamp() * 1000)


def read_audit(path):
    """The audit events of the namespace (ResponseComplete), oldest first."""
    events = []
    for line in Path(path).read_text().splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ev.get("stage") == "ResponseComplete":
            events.append(ev)
    events.sort(key=lambda e: e["requestReceivedTimestamp"])
    return events


def is_executor_pod(ev):
    """A request on an executor pod itself (no subresource): the pods are named *-exec-N."""
    ref = ev.get("objectRef", {})
    return (ref.get("resource") == "pods" and not ref.get("subresource")
            and "-exec-" in ref.get("name", ""))


def profile_of(ev):
    """The `spark-exec-resourceprofile-id` label of a pod create's request object (None at
    Metadata level, or without the label)."""
    labels = (ev.get("requestObject") or {}).get("metadata", {}).get("labels") or {}
    return labels.get(PROFILE_LABEL)


def ok(ev):
    return 200 <= ev.get("responseStatus", {}).get("code", 0) < 300


def driver_facts(text):
    """The result line and the phase events (name -> epoch ms) of driver.log."""
    m = re.search(r"podalloc-spark-app: result=(\S+) expected=(\S+)", text)
    events = {n: int(t) for n, t in re.findall(r"podalloc-spark-app: event=(\S+) at=(\d+)", text)}
    return (m.group(1), m.group(2)) if m else (None, None), events


def driver_requests(text, started_ms):
    """The dynamic allocation manager's decisions in driver.log, oldest first: (epoch ms,
    "kill", [executor ids]) for `Executors 1,2 removed due to idle timeout.` (logged once its
    kill request has returned) and (epoch ms, "add", []) for `Requesting N new executor(s)`. The log's times are HH:mm:ss.SSS of the driver's
    day (the machine's time zone, as the driver's log4j writes them); `started_ms` (the
    driver's start, epoch ms) gives the day."""
    start = datetime.datetime.fromtimestamp(started_ms / 1000)
    found = []
    for line in text.splitlines():
        m = re.match(r"(\d\d):(\d\d):(\d\d)\.(\d\d\d) INFO ExecutorAllocationManager: "
                     r"(Executors ([\d,]+) removed due to idle timeout|Requesting \d+ new executor)",
                     line)
        if not m:
            continue
        h, mi, se, ms = (int(g) for g in m.groups()[:4])
        at = start.replace(hour=h, minute=mi, second=se, microsecond=ms * 1000)
        if at < start - datetime.timedelta(hours=12):
            at += datetime.timedelta(days=1)  # the run passed midnight
        ids = [i.strip() for i in (m.group(6) or "").split(",") if i.strip()]
        found.append((int(at.timestamp() * 1000), "kill" if m.group(6) else "add", ids))
    return found


def kills_compared(requests, creates, deletes, collection_deletes, lives):
    """What became of each executor the driver asked to kill: its pod (named by the label
    `spark-exec-id` of its create's request object), when the request was made, when the pod
    was deleted and by whom (a delete by name, else the first deletecollection of pods after
    the request, which names no pod), when its
    process ended (the process kubelet's log), and the executor pod creates that came after
    a kill and before the driver next asked for executors (a killed executor replaced)."""
    pod_of = {}
    for e in creates:
        labels = (e.get("requestObject") or {}).get("metadata", {}).get("labels") or {}
        if "spark-exec-id" in labels:
            pod_of[labels["spark-exec-id"]] = e["objectRef"]["name"]
    # The first delete of each pod by name, the process kubelet's (user admin: the last step
    # of a graceful delete) aside, and the deletecollections, which name no pod.
    deleted = {}
    for e in deletes:
        if e["user"]["username"] != KUBELET_USER:
            deleted.setdefault(e["objectRef"]["name"],
                               (parse_time(e["requestReceivedTimestamp"]), e["user"]["username"]))
    collections_ = [(parse_time(e["requestReceivedTimestamp"]), e["user"]["username"])
                    for e in collection_deletes if e["user"]["username"] != KUBELET_USER]
    kills = []
    for at, what, ids in requests:
        if what != "kill":
            continue
        for i in ids:
            pod = pod_of.get(i)
            gone = deleted.get(pod)
            if gone is None:
                # Deleted in a deletecollection: the first one after the request.
                gone = next(((t, f"{who} (deletecollection)") for t, who in collections_
                             if t >= at), None)
            life = lives.get(pod)
            kills.append({
                "executor": i, "pod": pod, "requested_ms": at,
                "pod_deleted_after_ms": gone[0] - at if gone else None,
                "deleted_by": gone[1] if gone else None,
                "process_ended_after_ms": (life[1] - at) if life else None,
            })
    replaced = []
    for n, (at, what, _) in enumerate(requests):
        if what != "kill":
            continue
        until = next((t for t, w, _ in requests[n + 1:] if w == "add"), None)
        replaced += sorted(e["objectRef"]["name"] for e in creates
                           if at < parse_time(e["requestReceivedTimestamp"])
                           and (until is None or parse_time(e["requestReceivedTimestamp"]) < until))
    return kills, sorted(set(replaced))


def process_lives(kubelet_log, end_ms):
    """Executor pod name -> (started, ended) epoch ms of its process, from the process
    kubelet's `MS INFO process kubelet: NAME started|exited ...` lines (ended: end_ms while
    no exit was logged)."""
    lives = {}
    for line in kubelet_log.splitlines():
        m = re.match(r"(\d+) INFO process kubelet: (\S+) (started|exited)", line)
        if not m:
            continue
        at, name, what = int(m.group(1)), m.group(2), m.group(3)
        if what == "started":
            lives[name] = [at, None]
        elif name in lives and lives[name][1] is None:
            lives[name][1] = at
    return {n: (s, e if e is not None else end_ms) for n, (s, e) in lives.items()}


def summarize(out, args):
    driver_log = (out / "driver.log").read_text(errors="replace")
    (result, expected), events = driver_facts(driver_log)
    audit = read_audit(out / "audit.log")
    creates = [e for e in audit if is_executor_pod(e) and e["verb"] == "create" and ok(e)]
    creates_by_user = collections.Counter(e["user"]["username"] for e in creates)
    creates_by_profile = collections.defaultdict(collections.Counter)
    for e in creates:
        creates_by_profile[str(profile_of(e))][e["user"]["username"]] += 1
    deletes = [e for e in audit if is_executor_pod(e) and e["verb"] == "delete" and ok(e)]
    deletes_by_user = collections.Counter(e["user"]["username"] for e in deletes)
    ran = sorted(p.stem for p in (out / "executors").glob("*.log")
                 if "Running task" in p.read_text(errors="replace"))
    lives = process_lives((out / "kubelet.log").read_text(errors="replace"), args.driver_ended)
    gap = (events.get("phase1-end"), events.get("phase2-start"))
    in_gap = sorted(n for n, (_, end) in lives.items()
                    if None not in gap and gap[0] <= end <= gap[1])
    phase2 = sorted({e["objectRef"]["name"] for e in creates
                     if "phase2-start" in events
                     and parse_time(e["requestReceivedTimestamp"]) >= events["phase2-start"]})
    first_create = min((parse_time(e["requestReceivedTimestamp"]) for e in creates), default=None)
    requests = collections.Counter()
    for e in audit:
        ref = e.get("objectRef", {})
        resource = ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")
        requests[f'{e["user"]["username"]} {e["verb"]} {resource}'] += 1
    collection_deletes = [e for e in audit if e["verb"] == "deletecollection" and ok(e)
                          and e.get("objectRef", {}).get("resource") == "pods"]
    kills, replaced = kills_compared(driver_requests(driver_log, args.driver_started),
                                     creates, deletes, collection_deletes, lives)
    ended = [k["process_ended_after_ms"] for k in kills if k["process_ended_after_ms"] is not None]
    cpu_file = out / "cpu.json"
    cpu = json.loads(cpu_file.read_text()) if cpu_file.exists() else {}
    podalloc_mode = args.allocator == "podalloc"
    checks = {
        "answer": result is not None and result == expected,
        "executors_ran_tasks": len(ran) >= 2,
        "released_in_gap": len(in_gap) >= 1,
        "phase2_creates": len(phase2) >= 1,
        "kills_ended": bool(kills) and all(
            k["process_ended_after_ms"] is not None and k["process_ended_after_ms"] <= KILL_ENDS_MS
            for k in kills),
        "killed_not_replaced": not replaced,
    }
    if podalloc_mode:
        checks["podalloc_created_all"] = (
            creates_by_user.get(PODALLOC_USER, 0) >= 1
            and creates_by_user.get(DRIVER_USER, 0) == 0
            and set(creates_by_user) == {PODALLOC_USER})
        if args.profiles:
            wanted = set(args.profiles.split(","))
            checks["profiles_created_by_podalloc"] = (
                all(creates_by_profile.get(p, {}).get(PODALLOC_USER, 0) >= 1 for p in wanted)
                and set(creates_by_profile) <= wanted)
    return {
        "allocator": args.allocator,
        "app_id": args.app_id,
        "driver_status": args.driver_status,
        "result": result,
        "expected": expected,
        "executors_ran_tasks": ran,
        "executor_pod_creates_by_user": dict(creates_by_user),
        "executor_pod_creates_by_profile_user": {p: dict(c) for p, c in sorted(creates_by_profile.items())},
        "executor_pod_deletes_by_user": dict(deletes_by_user),
        "released_in_gap": in_gap,
        "phase2_creates": phase2,
        "phases_ms": {k: v - args.driver_started for k, v in sorted(events.items(), key=lambda kv: kv[1])},
        "driver_wall_s": round((args.driver_ended - args.driver_started) / 1000, 1),
        "first_executor_create_s": (round((first_create - args.driver_started) / 1000, 1)
                                    if first_create else None),
        "executor_process_seconds": round(sum(e - s for s, e in lives.values()) / 1000, 1),
        "requests_by_user_verb_resource": dict(sorted(requests.items())),
        "requests_total": sum(requests.values()),
        "cpu_s": cpu,
        "kills": kills,
        "kill_to_process_end_ms": {"median": statistics.median(ended) if ended else None,
                                   "max": max(ended, default=None)},
        "created_after_a_kill_before_the_next_add": replaced,
        "checks": checks,
        "passed": all(checks.values()),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--allocator", default="podalloc", choices=["podalloc", "direct"])
    ap.add_argument("--app-id", default="")
    ap.add_argument("--driver-status", type=int, default=0)
    ap.add_argument("--profiles", default="",
                    help="comma-separated resource profile ids podalloc must have created pods of")
    ap.add_argument("--driver-started", type=int, required=True, help="epoch ms")
    ap.add_argument("--driver-ended", type=int, required=True, help="epoch ms")
    args = ap.parse_args()
    summary = summarize(args.out, args)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    brief = {k: summary[k] for k in ("result", "executor_pod_creates_by_user",
                                     "executor_pod_creates_by_profile_user", "driver_wall_s",
                                     "first_executor_create_s", "executor_process_seconds",
                                     "requests_total", "cpu_s", "kill_to_process_end_ms",
                                     "checks")}
    brief["kills"] = len(summary["kills"])
    brief["executors_ran_tasks"] = len(summary["executors_ran_tasks"])
    brief["released_in_gap"] = len(summary["released_in_gap"])
    brief["phase2_creates"] = len(summary["phase2_creates"])
    print("spark-app: " + json.dumps(brief))
    failed = [k for k, v in summary["checks"].items() if not v]
    if failed:
        print(f"spark-app: FAILED: {', '.join(failed)} (see {args.out}/summary.json)", file=sys.stderr)
        return 1
    print("spark-app: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
