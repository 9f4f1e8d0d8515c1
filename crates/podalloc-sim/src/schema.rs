//! The field names of a core/v1 Pod, for server-side field validation (`fieldValidation`
//! on a create, KEP-2885, GA in Kubernetes 1.25): the apiserver's strict JSON decoder
//! reports each field the Go types do not have as `unknown field "spec.containers[0].x"`,
//! joined with `, `.
//!
//! - `Strict`: the create fails with 400 BadRequest, `Pod in version "v1" cannot be handled
//!   as a Pod: strict decoding error: unknown field "…"`;
//! - `Warn` (the default when the parameter is absent): the pod is created and each unknown
//!   field comes back as a `Warning: 299 - "unknown field \"…\""` response header;
//! - `Ignore`: unknown fields are dropped silently.
//!
//! The schema below follows the core/v1 types (`ObjectMeta`, `PodSpec`, `Container`,
//! `ResourceRequirements`, …) to the depth an executor template uses; a few deep subtrees
//! (volume sources, probes, affinity, security contexts, status) are taken as they come and
//! not checked field by field.

/// The shape of a JSON value.
#[derive(Debug)]
pub(crate) enum Shape {
    /// A string, number or boolean (or anything: not checked further).
    Leaf,
    /// An object with these fields.
    Object(&'static [(&'static str, Shape)]),
    /// An array of this shape.
    List(&'static Shape),
    /// A map from any key to this shape.
    Map(&'static Shape),
}

use Shape::{Leaf, List, Map, Object};

const STRINGS: Shape = List(&Leaf);

const OWNER_REF: Shape = Object(&[
    ("apiVersion", Leaf),
    ("kind", Leaf),
    ("name", Leaf),
    ("uid", Leaf),
    ("controller", Leaf),
    ("blockOwnerDeletion", Leaf),
]);

const META: Shape = Object(&[
    ("name", Leaf),
    ("generateName", Leaf),
    ("namespace", Leaf),
    ("selfLink", Leaf),
    ("uid", Leaf),
    ("resourceVersion", Leaf),
    ("generation", Leaf),
    ("creationTimestamp", Leaf),
    ("deletionTimestamp", Leaf),
    ("deletionGracePeriodSeconds", Leaf),
    ("labels", Map(&Leaf)),
    ("annotations", Map(&Leaf)),
    ("ownerReferences", List(&OWNER_REF)),
    ("finalizers", STRINGS),
    ("managedFields", List(&Leaf)),
]);

const RESOURCES: Shape = Object(&[
    ("limits", Map(&Leaf)),
    ("requests", Map(&Leaf)),
    ("claims", List(&Leaf)),
]);

const ENV_VAR: Shape = Object(&[("name", Leaf), ("value", Leaf), ("valueFrom", Leaf)]);

const PORT: Shape = Object(&[
    ("name", Leaf),
    ("hostPort", Leaf),
    ("containerPort", Leaf),
    ("protocol", Leaf),
    ("hostIP", Leaf),
]);

const VOLUME_MOUNT: Shape = Object(&[
    ("name", Leaf),
    ("readOnly", Leaf),
    ("recursiveReadOnly", Leaf),
    ("mountPath", Leaf),
    ("subPath", Leaf),
    ("mountPropagation", Leaf),
    ("subPathExpr", Leaf),
]);

const CONTAINER: Shape = Object(&[
    ("name", Leaf),
    ("image", Leaf),
    ("command", STRINGS),
    ("args", STRINGS),
    ("workingDir", Leaf),
    ("ports", List(&PORT)),
    ("envFrom", List(&Leaf)),
    ("env", List(&ENV_VAR)),
    ("resources", RESOURCES),
    ("resizePolicy", List(&Leaf)),
    ("restartPolicy", Leaf),
    ("restartPolicyRules", List(&Leaf)),
    ("volumeMounts", List(&VOLUME_MOUNT)),
    ("volumeDevices", List(&Leaf)),
    ("livenessProbe", Leaf),
    ("readinessProbe", Leaf),
    ("startupProbe", Leaf),
    ("lifecycle", Leaf),
    ("terminationMessagePath", Leaf),
    ("terminationMessagePolicy", Leaf),
    ("imagePullPolicy", Leaf),
    ("securityContext", Leaf),
    ("stdin", Leaf),
    ("stdinOnce", Leaf),
    ("tty", Leaf),
]);

const TOLERATION: Shape = Object(&[
    ("key", Leaf),
    ("operator", Leaf),
    ("value", Leaf),
    ("effect", Leaf),
    ("tolerationSeconds", Leaf),
]);

const NAME_REF: Shape = Object(&[("name", Leaf)]);

const SPEC: Shape = Object(&[
    ("volumes", List(&Leaf)),
    ("initContainers", List(&CONTAINER)),
    ("containers", List(&CONTAINER)),
    ("ephemeralContainers", List(&Leaf)),
    ("restartPolicy", Leaf),
    ("terminationGracePeriodSeconds", Leaf),
    ("activeDeadlineSeconds", Leaf),
    ("dnsPolicy", Leaf),
    ("nodeSelector", Map(&Leaf)),
    ("serviceAccountName", Leaf),
    ("serviceAccount", Leaf),
    ("automountServiceAccountToken", Leaf),
    ("nodeName", Leaf),
    ("hostNetwork", Leaf),
    ("hostPID", Leaf),
    ("hostIPC", Leaf),
    ("shareProcessNamespace", Leaf),
    ("securityContext", Leaf),
    ("imagePullSecrets", List(&NAME_REF)),
    ("hostname", Leaf),
    ("hostnameOverride", Leaf),
    ("subdomain", Leaf),
    ("affinity", Leaf),
    ("schedulerName", Leaf),
    ("tolerations", List(&TOLERATION)),
    ("hostAliases", List(&Leaf)),
    ("priorityClassName", Leaf),
    ("priority", Leaf),
    ("dnsConfig", Leaf),
    ("readinessGates", List(&Leaf)),
    ("runtimeClassName", Leaf),
    ("enableServiceLinks", Leaf),
    ("preemptionPolicy", Leaf),
    ("overhead", Map(&Leaf)),
    ("topologySpreadConstraints", List(&Leaf)),
    ("setHostnameAsFQDN", Leaf),
    ("os", Leaf),
    ("hostUsers", Leaf),
    ("schedulingGates", List(&Leaf)),
    ("resourceClaims", List(&Leaf)),
    ("resources", RESOURCES),
]);

/// A Pod.
pub(crate) const POD: Shape = Object(&[
    ("apiVersion", Leaf),
    ("kind", Leaf),
    ("metadata", META),
    ("spec", SPEC),
    ("status", Leaf),
]);

/// The unknown fields of `v` against `shape`, as the strict decoder names them
/// (`spec.containers[0].resources.requets`), in document order.
pub(crate) fn unknown_fields(v: &serde_json::Value, shape: &Shape) -> Vec<String> {
    let mut out = Vec::new();
    walk(v, shape, "", &mut out);
    out
}

fn walk(v: &serde_json::Value, shape: &Shape, path: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match (shape, v) {
        (Object(fields), Value::Object(m)) => {
            for (k, child) in m {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match fields.iter().find(|(name, _)| name == k) {
                    Some((_, s)) => walk(child, s, &p, out),
                    None => out.push(p),
                }
            }
        }
        (List(inner), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, inner, &format!("{path}[{i}]"), out);
            }
        }
        (Map(inner), Value::Object(m)) => {
            for (k, child) in m {
                walk(child, inner, &format!("{path}[{k}]"), out);
            }
        }
        _ => {}
    }
}

