#!/usr/bin/env python3
"""Unit tests of peers/compare.py's reading of request logs and its comparison (no Java,
no simulator): python3 -m unittest peers/test_compare.py"""

import shutil
import unittest

import compare

P = f"/api/v1/namespaces/{compare.NS}/pods"
U = "system:serviceaccount:default:podalloc"


def line(seq, ms, method, path, verb, query=None, name=None, status=200):
    e = {"seq": seq, "ms": ms, "method": method, "path": path, "verb": verb, "user": U, "status": status}
    if query:
        e["query"] = query
    if name:
        e["name"] = name
    return e


class Decisions(unittest.TestCase):
    def test_creates_deletes_and_collections(self):
        log = [
            line(1, 100, "GET", f"{P}/peer-app-driver", "get", {"peerFault": "1", "t0": "1"}),
            line(2, 110, "POST", P, "create", name="peer-app-exec-1", status=201),
            line(3, 120, "GET", P, "list"),
            line(4, 130, "DELETE", P, "deletecollection",
                 {"labelSelector": "spark-app-selector=peer-app,spark-role=executor,spark-exec-id in (4,3)",
                  "fieldSelector": "status.phase=Pending"}),
            line(5, 140, "DELETE", f"{P}/peer-app-exec-2", "delete"),
            line(6, 150, "DELETE", f"{P}/peer-app-exec-3", "delete", {"peerFault": "1"}),
            line(7, 160, "DELETE", f"{P}/peer-app-driver", "delete"),
        ]
        t0 = compare.t0_of(log)
        ds = compare.decisions(log, t0)
        self.assertEqual(ds, [
            (10, "create", [1], 201),
            (30, "delete", [3, 4], 200, "collection status.phase=Pending"),
            (40, "delete", [2], 200, "by name"),
        ], "the script's own requests (peerFault) and the driver are not decisions")


