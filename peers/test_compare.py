#!/usr/bin/env python3
"""Unit tests of peers/compare.py's reading of request logs and its comparison (no Java,
no simulator): python3 -m unittest peers/test_compare.py"""

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
    SC = {"batch_delay_ms": 1000}

    def test_same_decisions_no_difference(self):
        spark = [(200, "create", [1], 201), (220, "create", [2], 201), (1300, "create", [3], 201)]
        pa = [(5, "create", [1], 201), (5, "create", [2], 201), (1010, "create", [3], 201)]
        self.assertEqual(compare.compare(self.SC, spark, pa), {})

    def test_ids_batches_order_and_delete_shape(self):
        spark = [(0, "create", [1], 201), (20, "create", [2], 201), (1500, "create", [3], 201),
                 (2000, "delete", [1], 200, "by name")]
        pa = [(0, "create", [1], 201), (1000, "create", [2], 201), (1000, "delete", [1], 200, "by name"),
              (1001, "create", [3], 201)]
        d = compare.compare(self.SC, spark, pa)
        self.assertIn("create-batches", d)
        self.assertIn("order", d)
        self.assertNotIn("creates", d)
        pa2 = [(0, "create", [1], 201), (0, "create", [2], 201), (1000, "create", [4], 201)]
        self.assertIn("creates", compare.compare(self.SC, spark[:3], pa2))
        coll = [(0, "delete", [1, 2], 200, "collection status.phase=Pending")]
        named = [(0, "delete", [1], 200, "by name"), (1, "delete", [2], 200, "by name")]
        self.assertEqual(list(compare.compare(self.SC, coll, named)), ["delete-requests"])

    def test_a_delete_sent_again_is_the_same_decision(self):
        spark = [(0, "create", [2], 201), (4000, "delete", [2], 200, "by name"),
                 (5000, "delete", [2], 200, "by name")]
        pa = [(0, "create", [2], 201), (3000, "delete", [2], 200, "by name")]
        self.assertEqual(compare.compare(self.SC, spark, pa), {})
        # A delete of another id is still a difference.
        spark[2] = (5000, "delete", [3], 200, "by name")
        self.assertIn("deletes", compare.compare(self.SC, spark, pa))

    def test_batches_split_on_half_a_batch_delay(self):
        ds = [(0, "create", [1]), (300, "create", [2]), (900, "create", [3]), (950, "delete", [1])]
        self.assertEqual(compare.batches(ds, "create", 1000), [[1, 2], [3]])

    def test_lag(self):
        self.assertEqual(compare.lag_ms([(1500, "create", [1])], [(200, "create", [1])]), 1300)


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
        self.assertEqual(list(d), ["profiles"])
        self.assertIn("2: 1 / 0", d["profiles"])
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

    def test_startup_latency_of_a_scenario(self):
        import real
        self.assertEqual(real.startup_ms(["--startup-latency", "3s"]), 3000)
        self.assertEqual(real.startup_ms(["--seed", "1", "--startup-latency", "500ms"]), 500)
        self.assertEqual(real.startup_ms([]), 1000)
        with self.assertRaises(ValueError):
            real.startup_ms(["--startup-latency", "soon"])


if __name__ == "__main__":
    unittest.main()
