//! The resource kinds podalloc calls (kube-rs's `ApiResource`): where each kind's collection
//! is and what its objects are called. A leaf: [`super::Api`] builds requests from these,
//! and the client's write fence tells Lease calls by them.

/// A namespaced resource kind: where its collection is and what its objects are called
/// (kube-rs's `ApiResource`, kube-apiserver's `metav1.APIResource`).
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    /// The URL prefix of its group version: `api/v1` for the core group, else
    /// `apis/GROUP/VERSION` (e.g. `apis/coordination.k8s.io/v1`).
    pub api: &'static str,
    /// The collection's path segment (`APIResource.name`), e.g. `pods`; also names a list
    /// in logs and errors ("list pods").
    pub plural: &'static str,
    /// Lower-case singular (`APIResource.singularName`), e.g. `pod`; names one object in
    /// logs and errors ("get pod NAME").
    pub singular: &'static str,
    /// The `kind` every answer about one object must carry, e.g. `Pod`.
    pub kind: &'static str,
}

impl Resource {
    /// A resource of the core group (`api/v1`).
    const fn core(plural: &'static str, singular: &'static str, kind: &'static str) -> Self {
        Resource {
            api: "api/v1",
            plural,
            singular,
            kind,
        }
    }
}

/// core/v1 Pods.
pub const PODS: Resource = Resource::core("pods", "pod", "Pod");

/// core/v1 ConfigMaps (the ConfigMap state store).
pub const CONFIG_MAPS: Resource = Resource::core("configmaps", "configmap", "ConfigMap");

/// core/v1 Events.
pub const EVENTS: Resource = Resource::core("events", "event", "Event");

/// coordination.k8s.io/v1 Leases (leader election). Calls on them pass the write fence
/// ([`super::KubeClient::set_write_fence`]): the election itself must go on when it is lost.
pub const LEASES: Resource = Resource {
    api: "apis/coordination.k8s.io/v1",
    plural: "leases",
    singular: "lease",
    kind: "Lease",
};

/// podalloc.io/v1alpha1 ExecutorSets (`docs/executorset.md`, the CRD in `deploy/crd.yaml`):
/// the in-cluster home of an app's intent. People and scalers write `spec`; the controller
/// writes only `status`, through [`super::Api::replace_status`].
pub const EXECUTOR_SETS: Resource = Resource {
    api: "apis/podalloc.io/v1alpha1",
    plural: "executorsets",
    singular: "executorset",
    kind: "ExecutorSet",
};