/// The strict decoder's error for these unknown fields: `unknown field "a", unknown field
/// "b"`.
pub(crate) fn strict_message(unknown: &[String]) -> String {
    unknown
        .iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_are_named_by_their_path() {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metdata": {"labels": {"a": "b"}},
            "spec": {"containers": [
                {"name": "a", "image": "i", "resources": {"requests": {"cpu": "1"}}},
                {"name": "b", "image": "i", "resources": {"requets": {"cpu": "1"}}}
            ], "nodeSelector": {"any-key": "x"}, "affinity": {"whatever": {}}}
        });
        let u = unknown_fields(&pod, &POD);
        assert_eq!(u, vec!["metdata", "spec.containers[1].resources.requets"]);
        assert_eq!(
            strict_message(&u),
            "unknown field \"metdata\", unknown field \"spec.containers[1].resources.requets\""
        );
        let ok = json!({"metadata": {"name": "p", "ownerReferences": [{"uid": "u", "kind": "Pod"}]},
                        "spec": {"containers": [{"name": "a", "env": [{"name": "X", "value": "1"}]}]}});
        assert!(unknown_fields(&ok, &POD).is_empty());
        let bad = json!({"metadata": {"ownerReferences": [{"uuid": "u"}]}});
        assert_eq!(
            unknown_fields(&bad, &POD),
            vec!["metadata.ownerReferences[0].uuid"]
        );
    }
}
