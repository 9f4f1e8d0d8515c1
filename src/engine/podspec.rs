//! Pod spec: template + executor id + app → the Pod JSON to create. Pure: no I/O.
//!
//! Names and labels are Spark-compatible (Spark's `spark-app-selector`, `spark-role` and
//! `spark-exec-id` labels):
//! - name `<prefix>-exec-<id>`, the prefix derived from the app id so that the whole name is a
//!   DNS-1123 label of at most 63 characters for any app id and any u64 id, and different app
//!   ids get different names: a short stable hash of the app id is added whenever it had to be
//!   sanitised or shortened ([`name_prefix`], [`pod_name`]);
//! - labels `spark-app-selector=<app id>`, `spark-role=executor`, `spark-exec-id=<id>` and
//!   `spark-exec-resourceprofile-id=<profile>` (Spark 3.1+'s) merged over the template's labels;
//! - env `SPARK_EXECUTOR_ID`, `SPARK_APPLICATION_ID` and `SPARK_RESOURCE_PROFILE_ID` on every
//!   container;
//! - `restartPolicy: Never` (as Spark: a failed executor is replaced, not restarted in place);
//! - an ownerReference (controller: true) to the driver pod when one is named, so Kubernetes
//!   garbage-collects the executors with the driver.

use crate::engine::snapshot::{LABEL_APP, LABEL_EXEC_ID, LABEL_PROFILE, LABEL_ROLE, ROLE_EXECUTOR};
use serde_json::{json, Map, Value};
use std::fmt;

/// Longest Kubernetes label value and DNS-1123 label (characters).
pub const MAX_LABEL_LEN: usize = 63;

/// Checks that `v` is a DNS-1123 label, as the API server checks a namespace name
/// (`IsDNS1123Label` in `k8s.io/apimachinery/pkg/util/validation`): 1 to 63 characters of
/// `[a-z0-9-]`, alphanumeric at both ends. So a name read from a file (`namespace:` in an
/// apps file) can never leave its directory (`../x`) or its URL path. The error is one line
/// naming `what` and the value (its first 80 characters, escaped).
pub fn validate_dns1123_label(what: &str, v: &str) -> Result<(), String> {
    check_dns1123(what, v, MAX_LABEL_LEN, false)
}

/// Checks that `v` is a DNS-1123 subdomain, as the API server checks a pod or ConfigMap name
/// (`IsDNS1123Subdomain`): 1 to 253 characters of `[a-z0-9.-]`, each dot-separated part
/// alphanumeric at both ends. Errors as [`validate_dns1123_label`].
pub fn validate_dns1123_subdomain(what: &str, v: &str) -> Result<(), String> {
    check_dns1123(what, v, 253, true)
}

fn check_dns1123(what: &str, v: &str, max: usize, dots: bool) -> Result<(), String> {
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    };
    let ok = v.len() <= max
        && match dots {
            true => v.split('.').all(label_ok),
            false => label_ok(v),
        };
    if ok {
        return Ok(());
    }
    let shown: String = v.chars().take(80).collect();
    let rule = match dots {
        true => "a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', at most 253",
        false => "a DNS-1123 label: lower-case letters, digits and '-', at most 63",
    };
    Err(format!("{what} {shown:?} is not a valid name ({rule})"))
}

/// Checks that `v` can be a label value: ≤ 63 characters of `[A-Za-z0-9._-]`, alphanumeric at
/// both ends, not empty. The error is one line naming the value and the rule.
pub fn validate_label_value(what: &str, v: &str) -> Result<(), String> {
    let ok_chars = v
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    let ends = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if v.is_empty() {
        Err(format!(
            "{what} is empty; it must be a Kubernetes label value such as spark-app-1"
        ))
    } else if v.len() > MAX_LABEL_LEN {
        Err(format!(
            "{what} {v:?} is {} characters; a Kubernetes label value has at most 63",
            v.len()
        ))
    } else if !ok_chars || !ends(v.as_bytes().first()) || !ends(v.as_bytes().last()) {
        Err(format!(
            "{what} {v:?} is not a valid Kubernetes label value: use letters, digits, '-', '_' \
             or '.', starting and ending with a letter or digit"
        ))
    } else {
        Ok(())
    }
}

