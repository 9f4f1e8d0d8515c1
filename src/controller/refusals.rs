//! Each refusal named for what it is. The API server refuses a call for very different
//! reasons that share a few HTTP codes; this module reads the `Status` the way an operator
//! would and says which one it is, what to fix and the exit code, so nothing is called RBAC
//! that is not:
//!
//! | refusal | how the server says it | exit | what podalloc does in a loop |
//! |---|---|---|---|
//! | template | 400 (a body it cannot decode: `quantities must match…`, strict field validation), 422 `Invalid` | 4 | backs off creates, quotes the server |
//! | admission | 403 `violates PodSecurity "restricted:latest"`, `admission webhook "W" denied the request` (any code), `ValidatingAdmissionPolicy 'P' … denied request` | 4 | backs off, names the policy |
//! | quota exceeded | 403 `exceeded quota: Q, requested: …` | 1 | backs off (room may come) |
//! | quota that can never admit the template | 403 `failed quota: Q: must specify limits.cpu` | 4 | backs off, names the missing limits |
//! | quota smaller than one executor | 403 `exceeded quota: Q, requested: R=X, used: …, limited: R=L` with X > L | 4 | backs off, names the resource, its limit and the request |
//! | quota object conflict | 409 `Conflict` on `resourcequotas` (not `AlreadyExists`) | 1 | retried at once, then next tick; no id burnt |
//! | RBAC | 403 `User "U" cannot VERB resource "R" …` | 4 | stops, naming the verb and resource |
//! | a namespace being deleted | 403 `unable to create new content in namespace N because it is being terminated` (NamespaceLifecycle) | 4 | backs off, says the namespace is going away |
//! | no such namespace | 404 `namespaces "N" not found` on a create (the NamespaceLifecycle admission plugin; a list there is an empty 200) | 4 | backs off, names the namespace |
//!
//! Sources: `plugin/pkg/admission/resourcequota` (the quota messages),
//! `plugin/pkg/admission/namespace/lifecycle` (`namespaces "%s" not found`),
//! `staging/src/k8s.io/pod-security-admission` (`violates PodSecurity`),
//! `staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/errors` (`admission webhook
//! %q denied the request`), `…/plugin/policy/validating` (`ValidatingAdmissionPolicy '%s'
//! with binding '%s' denied request`), `plugin/pkg/auth/authorizer/rbac` (`cannot %s
//! resource %q`).

use crate::kube::{ApiStatus, KubeError};

/// What kind of refusal an API error is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The pod as sent cannot be decoded or validated (400 that no admission plugin wrote,
    /// 422): fix the pod template.
    Template,
    /// An admission plugin refused it: the policy named (Pod Security, a webhook, a
    /// ValidatingAdmissionPolicy, or another admission plugin's 403).
    Admission(String),
    /// A ResourceQuota is full ("exceeded quota"): room may come.
    QuotaExceeded,
    /// A ResourceQuota that can never admit the template ("failed quota: Q: must specify
    /// …"): the quota's name and what the template must specify.
    QuotaNeverAdmits {
        /// The ResourceQuota's name.
        quota: String,
        /// The server's list of what is missing (`limits.cpu,limits.memory`, or with
        /// containers: `limits.cpu for: c; limits.memory for: c`).
        missing: String,
    },
    /// A ResourceQuota whose hard limit on a resource is below what one pod requests
    /// ("exceeded quota: Q, requested: R=X, …, limited: R=L" with X > L): no room can ever
    /// come, however many executors end.
    QuotaTooSmall {
        /// The ResourceQuota's name.
        quota: String,
        /// `R=X`: the resource and what one pod requests.
        requested: String,
        /// `R=L`: the quota's hard limit on it.
        limited: String,
    },
    /// 409 `Conflict` on a create (the quota admission lost a race on the ResourceQuota's
    /// status): nothing was created; trying again is right.
    Conflict,
    /// The namespace does not exist (404 `namespaces "N" not found` on a create, as the
    /// NamespaceLifecycle admission plugin answers): its name.
    NoNamespace(String),
    /// The namespace is being deleted (403 `unable to create new content in namespace N
    /// because it is being terminated`): its name.
    NamespaceTerminating(String),
    /// RBAC: the user may not do this verb on this resource.
    Rbac {
        /// The user as the server names it.
        user: String,
        /// The verb (`create`, `list`, …).
        verb: String,
        /// The resource (`pods`, `pods/eviction`, `configmaps`, …).
        resource: String,
    },
}

