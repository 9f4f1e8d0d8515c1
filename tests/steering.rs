//! The steering commands (`add`, `scale`, `remove`) as people type them beside a running
//! loop, on both servers: what they need and what they say.

use crate::both::{both, Env, Pods};
use crate::util::exits;
use serde_json::json;
use std::process::{Child, Stdio};

/// A background `run`, stopped (SIGTERM, then reaped) when dropped, whatever the test did.
struct Loop(Child);

impl Drop for Loop {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

both!(
    configmap_steering_needs_no_image_when_a_loop_applies_it,
    "cm-noimg",
    Pods::default(),
    |e| {
        let store = ["--state-store", "configmap:podalloc-cm-noimg"];
        let run = (e.cmd(&[&store[..], &["run", "--target", "1", "--interval", "200ms"]].concat()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let run = Loop(run);
        e.wait_for("1 executor", |e| e.live().len() == 1);
        // Handed to the loop: no template needed (they demanded --image or --template).
        for args in [&["add", "1"][..], &["scale", "3"]] {
            let err = exits(&mut e.cmd_no_image(&[&store[..], args].concat()), 0);
            assert!(err.contains("handed to"), "{args:?}: {err}");
        }
        e.wait_for("3 executors", |e| e.live().len() == 3);
        // Another home than the loop's: refused, naming the flag that would do (the
        // message stopped at "give the controller's").
        let other = ["--state-store", "configmap:other", "scale", "4"];
        let err = exits(&mut e.cmd_no_image(&other), 2);
        assert!(
            err.contains("never reads: nothing done")
                && err.contains("(--state-store configmap:podalloc-cm-noimg)"),
            "{err}"
        );
        drop(run);
        // No loop: the command would tick itself, and that needs a template; it says so
        // and queues nothing (it left its request queued, so the retry below applied it
        // twice: 3 → 5 for one `add 1`).
        let err = exits(
            &mut e.cmd_no_image(&[&store[..], &["add", "1"]].concat()),
            2,
        );
        assert!(
            err.contains("--image")
                && err.contains("no loop owns the app")
                && err.contains("nothing was queued"),
            "{err}"
        );
        // The same command again with a template applies it once.
        let err = e.ok(&[&store[..], &["add", "1"]].concat());
        assert!(err.contains("target 3 → 4"), "{err}");
        let err = e.ok(&[
            &store[..],
            &["run", "--until-converged", "--timeout", "30s"],
        ]
        .concat());
        assert!(!err.contains("target 4 → 5"), "{err}");
        assert_eq!(e.live().len(), 4);
    }
);

both!(
    steering_an_executorset_past_its_bounds_says_what_is_followed,
    "es-bounds",
    Pods::default(),
    |e| {
        let path = format!(
            "/apis/podalloc.io/v1alpha1/namespaces/{}/executorsets",
            e.ns
        );
        let es = json!({"apiVersion": "podalloc.io/v1alpha1", "kind": "ExecutorSet",
            "metadata": {"name": "es-bounds", "labels": {"spark-app-selector": "es-bounds"}},
            "spec": {"appId": "es-bounds", "replicas": 10, "maxReplicas": 3}});
        let (code, made) = e.admin("POST", &path, Some(&es));
        assert_eq!(code, 201, "{made}");
        let replicas =
            || e.admin("GET", &format!("{path}/es-bounds"), None).1["spec"]["replicas"].clone();
        // `add` raises the target followed (3), as `remove` lowers it: 4, not 11.
        let err = e.ok(&["add", "1"]);
        assert_eq!(replicas(), 4);
        // No loop runs on it: the command says so (it said "its controller follows it").
        assert!(err.contains("no loop holds it now"), "{err}");
        assert!(
            err.contains("spec.replicas is 4")
                && err.contains("spec.maxReplicas 3")
                && err.contains("follows 3"),
            "{err}"
        );
        let err = e.ok(&["scale", "8"]);
        assert_eq!(replicas(), 8);
        assert!(err.contains("follows 3"), "{err}");
        // Within the bounds: no word about them.
        let err = e.ok(&["scale", "2"]);
        assert!(!err.contains("maxReplicas"), "{err}");
    }
);