/// The pod name prefix for an app id. An app id that is already made of lower-case letters,
/// digits and single inner `-` is its own prefix (so names of such app ids never change).
/// Any other is sanitised — lower-cased, every character outside `[a-z0-9-]` replaced by `-`,
/// runs of `-` collapsed, leading and trailing `-` trimmed, `spark` if nothing is left — and
/// followed by `-` and [`fnv1a_tag`] of the full app id, so that app ids differing only in case
/// or punctuation (`etl.daily`, `ETL_daily`, `etl-daily`) get different pod names.
pub fn name_prefix(app_id: &str) -> String {
    let mut out = String::with_capacity(app_id.len() + 6);
    for c in app_id.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if c == '-' && (out.is_empty() || out.ends_with('-')) {
            continue;
        }
        out.push(c);
    }
    while out.ends_with('-') {
        out.pop();
    }
    if out == app_id {
        return out;
    }
    if out.is_empty() {
        out.push_str("spark");
    }
    out.push('-');
    out.push_str(&fnv1a_tag(app_id));
    out
}

/// `<prefix>-exec-<id>` when that is at most 63 characters (a DNS-1123 label). Longer: the
/// prefix is cut (and its trailing `-` trimmed) and followed by `-` and [`fnv1a_tag`] of the
/// whole prefix, so two app ids that share their first characters still get different names.
/// Deterministic: the same prefix and id always give the same name, which makes creates
/// idempotent (a retried create gets 409 AlreadyExists).
pub fn pod_name(prefix: &str, id: u64) -> String {
    let suffix = format!("-exec-{id}");
    if prefix.len() + suffix.len() <= MAX_LABEL_LEN {
        return format!("{prefix}{suffix}");
    }
    let tag = fnv1a_tag(prefix);
    let room = MAX_LABEL_LEN - suffix.len() - tag.len() - 1;
    let mut p = &prefix[..prefix.len().min(room)];
    while p.ends_with('-') {
        p = &p[..p.len() - 1];
    }
    if p.is_empty() {
        p = "spark";
    }
    format!("{p}-{tag}{suffix}")
}

/// A short stable hash for names: the top 20 bits of the 32-bit FNV-1a hash of `s`'s bytes
/// (offset basis 0x811c9dc5, prime 0x01000193; the Fowler–Noll–Vo function as published in
/// IETF draft-eastlake-fnv), as 5 lower-case hex digits. The same in every process and
/// version, unlike std's randomly seeded hasher.
pub fn fnv1a_tag(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{:05x}", h >> 12)
}

/// The driver pod executors are owned by: its name and uid (from `GET pods/NAME`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// `metadata.name` of the driver pod.
    pub name: String,
    /// `metadata.uid` of the driver pod.
    pub uid: String,
}

/// Why a template cannot be used. One line naming the problem and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TemplateError(pub String);

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TemplateError {}

/// The container name of the `--image` pod: Spark's executor container name
/// (`spark-kubernetes-executor`).
pub const EXECUTOR_CONTAINER: &str = "spark-kubernetes-executor";
/// The CPU request of the `--image` pod.
pub const DEFAULT_CPU_REQUEST: &str = "100m";
/// The memory request of the `--image` pod.
pub const DEFAULT_MEMORY_REQUEST: &str = "256Mi";

/// A validated executor pod template: a Pod object with at least one container that has an
/// image.
#[derive(Clone, Debug, PartialEq)]
pub struct PodTemplate {
    pod: Value,
}