/// Reads `e` as a refusal, if it is one (an [`KubeError::Api`] with 400, 403, 409 that is
/// not `AlreadyExists`, 422, or a 404 naming a namespace).
pub(crate) fn classify(e: &KubeError) -> Option<Refusal> {
    let KubeError::Api { status, .. } = e else {
        return None;
    };
    let m = status.message.as_str();
    if let Some(policy) = admission_policy(m) {
        return Some(Refusal::Admission(policy));
    }
    if let Some(ns) = terminating_namespace(m).filter(|_| status.code == 403) {
        return Some(Refusal::NamespaceTerminating(ns));
    }
    match status.code {
        404 => missing_namespace(m).map(Refusal::NoNamespace),
        400 | 422 => Some(Refusal::Template),
        409 if status.reason != "AlreadyExists" => Some(Refusal::Conflict),
        403 => Some(forbidden(status)),
        _ => None,
    }
}

/// A 403 that no admission plugin named: quota, RBAC, or an unnamed admission plugin.
fn forbidden(status: &ApiStatus) -> Refusal {
    let m = status.message.as_str();
    if let Some(rest) = m.split("failed quota: ").nth(1) {
        if let Some((quota, missing)) = rest.split_once(": must specify ") {
            return Refusal::QuotaNeverAdmits {
                quota: quota.trim().to_string(),
                missing: missing.trim().to_string(),
            };
        }
    }
    if let Some(r) = quota_too_small(m) {
        return r;
    }
    if m.contains("exceeded quota") || m.contains("failed quota") {
        return Refusal::QuotaExceeded;
    }
    match rbac(m) {
        Some(r) => r,
        None => Refusal::Admission("an admission plugin".to_string()),
    }
}