class Compare(unittest.TestCase):
    SC = {"batch_delay_ms": 1000, "poll_ms": 1000}

    def test_same_decisions_no_difference(self):
        spark = [(200, "create", [1], 201), (220, "create", [2], 201), (1300, "create", [3], 201)]
        pa = [(5, "create", [1], 201), (5, "create", [2], 201), (1010, "create", [3], 201)]
        self.assertEqual(compare.compare(self.SC, spark, pa), {})

    def test_each_difference_names_its_decision(self):
        spark = [(0, "create", [1], 201), (20, "create", [2], 201), (1500, "create", [3], 201),
                 (2000, "delete", [1], 200, "by name")]
        pa = [(0, "create", [1], 201), (1000, "create", [2], 201), (1000, "delete", [1], 200, "by name"),
              (1001, "create", [3], 201)]
        d = compare.compare(self.SC, spark, pa)
        self.assertEqual(sorted(d), ["create 1: tick", "create 2: tick", "create 3: tick", "delete 1: order"])
        pa2 = [(0, "create", [1], 201), (0, "create", [2], 201), (1000, "create", [4], 201)]
        self.assertEqual(sorted(compare.compare(self.SC, spark[:3], pa2)),
                         ["create 3: spark only", "create 4: podalloc only"])
        coll = [(0, "delete", [1, 2], 200, "collection status.phase=Pending")]
        named = [(0, "delete", [1], 200, "by name"), (1, "delete", [2], 200, "by name")]
        self.assertEqual(sorted(compare.compare(self.SC, coll, named)), ["delete 1: request", "delete 2: request"])
        swapped = [(0, "create", [2], 201), (1, "create", [1], 201)]
        self.assertEqual(sorted(compare.compare(self.SC, swapped, pa2[:2])), ["create 1: order", "create 2: order"])

    def test_a_delete_sent_again_is_the_same_decision(self):
        spark = [(0, "create", [2], 201), (4000, "delete", [2], 200, "by name"),
                 (5000, "delete", [2], 200, "by name")]
        pa = [(0, "create", [2], 201), (3000, "delete", [2], 200, "by name")]
        self.assertEqual(compare.compare(self.SC, spark, pa), {})
        # A delete of another id is still a difference.
        spark[2] = (5000, "delete", [3], 200, "by name")
        self.assertIn("delete 3: spark only", compare.compare(self.SC, spark, pa))

    def test_timing_within_a_batch_delay_and_a_poll_of_the_decision_before(self):
        self.assertEqual(compare.tolerance_ms(self.SC), 2000)
        self.assertEqual(compare.tolerance_ms({"batch_delay_ms": 500}), 1000)
        self.assertEqual(compare.tolerance_ms({"defaults": True}), 31000)
        # Spark falls behind step by step (each batch waits for the last to be seen): 1.9 s
        # more each time is within the tolerance; 2.1 s more is not.
        spark = [(300, "create", [1], 201), (3200, "create", [2], 201), (6100, "create", [3], 201)]
        pa = [(10, "create", [1], 201), (1010, "create", [2], 201), (2010, "create", [3], 201)]
        self.assertEqual(compare.compare(self.SC, spark, pa), {})
        spark[2] = (6300, "create", [3], 201)
        d = compare.compare(self.SC, spark, pa)
        self.assertEqual(list(d), ["create 3: time"])
        self.assertIn("4290 ms after podalloc", d["create 3: time"])
        # Spark ahead by more than the tolerance is a difference too.
        self.assertEqual(list(compare.compare(self.SC, [(0, "create", [1], 201)], [(2500, "create", [1], 201)])),
                         ["create 1: time"])
        self.assertEqual(compare.timing_summary(self.SC, spark[:2], pa[:2]), (2, 2190, 1900, 2000))

    def test_end_state(self):
        spark = [(0, "create", [1], 201)]
        d = compare.compare(self.SC, spark, spark, ends=({1: "Running"}, {1: "Pending"}))
        self.assertEqual(d, {}, "a phase is not compared, only which executors are left")
        d = compare.compare(self.SC, spark, spark, ends=({1: "Running", 2: "Pending"}, {1: "Running"}))
        self.assertEqual(list(d), ["end 2: spark only"])

    def test_batches_split_on_half_a_batch_delay(self):
        ds = [(0, "create", [1]), (300, "create", [2]), (900, "create", [3]), (950, "delete", [1])]
        self.assertEqual(compare.batches(ds, "create", 1000), [[1, 2], [3]])

    def test_lag(self):
        self.assertEqual(compare.lag_ms([(1500, "create", [1])], [(200, "create", [1])]), 1300)


class Defaults(unittest.TestCase):
    def test_a_scenario_at_the_allocators_defaults(self):
        sc = {"name": "s01", "policy": "spark-3.x", "batch_size": 5, "batch_delay_ms": 1000, "poll_ms": 1000,
              "executor_idle_timeout_ms": 10000, "max_pending": 3, "sim": ["--startup-latency", "3s"],
              "events": [{"at_ms": 0, "target": 6}], "explained": {"delete 1: request": "D2"},
              "explained_defaults": {"create 6: time": "D17"}}
        d = compare.at_defaults(sc)
        self.assertEqual(d["name"], "s01@defaults")
        self.assertTrue(d["defaults"])
        for k in compare.TUNABLES:
            self.assertNotIn(k, d)
        self.assertEqual(d["events"], sc["events"])
        self.assertEqual(sorted(compare.explanations(d)), ["create 6: time", "delete 1: request"])
        self.assertEqual(sorted(compare.explanations(sc)), ["delete 1: request"])

        class A:
            podalloc = "podalloc"
        class S:
            kubeconfig, ns = "kc", "default"
        import pathlib
        cmd = compare.podalloc_cmd(A, d, S, pathlib.Path("/nonexistent"), 6)
        for flag in ("--batch-size", "--batch-delay", "--idle-interval", "--executor-idle-timeout", "--max-pending",
                     "--creation-timeout"):
            self.assertNotIn(flag, cmd)
        self.assertEqual(cmd[cmd.index("--policy") + 1], "spark-3.x")
        sd = compare.state_dir(pathlib.Path("/nonexistent"))
        if sd != pathlib.Path("/nonexistent"):
            sd.rmdir()


