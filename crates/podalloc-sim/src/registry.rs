//! The object store every kind but pods shares (ConfigMaps, Leases, Events; and the
//! namespaces that exist), as kube-apiserver's one generic registry
//! (`staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go`) serves every
//! kind with a strategy per kind. It holds the cluster's one resourceVersion counter (etcd's
//! revision, shared by every kind, pods included), its seeded RNG (uids, generated names)
//! and its `WallClock` (timestamps follow from an `Instant`), and lives under the store's
//! one lock.
//!
//! What is the same for every kind is done here once: create (`BeforeCreate`: namespace,
//! system fields dropped, `generateName`, validation, the 500 for a set resourceVersion,
//! 409 AlreadyExists, uid and creationTimestamp, no resourceVersion for a dry run), update
//! (`BeforeUpdate`: the name and namespace of the URL, the optimistic lock, server-set
//! fields kept, `AllowUnconditionalUpdate`, no new resourceVersion when nothing changed),
//! merge patch, delete with preconditions, and lists with label and field selectors.
//! What differs is the kind's [`Strategy`] (`kinds/`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use serde_json::{json, Map, Value};

use super::kinds::{configmap, event, executorset, lease, MetaOnly, Strategy};
use super::resources::{Kind, Resource};
use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::util::{random_suffix, uuid_v4, SplitMix64, WallClock};
use super::validation::FieldError;

/// The message of a 409 Conflict for a write with a stale resourceVersion
/// (`OptimisticLockErrorMsg`).
pub(crate) const OPTIMISTIC_LOCK: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// `DeleteOptions` that matter here.
#[derive(Clone, Debug, Default)]
pub(crate) struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

impl DeleteOptions {
    /// The delete's preconditions against the stored object's `uid` and `rv`, as
    /// `Preconditions.Check` does: a 409 Conflict on `kind` `name` naming the first that
    /// fails.
    pub(crate) fn check(
        &self,
        kind: &str,
        name: &str,
        uid: &str,
        rv: &str,
    ) -> Result<(), ApiError> {
        let failed = |what: &str, want: &str, have: &str, tail: &str| {
            ApiError::conflict(kind, name, &format!(
                "the {what} in the precondition ({want}) does not match the {what} in record ({have}). {tail}"
            ))
        };
        if let Some(want) = self.uid.as_deref().filter(|u| *u != uid) {
            let tail = "The object might have been deleted and then recreated";
            return Err(failed("UID", want, uid, tail));
        }
        if let Some(want) = self.resource_version.as_deref().filter(|r| *r != rv) {
            let tail = "The object might have been modified";
            return Err(failed("ResourceVersion", want, rv, tail));
        }
        Ok(())
    }
}

/// The strategy of a kind.
fn strategy(id: Kind) -> &'static dyn Strategy {
    match id {
        Kind::ConfigMap => &configmap::ConfigMaps,
        Kind::Lease => &lease::Leases,
        Kind::Event => &event::Events,
        Kind::ExecutorSet => &executorset::ExecutorSets,
        Kind::Pod | Kind::Namespace => &MetaOnly,
    }
}

/// What a write changes: the object itself, or (for a kind that has one) its `status`
/// subresource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Main,
    Status,
}

/// An error about `res`: for a resource outside the core group, `details.group` is the
/// group and `details.kind` the plural (the message names the qualified resource, as
/// `NewNotFound(qualifiedResource, …)` renders it).
fn grouped(res: &Resource, mut e: ApiError) -> ApiError {
    if let (false, Some(d)) = (res.group.is_empty(), e.details.as_mut()) {
        d.group = res.group.into();
        d.kind = res.plural.into();
    }
    e
}

/// The 422 of a failed validation, naming the group-qualified kind (`NewInvalid(qualifiedKind,
/// …)`) with the group and kind in the details.
fn invalid(res: &Resource, name: &str, errs: &[FieldError]) -> ApiError {
    let qualified = match res.group {
        "" => res.kind.to_string(),
        g => format!("{}.{g}", res.kind),
    };
    let mut e = ApiError::invalid(&qualified, name, errs);
    if let (false, Some(d)) = (res.group.is_empty(), e.details.as_mut()) {
        d.group = res.group.into();
        d.kind = res.kind.into();
    }
    e
}