/// The quota admission's `exceeded quota: Q, requested: R=X,…, used: …, limited: R=L,…`
/// when one resource's request alone is over its limit (compared as quantities): the quota
/// can never admit the pod.
fn quota_too_small(m: &str) -> Option<Refusal> {
    let rest = m.split("exceeded quota: ").nth(1)?;
    let (quota, rest) = rest.split_once(", requested: ")?;
    let (requested, rest) = rest.split_once(", used: ")?;
    let limited = rest.split_once(", limited: ")?.1;
    let pairs = |s: &str| -> Vec<(String, String)> {
        (s.split(','))
            .filter_map(|kv| kv.trim().split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let limits = pairs(limited);
    pairs(requested).into_iter().find_map(|(r, x)| {
        let (_, l) = limits.iter().find(|(k, _)| *k == r)?;
        (quantity(&x)? > quantity(l)?).then(|| Refusal::QuotaTooSmall {
            quota: quota.trim().to_string(),
            requested: format!("{r}={x}"),
            limited: format!("{r}={l}"),
        })
    })
}

/// A Kubernetes quantity (`100m`, `2`, `1.5Gi`, `512Mi`, `1e3`, `2k`) as a number, for
/// comparing two of the same resource; `None` when it does not parse.
fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let (num, mult) = suffixes
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .unwrap_or((q, 1.0));
    num.parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
        .map(|n| n * mult)
}

/// The admission policy a message names: Pod Security's level, a webhook's name or a
/// ValidatingAdmissionPolicy's.
fn admission_policy(m: &str) -> Option<String> {
    if let Some(rest) = m.split("violates PodSecurity ").nth(1) {
        let level = rest.split(':').next().unwrap_or(rest).trim_matches('"');
        let level = rest
            .strip_prefix('"')
            .and_then(|r| r.split('"').next())
            .unwrap_or(level);
        return Some(format!(
            "Pod Security \"{level}\" (the namespace's pod-security.kubernetes.io/enforce label)"
        ));
    }
    if let Some(rest) = m.split("admission webhook \"").nth(1) {
        let name = rest.split('"').next().unwrap_or_default();
        return Some(format!("admission webhook \"{name}\""));
    }
    if let Some(rest) = m.split("ValidatingAdmissionPolicy '").nth(1) {
        let name = rest.split('\'').next().unwrap_or_default();
        return Some(format!("ValidatingAdmissionPolicy '{name}'"));
    }
    None
}

/// The namespace of a 404 `namespaces "N" not found` (the whole message: a 404 about
/// another object, e.g. `pods "x" not found`, is no refusal).
fn missing_namespace(m: &str) -> Option<String> {
    let name = m
        .strip_prefix("namespaces \"")?
        .strip_suffix("\" not found")?;
    (!name.is_empty() && !name.contains('"')).then(|| name.to_string())
}

/// The namespace of NamespaceLifecycle's `unable to create new content in namespace N
/// because it is being terminated`.
fn terminating_namespace(m: &str) -> Option<String> {
    let rest = m
        .split("unable to create new content in namespace ")
        .nth(1)?;
    let name = rest.strip_suffix(" because it is being terminated")?;
    (!name.is_empty() && !name.contains(' ')).then(|| name.to_string())
}

/// RBAC's `User "U" cannot VERB resource "R" in API group …`.
fn rbac(m: &str) -> Option<Refusal> {
    let (before, after) = m.split_once(" cannot ")?;
    let (verb, rest) = after.split_once(" resource \"")?;
    let resource = rest.split('"').next()?.to_string();
    let user = (before.rsplit_once("User \""))
        .and_then(|(_, u)| u.split('"').next())
        .unwrap_or("the user")
        .to_string();
    Some(Refusal::Rbac {
        user,
        verb: verb.trim().to_string(),
        resource,
    })
}

impl Refusal {
    /// Whether another try at once would meet the same answer (then a loop backs off
    /// creates and a one-shot command exits 4): every refusal but a full quota and a
    /// conflict.
    pub(crate) fn is_permanent(&self) -> bool {
        !matches!(self, Refusal::QuotaExceeded | Refusal::Conflict)
    }

    /// What to do about it, for the end of the error line.
    pub(crate) fn hint(&self) -> String {
        match self {
            Refusal::Template => "fix the pod template: the API server refused it as sent".into(),
            Refusal::Admission(policy) => format!(
                "refused by {policy}, not by RBAC: change the pod template to satisfy the \
                 policy, or the policy"
            ),
            Refusal::QuotaExceeded => "a ResourceQuota is full: creates back off until \
                 there is room"
                .into(),
            Refusal::QuotaNeverAdmits { quota, missing } => format!(
                "ResourceQuota {quota:?} admits only pods that specify {missing}; the pod \
                 template does not: add them to its containers (retrying will not help)"
            ),
            Refusal::QuotaTooSmall {
                quota,
                requested,
                limited,
            } => format!(
                "ResourceQuota {quota:?} allows {limited} in all, less than one executor \
                 requests ({requested}): no executor can ever fit; raise the quota or lower \
                 the pod template's requests (retrying will not help)"
            ),
            Refusal::Conflict => "the ResourceQuota changed under the API server's \
                 admission (409 Conflict); nothing was created, tried again"
                .into(),
            Refusal::NoNamespace(ns) => format!(
                "namespace {ns:?} does not exist on this server: fix --namespace, or create \
                 it (kubectl create namespace {ns})"
            ),
            Refusal::NamespaceTerminating(ns) => format!(
                "namespace {ns:?} is being deleted: no executor can be created there until it \
                 is gone and made again (not a policy of the pod template)"
            ),
            Refusal::Rbac {
                user,
                verb,
                resource,
            } => format!(
                "RBAC: user {user:?} may not {verb} {resource}: grant the service account \
                 podalloc runs as `{verb}` on `{resource}` in a Role bound to it \
                 (deploy/rbac.yaml lists what podalloc needs)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> KubeError {
        KubeError::Api {
            verb: "create pod a-exec-1".into(),
            status: ApiStatus {
                code,
                reason: reason.into(),
                message: message.into(),
                ..ApiStatus::default()
            },
        }
    }

    #[test]
    fn each_refusal_is_named_for_what_it_is() {
        let psa = api(
            403,
            "Forbidden",
            r#"pods "a-exec-1" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false)"#,
        );
        let Some(Refusal::Admission(p)) = classify(&psa) else {
            panic!("{:?}", classify(&psa))
        };
        assert!(p.contains("Pod Security \"restricted:latest\""), "{p}");
        let hook = api(
            400,
            "BadRequest",
            r#"admission webhook "deny.example.com" denied the request: no"#,
        );
        assert_eq!(
            classify(&hook),
            Some(Refusal::Admission(
                "admission webhook \"deny.example.com\"".into()
            ))
        );
        let vap = api(403, "Forbidden", "pods \"a\" is forbidden: ValidatingAdmissionPolicy 'no-root' with binding 'b' denied request: x");
        assert_eq!(
            classify(&vap),
            Some(Refusal::Admission(
                "ValidatingAdmissionPolicy 'no-root'".into()
            ))
        );
        let bad = api(400, "BadRequest", "Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression");
        assert_eq!(classify(&bad), Some(Refusal::Template));
        assert_eq!(classify(&api(422, "Invalid", "x")), Some(Refusal::Template));
        let full = api(403, "Forbidden", "pods \"a\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2");
        assert_eq!(classify(&full), Some(Refusal::QuotaExceeded));
        // One executor over the whole limit: it can never fit (the attack on issue 31).
        let small = api(403, "Forbidden", "pods \"a\" is forbidden: exceeded quota: q3, requested: requests.cpu=100m, used: requests.cpu=0, limited: requests.cpu=50m");
        let r = classify(&small).unwrap();
        assert!(r.is_permanent(), "{r:?}");
        assert!(r.hint().contains("requests.cpu=50m") && r.hint().contains("requests.cpu=100m"));
        let fits = api(403, "Forbidden", "pods \"a\" is forbidden: exceeded quota: q, requested: requests.memory=512Mi, used: requests.memory=1Gi, limited: requests.memory=1Gi");
        assert_eq!(classify(&fits), Some(Refusal::QuotaExceeded));
        assert_eq!(quantity("1.5Gi"), Some(1.5 * 1024f64.powi(3)));
        assert_eq!(quantity("2"), Some(2.0));
        assert_eq!(quantity("x"), None);
        let never = api(
            403,
            "Forbidden",
            "pods \"a\" is forbidden: failed quota: compute: must specify limits.cpu for: c; limits.memory for: c",
        );
        let r = classify(&never).unwrap();
        assert!(r.is_permanent());
        assert!(r.hint().contains("\"compute\""), "{}", r.hint());
        assert!(r.hint().contains("limits.cpu for: c; limits.memory for: c"));
        let rbac = api(403, "Forbidden", "pods is forbidden: User \"system:serviceaccount:ns:sa\" cannot create resource \"pods/eviction\" in API group \"\" in the namespace \"ns\"");
        assert_eq!(
            classify(&rbac),
            Some(Refusal::Rbac {
                user: "system:serviceaccount:ns:sa".into(),
                verb: "create".into(),
                resource: "pods/eviction".into()
            })
        );
        assert!(!classify(&psa).unwrap().hint().contains("grant"));
        let conflict = api(409, "Conflict", "Operation cannot be fulfilled on resourcequotas \"q\": the object has been modified; please apply your changes to the latest version and try again");
        assert_eq!(classify(&conflict), Some(Refusal::Conflict));
        assert_eq!(classify(&api(409, "AlreadyExists", "x")), None);
        let ns = api(404, "NotFound", "namespaces \"nope\" not found");
        assert_eq!(classify(&ns), Some(Refusal::NoNamespace("nope".into())));
        assert!(classify(&ns).unwrap().is_permanent());
        assert!(classify(&ns).unwrap().hint().contains("fix --namespace"));
        assert_eq!(
            classify(&api(404, "NotFound", "pods \"a\" not found")),
            None
        );
        assert_eq!(classify(&api(500, "InternalError", "x")), None);
        let going = api(403, "Forbidden", "pods \"a-exec-1\" is forbidden: unable to create new content in namespace t19 because it is being terminated");
        assert_eq!(
            classify(&going),
            Some(Refusal::NamespaceTerminating("t19".into()))
        );
        assert!(classify(&going).unwrap().is_permanent());
        assert!(!classify(&going).unwrap().hint().contains("admission"));
    }
}
