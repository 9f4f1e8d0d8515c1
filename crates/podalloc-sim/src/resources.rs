//! The one table of the kinds the simulator serves, as kube-apiserver's `APIGroupInfo`s list
//! them: each row names a resource's group, version, plural, kind, scope, the verbs served,
//! the short names and categories discovery advertises, the selectable fields and the
//! prefix of its fault-rule verb names. Routing (`request.rs`), RBAC messages, fault
//! and `forbid` verb names, discovery, the OpenAPI v3 index and field selectors all read
//! this table, so a kind is served exactly where it is listed.

/// A Kubernetes API verb, as the apiserver's `RequestInfo` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verb {
    List,
    Get,
    Create,
    Update,
    Patch,
    Delete,
    DeleteCollection,
    /// `GET` of a collection with `watch=true` (kube-apiserver's `RequestInfo` verb).
    Watch,
}

impl Verb {
    /// Every verb, in the order fault-rule error messages list them.
    pub(crate) const ALL: [Verb; 8] = [
        Verb::List,
        Verb::Get,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
        Verb::Watch,
    ];

    /// The verb's name in RBAC, discovery and audit (`list`, `deletecollection`, …).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::List => "list",
            Verb::Get => "get",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Watch => "watch",
        }
    }
}

/// Which kind a row is, for dispatching on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    Pod,
    ConfigMap,
    Lease,
    Event,
    Namespace,
    /// The `podalloc.io/v1alpha1` custom resource of `deploy/crd.yaml`.
    ExecutorSet,
}

/// A subresource of a row (`executorsets/status`, `executorsets/scale`), as a CRD's
/// `subresources` serve them and discovery lists them.
#[derive(Debug)]
pub(crate) struct SubResource {
    /// The path segment after the object's name (`status`).
    pub name: &'static str,
    /// The verbs served (kube-apiserver serves get, update and patch on both).
    pub verbs: &'static [Verb],
    /// The group, version and kind of its body when it is not the parent's (`/scale`:
    /// `autoscaling`, `v1`, `Scale`); `None`: the parent's own.
    pub gvk: Option<(&'static str, &'static str, &'static str)>,
}

impl SubResource {
    pub(crate) fn serves(&self, verb: Verb) -> bool {
        self.verbs.contains(&verb)
    }
}

/// One served resource (see the module docs).
#[derive(Debug)]
pub(crate) struct Resource {
    /// What the row is.
    pub id: Kind,
    /// API group: `""` for the core group (`/api/v1`), else served under `/apis/GROUP/VERSION`.
    pub group: &'static str,
    pub version: &'static str,
    /// The path segment (`pods`) and RBAC resource name.
    pub plural: &'static str,
    pub singular: &'static str,
    /// The `kind` of an object (`Pod`).
    pub kind: &'static str,
    pub namespaced: bool,
    /// The verbs served; any other is 405 MethodNotAllowed.
    pub verbs: &'static [Verb],
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Prefix of the verb names fault rules and `SimOptions::forbid` use (`cm-` gives
    /// `cm-list`); pods have none.
    pub fault_prefix: &'static str,
    /// The field labels a `fieldSelector` may name (the kind's `ToSelectableFields`).
    pub fields: &'static [&'static str],
    /// Its subresources (none but a custom resource's here).
    pub subresources: &'static [SubResource],
}

impl Resource {
    /// `plural` for the core group, else `plural.group` (the apiserver's
    /// `GroupResource.String`, used in 403 and 404 messages).
    pub(crate) fn qualified(&self) -> String {
        match self.group {
            "" => self.plural.to_string(),
            g => format!("{}.{g}", self.plural),
        }
    }

    /// `v1` for the core group, else `group/version`.
    pub(crate) fn group_version(&self) -> String {
        match self.group {
            "" => self.version.to_string(),
            g => format!("{g}/{}", self.version),
        }
    }

    /// The name fault rules give `verb` on this resource (`cm-update`).
    pub(crate) fn fault_verb(&self, verb: Verb) -> String {
        format!("{}{}", self.fault_prefix, verb.as_str())
    }

    /// The name fault rules give `verb` on subresource `sub` (`es-status-update`).
    pub(crate) fn sub_fault_verb(&self, sub: &SubResource, verb: Verb) -> String {
        format!("{}{}-{}", self.fault_prefix, sub.name, verb.as_str())
    }

    /// The subresource named `name`, if the row has it.
    pub(crate) fn subresource(&self, name: &str) -> Option<&'static SubResource> {
        self.subresources.iter().find(|s| s.name == name)
    }

    pub(crate) fn serves(&self, verb: Verb) -> bool {
        self.verbs.contains(&verb)
    }
}

/// Selectable fields every kind has (`generic.ObjectMetaFieldsSet`).
const META_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

/// The pods' field labels: `pod.ToSelectableFields` plus the conversion function (which
/// also accepts `spec.host`, the legacy alias of `spec.nodeName`).
const POD_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.podIPs",
    "status.nominatedNodeName",
];

/// The Events' field labels: the apiserver's `EventToSelectableFields` plus metadata.
pub(crate) const EVENT_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// The verbs of a kind stored as it is written, without watch or deletecollection: list, get,
/// create, update, patch and delete (ConfigMaps, the ExecutorSet CRD): the first six of
/// [`Verb::ALL`].
const CRUD: &[Verb] = Verb::ALL.split_at(6).0;