/// The 422 of an update without a resourceVersion where the kind needs one: a built-in
/// kind's names the kind and prints the value as `0x0` (a uint64 in hex); a custom
/// resource's names its group-qualified resource and prints `0`.
fn unconditional_update(res: &Resource, name: &str) -> ApiError {
    let mut e = FieldError::invalid(
        "metadata.resourceVersion",
        "",
        "must be specified for an update",
    );
    if res.id != Kind::ExecutorSet {
        e.value = "0x0".into();
        return invalid(res, name, &[e]);
    }
    e.value = "0".into();
    let mut err = ApiError::invalid(&res.qualified(), name, &[e]);
    if let Some(d) = err.details.as_mut() {
        d.group = res.group.into();
        d.kind = res.plural.into();
    }
    err
}

/// Where an object is kept: (kind, `namespace/name`), in etcd's key order.
type Key = (Kind, String);

/// The stored objects of every kind but pods, the namespaces, and the counters every kind
/// shares (see the module docs).
pub(crate) struct Registry {
    /// Without type meta.
    objects: BTreeMap<Key, Value>,
    /// The namespaces that exist; `None`: every valid name does.
    namespaces: Option<BTreeSet<String>>,
    /// The last resourceVersion handed out.
    pub(crate) rv: u64,
    pub(crate) rng: SplitMix64,
    pub(crate) clock: WallClock,
}

impl Registry {
    /// An empty registry in which every valid namespace name exists.
    pub(crate) fn new(rng: SplitMix64, clock: WallClock) -> Self {
        Registry {
            objects: BTreeMap::new(),
            namespaces: None,
            rv: 0,
            rng,
            clock,
        }
    }

    /// Takes the next resourceVersion.
    pub(crate) fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// Stores `v` under `key` with the next resourceVersion (a write) and returns it.
    fn write(&mut self, key: Key, mut v: Value) -> Value {
        v["metadata"]["resourceVersion"] = json!(self.next_rv());
        self.objects.insert(key, v.clone());
        v
    }

    /// Sets the namespaces that exist (`None`: every valid name does).
    pub(crate) fn set_namespaces(&mut self, namespaces: Option<BTreeSet<String>>) {
        self.namespaces = namespaces;
    }

    /// Whether namespace `ns` exists (see `SimOptions::namespaces`).
    pub(crate) fn namespace_exists(&self, ns: &str) -> bool {
        self.namespaces.as_ref().is_none_or(|n| n.contains(ns))
    }

    /// The namespaces to list: the configured ones, or `default` and `kube-system` when
    /// every name exists.
    pub(crate) fn namespace_names(&self) -> Vec<String> {
        match &self.namespaces {
            Some(n) => n.iter().cloned().collect(),
            None => vec!["default".into(), "kube-system".into()],
        }
    }

    /// Adds namespace `name`. Errors: 409 AlreadyExists when it exists (or every name does).
    pub(crate) fn create_namespace(&mut self, name: &str) -> Result<(), ApiError> {
        match self.namespaces.as_mut() {
            Some(s) if !s.contains(name) => {
                s.insert(name.to_string());
                self.rv += 1;
                Ok(())
            }
            _ => Err(ApiError::already_exists_in("namespaces", name, false)),
        }
    }

    /// Whether `ns/name` of kind `id` exists.
    pub(crate) fn contains(&self, id: Kind, ns: &str, name: &str) -> bool {
        self.objects.contains_key(&(id, format!("{ns}/{name}")))
    }

    /// The object `ns/name`. Errors: 404.
    pub(crate) fn get(&self, res: &Resource, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.stored(res, ns, name).map(|(_, v)| v.clone())
    }

    /// The key and stored object of `ns/name`. Errors: 404.
    fn stored(&self, res: &Resource, ns: &str, name: &str) -> Result<(Key, &Value), ApiError> {
        let key = (res.id, format!("{ns}/{name}"));
        match self.objects.get(&key) {
            Some(v) => Ok((key, v)),
            None => Err(grouped(res, ApiError::not_found(&res.qualified(), name))),
        }
    }