impl PodTemplate {
    /// The executor pod for `--image` without `--template`: one container shaped like
    /// Spark's own executor container (Spark's `spark.kubernetes.executor` pod builder):
    /// named [`EXECUTOR_CONTAINER`], `imagePullPolicy: IfNotPresent` (Spark's default
    /// `spark.kubernetes.container.image.pullPolicy`), and a small resource request
    /// ([`DEFAULT_CPU_REQUEST`], [`DEFAULT_MEMORY_REQUEST`]) so the scheduler accounts for
    /// it; a `--template` gives its own.
    pub fn from_image(image: &str) -> Result<PodTemplate, TemplateError> {
        if image.trim().is_empty() {
            return Err(TemplateError(
                "--image is empty: give a container image".into(),
            ));
        }
        Ok(PodTemplate {
            pod: json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {},
                "spec": {"containers": [{
                    "name": EXECUTOR_CONTAINER,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "resources": {"requests": {
                        "cpu": DEFAULT_CPU_REQUEST,
                        "memory": DEFAULT_MEMORY_REQUEST,
                    }},
                }]}
            }),
        })
    }

    /// The names of the template's containers (`spec.containers`), in order.
    pub fn container_names(&self) -> Vec<&str> {
        (self.pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten())
        .filter_map(|c| c["name"].as_str())
        .collect()
    }

    /// Checks that `name` (`--executor-container`) is one of the template's containers.
    /// Errors: one line naming it and the containers the template has.
    pub fn check_executor_container(&self, name: &str) -> Result<(), String> {
        let names = self.container_names();
        if names.contains(&name) {
            return Ok(());
        }
        let shown: String = name.chars().take(80).collect();
        Err(format!(
            "--executor-container {shown:?} is not a container of the executor pod template \
             (it has: {})",
            names.join(", ")
        ))
    }

    /// The template as a Pod object (as given: its image, when `--image` overrode it).
    pub fn pod(&self) -> &Value {
        &self.pod
    }

    /// The name of the template's first container: the executor container unless
    /// `--executor-container` names another (as Spark, which takes the first container when
    /// `spark.kubernetes.executor.podTemplateContainerName` is not set).
    pub fn first_container(&self) -> &str {
        self.pod["spec"]["containers"][0]["name"]
            .as_str()
            .unwrap_or_default()
    }

    /// Validates a parsed template: an object, `spec.containers` a non-empty list of objects,
    /// each with a `name`; the first needs an `image` unless `image` is given (it then
    /// overrides the first container's image, as Spark's `spark.kubernetes.container.image`).
    ///
    /// Errors: [`TemplateError`] naming the missing field.
    pub fn from_value(mut pod: Value, image: Option<&str>) -> Result<PodTemplate, TemplateError> {
        let obj = pod
            .as_object_mut()
            .ok_or_else(|| TemplateError("the template is not a Pod object".into()))?;
        // Fields podalloc merges into must have their API types; never repair them silently.
        let meta = obj.get("metadata");
        for (path, v) in [
            ("metadata", meta),
            ("metadata.labels", meta.and_then(|m| m.get("labels"))),
            (
                "metadata.annotations",
                meta.and_then(|m| m.get("annotations")),
            ),
            ("spec", obj.get("spec")),
        ] {
            if v.is_some_and(|v| !v.is_object() && !v.is_null()) {
                return Err(TemplateError(format!(
                    "{path} in the template is not a map"
                )));
            }
        }
        if meta
            .and_then(|m| m.get("ownerReferences"))
            .is_some_and(|v| !v.is_array() && !v.is_null())
        {
            return Err(TemplateError(
                "metadata.ownerReferences in the template is not a list".into(),
            ));
        }
        let containers = obj
            .get_mut("spec")
            .and_then(|s| s.get_mut("containers"))
            .and_then(Value::as_array_mut)
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                TemplateError(
                    "the template has no containers: add spec.containers with at least one \
                     container (name and image)"
                        .into(),
                )
            })?;
        for (i, c) in containers.iter_mut().enumerate() {
            let c = c.as_object_mut().ok_or_else(|| {
                TemplateError(format!(
                    "spec.containers[{i}] in the template is not an object"
                ))
            })?;
            if i == 0 {
                if let Some(image) = image {
                    c.insert("image".into(), Value::String(image.into()));
                }
            }
            if c.get("env").is_some_and(|v| !v.is_array() && !v.is_null()) {
                return Err(TemplateError(format!(
                    "spec.containers[{i}].env in the template is not a list"
                )));
            }
            if !c.get("name").is_some_and(Value::is_string) {
                return Err(TemplateError(format!(
                    "spec.containers[{i}] in the template has no name"
                )));
            }
            let image = c.get("image").and_then(Value::as_str).unwrap_or("");
            if image.is_empty() {
                return Err(TemplateError(format!(
                    "spec.containers[{i}] in the template has no image: set it there or pass --image"
                )));
            }
        }
        Ok(PodTemplate { pod })
    }

    /// A fingerprint of the template (FNV-1a 64 of its JSON, 16 hex digits): the same in
    /// every process for the same template, another for a changed one, so a creation
    /// back-off set by refusals of one template ends when the template changes.
    pub fn fingerprint(&self) -> String {
        let text = self.pod.to_string();
        let h = (text.bytes()).fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("{h:016x}")
    }

    /// Builds the Pod to create for executor `id` of `app_id` in the default resource
    /// profile, named `name` (see [`pod_name`]): [`PodTemplate::build_for`] with profile 0.
    pub fn build(&self, app_id: &str, id: u64, name: &str, owner: Option<&Owner>) -> Value {
        self.build_for(app_id, id, 0, name, owner)
    }

    /// Builds the Pod to create for executor `id` of `app_id` in resource profile `profile`,
    /// named `name` (see [`pod_name`]): Spark's executor labels, `spark-exec-resourceprofile-id`
    /// included (as Spark 3.1+'s `BasicExecutorFeatureStep` sets it, profile 0 too), and env
    /// `SPARK_RESOURCE_PROFILE_ID` on every container.
    pub fn build_for(
        &self,
        app_id: &str,
        id: u64,
        profile: u32,
        name: &str,
        owner: Option<&Owner>,
    ) -> Value {
        let mut pod = self.pod.clone();
        let obj = pod.as_object_mut().expect("validated as an object");
        obj.insert("apiVersion".into(), json!("v1"));
        obj.insert("kind".into(), json!("Pod"));
        obj.remove("status");
        // Spark's test template says `Kind: Pod` (capital K): an unknown key the API would warn on.
        obj.remove("Kind");
        let meta = object_at(obj, "metadata");
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "generateName",
            "selfLink",
            "managedFields",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
        ] {
            meta.remove(k);
        }
        meta.insert("name".into(), json!(name));
        let labels = object_at(meta, "labels");
        labels.insert(LABEL_APP.into(), json!(app_id));
        labels.insert(LABEL_ROLE.into(), json!(ROLE_EXECUTOR));
        labels.insert(LABEL_EXEC_ID.into(), json!(id.to_string()));
        labels.insert(LABEL_PROFILE.into(), json!(profile.to_string()));
        if let Some(owner) = owner {
            let refs = meta.entry("ownerReferences").or_insert_with(|| json!([]));
            if !refs.is_array() {
                *refs = json!([]);
            }
            let refs = refs.as_array_mut().expect("just made an array");
            // At most one controller reference is allowed: ours replaces a template's.
            for r in refs.iter_mut() {
                if let Some(r) = r.as_object_mut() {
                    r.remove("controller");
                }
            }
            refs.push(json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "name": owner.name,
                "uid": owner.uid,
                "controller": true,
            }));
        }
        let spec = object_at(obj, "spec");
        spec.insert("restartPolicy".into(), json!("Never"));
        if let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) {
            for c in containers.iter_mut().filter_map(Value::as_object_mut) {
                set_env(c, "SPARK_EXECUTOR_ID", &id.to_string());
                set_env(c, "SPARK_APPLICATION_ID", app_id);
                set_env(c, "SPARK_RESOURCE_PROFILE_ID", &profile.to_string());
            }
        }
        pod
    }
}