/// The served resources; fault verbs are listed in this order.
pub(crate) static RESOURCES: &[Resource] = &[
    Resource {
        id: Kind::Pod,
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        verbs: &[
            Verb::List,
            Verb::Get,
            Verb::Create,
            Verb::Patch,
            Verb::Delete,
            Verb::DeleteCollection,
            Verb::Watch,
        ],
        short_names: &["po"],
        categories: &["all"],
        fault_prefix: "",
        fields: POD_FIELDS,
        // `pods/eviction` (create: `POST pods/NAME/eviction`, a policy/v1 Eviction).
        subresources: &[SubResource {
            name: "eviction",
            verbs: &[Verb::Create],
            gvk: Some(("policy", "v1", "Eviction")),
        }],
    },
    Resource {
        id: Kind::ConfigMap,
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        verbs: CRUD,
        short_names: &["cm"],
        categories: &[],
        fault_prefix: "cm-",
        fields: META_FIELDS,
        subresources: &[],
    },
    Resource {
        id: Kind::Lease,
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        verbs: &[Verb::Get, Verb::Create, Verb::Update, Verb::Delete],
        short_names: &[],
        categories: &[],
        fault_prefix: "lease-",
        fields: META_FIELDS,
        subresources: &[],
    },
    Resource {
        id: Kind::Event,
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        verbs: &[Verb::List, Verb::Get, Verb::Create, Verb::Patch],
        short_names: &["ev"],
        categories: &[],
        fault_prefix: "ev-",
        fields: EVENT_FIELDS,
        subresources: &[],
    },
    Resource {
        id: Kind::Namespace,
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        verbs: &[Verb::List, Verb::Get, Verb::Create],
        short_names: &["ns"],
        categories: &[],
        fault_prefix: "ns-",
        fields: &["metadata.name", "status.phase"],
        subresources: &[],
    },
    // The CRD of `deploy/crd.yaml`, as kube-apiserver serves it once installed (its verbs
    // but `watch` and `deletecollection`, which the simulator does not serve for it).
    Resource {
        id: Kind::ExecutorSet,
        group: "podalloc.io",
        version: "v1alpha1",
        plural: "executorsets",
        singular: "executorset",
        kind: "ExecutorSet",
        namespaced: true,
        verbs: CRUD,
        short_names: &["es"],
        categories: &[],
        fault_prefix: "es-",
        fields: META_FIELDS,
        // In the order the CRD discovery controller lists them.
        subresources: &[
            SubResource {
                name: "status",
                verbs: SUB_VERBS,
                gvk: None,
            },
            SubResource {
                name: "scale",
                verbs: SUB_VERBS,
                gvk: Some(("autoscaling", "v1", "Scale")),
            },
        ],
    },
];

/// The verbs of a custom resource's `status` and `scale` subresources.
const SUB_VERBS: &[Verb] = &[Verb::Get, Verb::Update, Verb::Patch];

/// The row of `id`.
pub(crate) fn of(id: Kind) -> &'static Resource {
    RESOURCES
        .iter()
        .find(|r| r.id == id)
        .expect("every kind has a row")
}

/// The row served at `group/version/plural`, if any.
pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
    RESOURCES
        .iter()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The served group versions, each once, in table order: `(group, version)`.
pub(crate) fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// The kinds served, for people: `pods (v1)`, `leases (coordination.k8s.io/v1)`, …, in table
/// order, each once per group version.
pub(crate) fn served_kinds() -> Vec<String> {
    RESOURCES
        .iter()
        .map(|r| format!("{} ({})", r.plural, r.group_version()))
        .collect()
}

/// Every verb name a fault rule or `forbid` may use, in table order and [`Verb::ALL`]
/// order within a row (`list`, `get`, `create`, `patch`, …, `cm-list`, …).
pub(crate) fn fault_verbs() -> Vec<String> {
    RESOURCES
        .iter()
        .flat_map(|r| {
            let own = (Verb::ALL.iter())
                .filter(|v| r.serves(**v))
                .map(|v| r.fault_verb(*v));
            let subs = r.subresources.iter().flat_map(|s| {
                (Verb::ALL.iter())
                    .filter(|v| s.serves(**v))
                    .map(|v| r.sub_fault_verb(s, *v))
            });
            own.chain(subs).collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_verbs_keep_their_names() {
        let v = fault_verbs();
        for want in [
            "list",
            "deletecollection",
            "patch",
            "cm-update",
            "lease-get",
            "ev-patch",
            "ns-create",
            "es-patch",
            "es-status-update",
            "es-scale-get",
        ] {
            assert!(v.iter().any(|n| n == want), "{want} in {v:?}");
        }
        assert_eq!(&v[..3], ["list", "get", "create"]);
        assert!(!v.iter().any(|n| n == "update" || n == "lease-list"));
    }

    #[test]
    fn rows_are_found_by_path_and_id() {
        let lease = find("coordination.k8s.io", "v1", "leases").unwrap();
        assert_eq!(lease.qualified(), "leases.coordination.k8s.io");
        assert_eq!(lease.group_version(), "coordination.k8s.io/v1");
        assert_eq!(of(Kind::Pod).qualified(), "pods");
        assert!(find("", "v1", "leases").is_none());
        assert_eq!(
            group_versions(),
            [
                ("", "v1"),
                ("coordination.k8s.io", "v1"),
                ("podalloc.io", "v1alpha1")
            ]
        );
    }
}