    /// The objects of `ns` (every namespace with `None`) that match both selectors, in key
    /// order, with the current resourceVersion.
    pub(crate) fn list(
        &self,
        res: &Resource,
        ns: Option<&str>,
        label: &LabelSelector,
        field: &FieldSelector,
    ) -> (u64, Vec<Value>) {
        let prefix = ns.map(|n| format!("{n}/")).unwrap_or_default();
        let s = strategy(res.id);
        let items = (self.objects.range((res.id, prefix.clone())..))
            .take_while(|((id, k), _)| *id == res.id && k.starts_with(&prefix))
            .map(|(_, v)| v)
            .filter(|v| field.matches(|f| s.field(v, f)) && label.matches(&labels_of(v)))
            .cloned()
            .collect();
        (self.rv, items)
    }

    /// Creates an object in `ns` from a decoded body, as `Store.Create` does (see the module
    /// docs). Errors: 404 for an impossible namespace, 400 namespace mismatch, 422 invalid,
    /// 500 resourceVersion set, 409 AlreadyExists. A dry run (`dry_run`) stores nothing and
    /// answers without a resourceVersion (`DryRunnableStorage.Create`). Returns the object
    /// (without type meta).
    pub(crate) fn create(
        &mut self,
        res: &Resource,
        ns: &str,
        mut v: Value,
        dry_run: bool,
        now: Instant,
    ) -> Result<Value, ApiError> {
        if !super::validation::dns1123_label(ns).is_empty() {
            return Err(ApiError::namespace_not_found(ns));
        }
        let rv_set = prepare_create_metadata(&mut v, ns)?;
        let objects = &self.objects;
        let (name, generated) = assign_name(&mut self.rng, &mut v, |c| {
            objects.contains_key(&(res.id, format!("{ns}/{c}")))
        });
        strategy(res.id).prepare_create(&mut v);
        let errs = strategy(res.id).validate(&v, ns);
        if !errs.is_empty() {
            return Err(invalid(res, &name, &errs));
        }
        if rv_set {
            return Err(ApiError::unknown_server_error(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let key = (res.id, format!("{ns}/{name}"));
        if self.objects.contains_key(&key) {
            let e = ApiError::already_exists_in(&res.qualified(), &name, generated);
            return Err(grouped(res, e));
        }
        // `FillObjectMetaSystemFields`, dry run or not.
        v["metadata"]["uid"] = json!(uuid_v4(&mut self.rng));
        v["metadata"]["creationTimestamp"] = json!(self.clock.rfc3339(now));
        if dry_run {
            return Ok(v);
        }
        Ok(self.write(key, v))
    }

    /// Replaces `ns/name` (PUT), as `Store.Update` does: conditional on
    /// `metadata.resourceVersion` when set (409 Conflict when stale); without one, 422
    /// unless the kind allows unconditional updates. Errors also: 400 name/namespace
    /// mismatch, 404, 422 (uid changed, the kind's validation). An update that changes
    /// nothing, or a dry run, writes nothing (the resourceVersion stays). `part`: the
    /// object (its strategy's `PrepareForUpdate`), or its `status` subresource (only the
    /// body's status is kept).
    pub(crate) fn update(
        &mut self,
        res: &Resource,
        ns: &str,
        name: &str,
        mut v: Value,
        dry_run: bool,
        part: Part,
    ) -> Result<Value, ApiError> {
        if !v.get("metadata").is_some_and(Value::is_object) {
            v["metadata"] = json!({});
        }
        check_update_target(&v, ns, name)?;
        let (key, old) = self.stored(res, ns, name)?;
        let s = strategy(res.id);
        let (want_rv, old_rv) = (
            meta_str(&v, "resourceVersion"),
            meta_str(old, "resourceVersion"),
        );
        if want_rv.is_empty() && !s.allow_unconditional_update() {
            return Err(unconditional_update(res, name));
        }
        if !want_rv.is_empty() && want_rv != old_rv {
            let e = ApiError::conflict(&res.qualified(), name, OPTIMISTIC_LOCK);
            return Err(grouped(res, e));
        }
        keep_server_fields(&mut v, old, ns);
        let mut errs = uid_unchanged(&v, old);
        match (part, s.status()) {
            (Part::Status, Some(st)) => {
                st.prepare_update(&mut v, old);
                errs.extend(st.validate_update(&v, old));
            }
            _ => {
                s.prepare_update(&mut v, old);
                errs.extend(s.validate_update(&v, old, ns));
            }
        }
        if !errs.is_empty() {
            return Err(invalid(res, name, &errs));
        }
        if &v == old || dry_run {
            return Ok(v);
        }
        Ok(self.write(key, v))
    }

    /// A PATCH of `ns/name`, as the apiserver's patcher does it: `patched` makes the new
    /// object from the stored one as served (with type meta; its answer without), and the
    /// result is an update of `part` conditional on the stored resourceVersion, or on the
    /// one the patch itself sets (409 when stale). Errors: 404, those of `patched`, those of
    /// [`Registry::update`].
    pub(crate) fn patch(
        &mut self,
        res: &Resource,
        ns: &str,
        name: &str,
        patched: impl FnOnce(&Value) -> Result<Value, ApiError>,
        dry_run: bool,
        part: Part,
    ) -> Result<Value, ApiError> {
        let (_, old) = self.stored(res, ns, name)?;
        let new = patched(&with_type_meta(res, old))?;
        self.update(res, ns, name, new, dry_run, part)
    }

    /// Deletes `ns/name` at once (finalizers are modelled for pods only, in the pod store);
    /// returns its uid. Errors: 404, 409 for
    /// a failed uid or resourceVersion precondition (`Preconditions.Check`). A dry run
    /// removes nothing.
    pub(crate) fn delete(
        &mut self,
        res: &Resource,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
        dry_run: bool,
    ) -> Result<String, ApiError> {
        let (key, obj) = self.stored(res, ns, name)?;
        let (uid, rv) = (meta_str(obj, "uid"), meta_str(obj, "resourceVersion"));
        opts.check(res.kind, name, uid, rv)?;
        let uid = uid.to_string();
        if !dry_run {
            self.objects.remove(&key);
            self.rv += 1;
        }
        Ok(uid)
    }
}

/// An update keeps what only the server sets (`BeforeUpdate`): the namespace, the uid when
/// the body has none, creationTimestamp and resourceVersion; deletion fields, selfLink,
/// generation and managedFields are dropped.
fn keep_server_fields(v: &mut Value, old: &Value, ns: &str) {
    let meta = &mut v["metadata"];
    meta["namespace"] = json!(ns);
    if field_is_empty(meta, "uid") {
        meta["uid"] = old["metadata"]["uid"].clone();
    }
    meta["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
    meta["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    if let Some(m) = meta.as_object_mut() {
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "generation",
            "managedFields",
        ] {
            m.remove(k);
        }
    }
}

/// `ValidateObjectMetaUpdate`'s uid check: the uid cannot change.
fn uid_unchanged(new: &Value, old: &Value) -> Vec<FieldError> {
    let (n, o) = (meta_str(new, "uid"), meta_str(old, "uid"));
    match n == o {
        true => Vec::new(),
        false => vec![FieldError::invalid("metadata.uid", n, "field is immutable")],
    }
}

/// The labels of an object.
fn labels_of(v: &Value) -> BTreeMap<String, String> {
    v.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// An object as a single-object response or list item of `res`: `kind` and `apiVersion`
/// first, then the stored fields.
pub(crate) fn object_json(res: &Resource, obj: &Value) -> Vec<u8> {
    serde_json::to_vec(&with_type_meta(res, obj)).unwrap_or_default()
}

/// `obj` as served: `kind` and `apiVersion` first, then the stored fields.
pub(crate) fn with_type_meta(res: &Resource, obj: &Value) -> Value {
    let mut out = Map::new();
    out.insert("kind".into(), json!(res.kind));
    out.insert("apiVersion".into(), json!(res.group_version()));
    if let Value::Object(m) = obj {
        out.extend(m.clone());
    }
    Value::Object(out)
}

/// A `KindList` body of `res`'s objects at resourceVersion `rv`. The items of a built-in
/// kind carry no type meta, as in every list kube-apiserver serves; a custom resource's
/// keep theirs (apiextensions serves them as stored, unstructured).
pub(crate) fn list_json(res: &Resource, rv: u64, items: &[Value]) -> Vec<u8> {
    let items: Vec<Value> = match res.id {
        Kind::ExecutorSet => items.iter().map(|i| with_type_meta(res, i)).collect(),
        _ => items.to_vec(),
    };
    serde_json::to_vec(&json!({
        "kind": format!("{}List", res.kind),
        "apiVersion": res.group_version(),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    }))
    .unwrap_or_default()
}

/// The metadata part of a create, for every kind: `metadata` made an object, a namespace in
/// the body must match the path's (400 otherwise, as the apiserver), the path's namespace
/// set, and the fields only the server sets dropped. Returns whether the body carried a
/// `resourceVersion` (the caller answers that with the real error).
pub(crate) fn prepare_create_metadata(v: &mut Value, ns: &str) -> Result<bool, ApiError> {
    if !v.get("metadata").is_some_and(Value::is_object) {
        v["metadata"] = json!({});
    }
    let meta = &mut v["metadata"];
    let body_ns = meta.get("namespace").and_then(Value::as_str).unwrap_or("");
    if !body_ns.is_empty() && body_ns != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    meta["namespace"] = json!(ns);
    let rv_set = meta
        .get("resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty() && s != "0");
    if let Some(m) = meta.as_object_mut() {
        for k in SYSTEM_META {
            m.remove(*k);
        }
    }
    Ok(rv_set)
}

/// Metadata fields only the server sets; dropped from a create's body.
const SYSTEM_META: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "generation",
    "managedFields",
];

fn field_is_empty(meta: &Value, k: &str) -> bool {
    meta.get(k).and_then(Value::as_str).unwrap_or("").is_empty()
}

/// `metadata.K` of an object as a string (empty when unset).
fn meta_str<'a>(v: &'a Value, k: &str) -> &'a str {
    v["metadata"].get(k).and_then(Value::as_str).unwrap_or("")
}

/// A PUT's body names the object of its URL: its `metadata.name` is `name`, and its
/// `metadata.namespace`, when set, is `ns` (kube-apiserver answers 400 BadRequest with these
/// messages otherwise).
pub(crate) fn check_update_target(v: &Value, ns: &str, name: &str) -> Result<(), ApiError> {
    let body_name = meta_str(v, "name");
    if body_name.is_empty() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name} based on URL) was undeterminable: name must be provided"
        )));
    }
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let body_ns = meta_str(v, "namespace");
    if !body_ns.is_empty() && body_ns != ns {
        return Err(ApiError::bad_request(format!(
            "the namespace of the object ({body_ns}) does not match the namespace on the request ({ns})"
        )));
    }
    Ok(())
}