/// `obj[key]` as an object, made one if absent or not an object.
fn object_at<'a>(obj: &'a mut Map<String, Value>, key: &str) -> &'a mut Map<String, Value> {
    let v = obj.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if !v.is_object() {
        *v = Value::Object(Map::new());
    }
    v.as_object_mut().expect("just made an object")
}

/// Sets env var `name` on a container, replacing an existing entry of that name.
fn set_env(container: &mut Map<String, Value>, name: &str, value: &str) {
    let env = container.entry("env").or_insert_with(|| json!([]));
    if !env.is_array() {
        *env = json!([]);
    }
    let env = env.as_array_mut().expect("just made an array");
    env.retain(|e| e.get("name").and_then(Value::as_str) != Some(name));
    env.push(json!({"name": name, "value": value}));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_files_are_validated_as_the_api_server_does() {
        for ok in ["default", "team-b", "a1", &"x".repeat(63)] {
            assert!(validate_dns1123_label("namespace", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../../tmp/evil",
            "Team",
            "-a",
            "a-",
            "a.b",
            "a/b",
            &"x".repeat(64),
        ] {
            let e = validate_dns1123_label("namespace", bad).unwrap_err();
            assert!(
                e.contains("not a valid name") && !e.contains('\n'),
                "{bad}: {e}"
            );
        }
        assert!(validate_dns1123_subdomain("pod", "driver-1.team").is_ok());
        for bad in ["", "a..b", ".a", "a/b", "A", &"x".repeat(254)] {
            assert!(validate_dns1123_subdomain("pod", bad).is_err(), "{bad}");
        }
    }

    fn is_dns1123_label(s: &str) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    }

    #[test]
    fn names_are_dns_labels_for_any_app_and_id() {
        let apps = [
            "spark-app-1",
            "spark-9f3c2a1b7d4e4c8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b",
            "My_App.2024",
            "---",
            "a",
            "Z9",
            "x".repeat(63).as_str(),
            "ab-------------------------------------------------------------c",
        ]
        .map(String::from);
        for app in &apps {
            let prefix = name_prefix(app);
            for id in [1, 9, 10, 12345, u64::MAX] {
                let n = pod_name(&prefix, id);
                assert!(is_dns1123_label(&n), "{app} {id} -> {n}");
                assert!(n.ends_with(&format!("-exec-{id}")));
            }
        }
        assert_eq!(
            pod_name(&name_prefix("spark-app-1"), 6),
            "spark-app-1-exec-6"
        );
        assert_eq!(
            name_prefix("My_App.2024"),
            format!("my-app-2024-{}", fnv1a_tag("My_App.2024"))
        );
    }

    /// Different app ids never share pod names, even when the name has to shorten or
    /// sanitise the app id; names of short, already lower-case DNS-label app ids do not change.
    #[test]
    fn names_are_unique_per_app_id() {
        let name = |app: &str, id| pod_name(&name_prefix(app), id);
        assert_ne!(name("etl.daily", 1), name("ETL_daily", 1));
        assert_ne!(name("etl.daily", 1), name("etl-daily", 1));
        assert_eq!(name("etl-daily", 1), "etl-daily-exec-1");
        assert_eq!(name("etl.daily", 1), "etl-daily-1d9cf-exec-1"); // as the README says
        let base = "a".repeat(56);
        let (x, y) = (format!("{base}-x"), format!("{base}-y"));
        for id in [1, 12345, u64::MAX] {
            assert_ne!(name(&x, id), name(&y, id), "{id}");
            assert!(is_dns1123_label(&name(&x, id)));
        }
        // Stable: the same app id gives the same name in every process (a retried create
        // after a restart must hit 409 AlreadyExists, never a second pod).
        assert_eq!(name("ETL_daily", 3), name("ETL_daily", 3));
        assert_eq!(fnv1a_tag("etl.daily"), fnv1a_tag("etl.daily"));
        assert_eq!(fnv1a_tag(""), "811c9");
        assert_eq!(fnv1a_tag("a"), "e40c2"); // FNV-1a-32("a") = 0xe40c292c
                                             // An id long enough to cut even a short app id keeps app ids apart too.
        let long_a = "spark-".to_string() + &"b".repeat(40);
        let long_b = "spark-".to_string() + &"b".repeat(39) + "c";
        assert_ne!(name(&long_a, u64::MAX), name(&long_b, u64::MAX));
    }

    #[test]
    fn label_values() {
        assert!(validate_label_value("app id", "spark-app-1").is_ok());
        assert!(validate_label_value("app id", "A.b_c-9").is_ok());
        for bad in ["", "-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            assert!(validate_label_value("app id", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn build_merges_labels_env_owner() {
        let tpl = PodTemplate::from_value(
            json!({"metadata": {"labels": {"team": "etl", "spark-exec-id": "99"},
                                "namespace": "elsewhere", "uid": "old"},
                   "spec": {"containers": [
                       {"name": "executor", "image": "img", "env": [{"name": "SPARK_EXECUTOR_ID", "value": "0"}]},
                       {"name": "sidecar", "image": "side"}]},
                   "status": {"phase": "Running"}, "Kind": "Pod"}),
            None,
        )
        .unwrap();
        let owner = Owner {
            name: "drv".into(),
            uid: "u1".into(),
        };
        let pod = tpl.build("app-1", 7, "app-1-exec-7", Some(&owner));
        assert_eq!(pod["metadata"]["name"], "app-1-exec-7");
        assert_eq!(pod["metadata"]["labels"]["team"], "etl");
        assert_eq!(pod["metadata"]["labels"]["spark-exec-id"], "7");
        assert_eq!(pod["metadata"]["labels"]["spark-role"], "executor");
        assert!(pod["metadata"].get("namespace").is_none());
        assert!(pod["metadata"].get("uid").is_none());
        assert!(pod.get("status").is_none());
        assert!(pod.get("Kind").is_none());
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
        for c in pod["spec"]["containers"].as_array().unwrap() {
            let env = c["env"].as_array().unwrap();
            let ids: Vec<_> = env
                .iter()
                .filter(|e| e["name"] == "SPARK_EXECUTOR_ID")
                .collect();
            assert_eq!(ids.len(), 1);
            assert_eq!(ids[0]["value"], "7");
            assert!(env
                .iter()
                .any(|e| e["name"] == "SPARK_APPLICATION_ID" && e["value"] == "app-1"));
        }
    }

    #[test]
    fn bad_templates() {
        for (t, needle) in [
            (json!([]), "not a Pod object"),
            (json!({"spec": {}}), "no containers"),
            (json!({"spec": {"containers": []}}), "no containers"),
            (json!({"spec": {"containers": [{"image": "x"}]}}), "no name"),
            (json!({"spec": {"containers": [{"name": "x"}]}}), "no image"),
            (
                json!({"metadata": 5, "spec": {"containers": [{"name": "x", "image": "i"}]}}),
                "metadata in the template is not a map",
            ),
            (
                json!({"metadata": {"labels": ["a"]}, "spec": {"containers": [{"name": "x", "image": "i"}]}}),
                "metadata.labels",
            ),
            (
                json!({"spec": {"containers": [{"name": "x", "image": "i", "env": 5}]}}),
                "env in the template is not a list",
            ),
        ] {
            let e = PodTemplate::from_value(t, None).unwrap_err();
            assert!(e.0.contains(needle), "{e}");
        }
        // --image fills the first container's image (Spark's template "will-be-overwritten").
        assert!(PodTemplate::from_value(
            json!({"spec": {"containers": [{"name": "x"}]}}),
            Some("img")
        )
        .is_ok());
        assert!(PodTemplate::from_image(" ").is_err());
    }
}