class Profiles(unittest.TestCase):
    """Scenarios with several resource profiles ("profiles", target events with "profile")."""

    SC = {"name": "m", "batch_delay_ms": 1000, "profiles": {"1": {"cores": 2}},
          "events": [{"at_ms": 0, "target": 3}, {"at_ms": 0, "profile": 1, "target": 4},
                     {"at_ms": 0, "hold": [6]}, {"at_ms": 3000, "target": 5},
                     {"at_ms": 6000, "profile": 1, "target": 2}]}

    def test_target_changes_carry_every_profile(self):
        self.assertEqual(compare.target_changes(self.SC),
                         [(0, {0: 3, 1: 4}), (3000, {0: 5, 1: 4}), (6000, {0: 5, 1: 2})])
        late = {"profiles": {"1": {}}, "events": [{"at_ms": 2000, "profile": 1, "target": 2}]}
        self.assertEqual(compare.target_changes(late), [(0, {0: 0}), (2000, {0: 0, 1: 2})])
        with self.assertRaises(ValueError):
            compare.target_changes({"events": [{"at_ms": 0, "profile": 2, "target": 1}]})

    def test_podalloc_gets_profile_targets(self):
        class A:
            podalloc = "podalloc"
        class S:
            kubeconfig, ns = "kc", "default"
        import pathlib
        cmd = compare.podalloc_cmd(A, self.SC, S, pathlib.Path("/nonexistent"), {0: 5, 1: 2})
        run = cmd[cmd.index("run"):]
        self.assertEqual(run[:4], ["run", "--target", "5", "--force-target"])
        self.assertEqual(run[run.index("--profile-target") + 1], "1=2")
        single = compare.podalloc_cmd(A, {}, S, pathlib.Path("/nonexistent"), 4)
        self.assertNotIn("--profile-target", single)
        self.assertEqual(single[single.index("--target") + 1], "4")
        sd = compare.state_dir(pathlib.Path("/nonexistent"))
        if sd != pathlib.Path("/nonexistent"):
            sd.rmdir()

    def test_an_executor_of_another_profile_is_a_difference(self):
        spark = [(300, "create", [1], 201), (320, "create", [2], 201)]
        pa = [(5, "create", [1], 201), (6, "create", [2], 201)]
        self.assertEqual(compare.compare(self.SC, spark, pa, ({1: 0, 2: 1}, {1: 0, 2: 1})), {})
        d = compare.compare(self.SC, spark, pa, ({1: 0, 2: 1}, {1: 0, 2: 0}))
        self.assertEqual(list(d), ["create 2: profile"])
        self.assertIn("profile 1 / podalloc's 0", d["create 2: profile"])
        self.assertEqual(compare.fmt(spark, {1: 0, 2: 1}), "c1@300 c2/1@320")