/// Names an object being created: its `metadata.name`, or, when that is empty, one generated
/// from `metadata.generateName` that `taken` says is free (written into `v`; the
/// apiserver's `names.SimpleNameGenerator`). Returns the name and whether it was generated.
pub(crate) fn assign_name(
    rng: &mut SplitMix64,
    v: &mut Value,
    taken: impl Fn(&str) -> bool,
) -> (String, bool) {
    let field = |k: &str| {
        v["metadata"]
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let (name, prefix) = (field("name"), field("generateName"));
    let generated = name.is_empty() && !prefix.is_empty();
    let name = match generated {
        true => generate_name(rng, &prefix, taken),
        false => name,
    };
    v["metadata"]["name"] = json!(name);
    (name, generated)
}

/// The apiserver's `generateName`: the prefix cut to 58 characters plus 5 random
/// alphanumerics, drawn again (up to 8 times) while `taken` says the name is in use.
fn generate_name(rng: &mut SplitMix64, prefix: &str, taken: impl Fn(&str) -> bool) -> String {
    let base: String = prefix.chars().take(58).collect();
    let mut candidate = format!("{base}{}", random_suffix(rng, 5));
    for _ in 0..8 {
        if !taken(&candidate) {
            break;
        }
        candidate = format!("{base}{}", random_suffix(rng, 5));
    }
    candidate
}