class RealAudit(unittest.TestCase):
    """The real control plane's audit log read as the simulator's request log (peers/real.py)."""

    def event(self, verb, uri, user, name=None, code=200, at="2026-12-02T00:48:30.156933Z"):
        ref = {"resource": "pods", "namespace": "ns-a", "apiVersion": "v1"}
        if name:
            ref["name"] = name
        return {"stage": "ResponseComplete", "requestURI": uri, "verb": verb, "user": {"username": user},
                "objectRef": ref, "responseStatus": {"code": code}, "requestReceivedTimestamp": at}

    def test_decisions_from_the_audit_log(self):
        import json
        import tempfile
        import threading
        from pathlib import Path
        import real
        P = "/api/v1/namespaces/ns-a/pods"
        events = [
            self.event("get", f"{P}/peer-app-driver?peerFault=1&t0=1", "admin", "peer-app-driver",
                       at="2026-12-02T00:48:30.000000Z"),
            self.event("create", P, "podalloc", "peer-app-exec-1", 201, at="2026-12-02T00:48:30.250000Z"),
            self.event("delete", f"{P}/peer-app-exec-1?peerFault=1", "admin", "peer-app-exec-1"),
            self.event("deletecollection", f"{P}?fieldSelector=status.phase%3DPending&labelSelector="
                       "spark-app-selector%3Dpeer-app%2Cspark-role%3Dexecutor%2Cspark-exec-id%20in%20%281%2C2%29",
                       "podalloc", at="2026-12-02T00:48:31.000000Z"),
        ]
        other = dict(self.event("create", "/api/v1/namespaces/ns-b/pods", "podalloc", "peer-app-exec-9", 201))
        other["objectRef"] = dict(other["objectRef"], namespace="ns-b")
        d = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, d, True)
        (d / "audit.log").write_text("".join(json.dumps(e) + "\n" for e in events + [other]) + '{"partial')
        cp = object.__new__(real.ControlPlane)
        cp.audit_path, cp._audit_pos, cp._audit, cp._lock = d / "audit.log", 0, [], threading.Lock()
        log = cp.log("ns-a")
        self.assertEqual(len(log), 4)
        got = compare.decisions(log, compare.t0_of(log), "ns-a")
        self.assertEqual([(round(x[0]), *x[1:]) for x in got], [
            (250, "create", [1], 201),
            (1000, "delete", [1, 2], 200, "collection status.phase=Pending"),
        ])

    def test_profiles_from_the_labels_each_create_sent(self):
        import json
        import tempfile
        import threading
        from pathlib import Path
        import real
        self.assertIn("level: Request\n  users: [\"podalloc\"]\n  verbs: [\"create\"]", real.AUDIT_POLICY,
                      "the allocators' pod creates are logged with the pod sent")
        P = "/api/v1/namespaces/ns-a/pods"
        def create(name, labels, code=201, user="podalloc"):
            e = self.event("create", P, user, name, code)
            e["level"] = "Request"
            e["requestObject"] = {"kind": "Pod", "metadata": {"name": name, "labels": labels}}
            return e
        sel = {"spark-app-selector": "peer-app", "spark-role": "executor"}
        events = [
            self.event("get", f"{P}/peer-app-driver?peerFault=1&t0=1", "admin", "peer-app-driver"),
            create("peer-app-exec-1", dict(sel, **{"spark-exec-id": "1", "spark-exec-resourceprofile-id": "0"})),
            create("peer-app-exec-2", dict(sel, **{"spark-exec-id": "2", "spark-exec-resourceprofile-id": "1"})),
            # No label: profile 0's (as podalloc and Spark count such a pod).
            create("peer-app-exec-3", dict(sel, **{"spark-exec-id": "3"})),
            # A create refused (409) made no pod; the admin's (the driver, a fault) is no decision.
            create("peer-app-exec-4", dict(sel, **{"spark-exec-resourceprofile-id": "1"}), code=409),
            create("peer-app-exec-5", dict(sel, **{"spark-exec-resourceprofile-id": "2"}), user="admin"),
        ]
        d = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, d, True)
        (d / "audit.log").write_text("".join(json.dumps(e) + "\n" for e in events))
        cp = object.__new__(real.ControlPlane)
        cp.audit_path, cp._audit_pos, cp._audit, cp._lock = d / "audit.log", 0, [], threading.Lock()
        log = cp.log("ns-a")
        self.assertEqual(compare.created_profiles(log), {1: 0, 2: 1, 3: 0})
        # A create logged at level Metadata (no labels) is an error, never profile 0.
        bare = [dict(e) for e in log]
        del bare[1]["labels"]
        with self.assertRaises(RuntimeError):
            compare.created_profiles(bare)

    def test_startup_latency_of_a_scenario(self):
        import real
        self.assertEqual(real.startup_ms(["--startup-latency", "3s"]), 3000)
        self.assertEqual(real.startup_ms(["--seed", "1", "--startup-latency", "500ms"]), 500)
        self.assertEqual(real.startup_ms([]), 1000)
        with self.assertRaises(ValueError):
            real.startup_ms(["--startup-latency", "soon"])


if __name__ == "__main__":
    unittest.main()
