//! What is particular to each kind the registry (`registry.rs`) stores, one file per kind
//! (`configmap.rs`, `lease.rs`, `event.rs`, `executorset.rs`: decoding, validation,
//! selectable fields, a custom resource's status and generation rules), behind
//! one [`Strategy`]: its validation, whether it allows updates without a resourceVersion,
//! and how its selectable fields are read, as kube-apiserver's `rest.RESTCreateStrategy` /
//! `rest.RESTUpdateStrategy` and a kind's `GetAttrs`.

pub(crate) mod configmap;
pub(crate) mod event;
pub(crate) mod executorset;
pub(crate) mod lease;

use serde_json::Value;

use crate::pod::validate_meta;
use crate::validation::FieldError;

/// What is particular to a kind (the apiserver's `RESTCreateStrategy` /
/// `RESTUpdateStrategy`); decoding is the kind's own, before the registry sees the object.
pub(crate) trait Strategy: Sync {
    /// The kind's `Validate` of a new object in `ns` (object meta included).
    fn validate(&self, obj: &Value, ns: &str) -> Vec<FieldError>;

    /// The kind's `ValidateUpdate` (the registry has checked the uid already); by default
    /// `validate` of the new object.
    fn validate_update(&self, new: &Value, _old: &Value, ns: &str) -> Vec<FieldError> {
        self.validate(new, ns)
    }

    /// `AllowUnconditionalUpdate`: whether an update without a resourceVersion is allowed.
    fn allow_unconditional_update(&self) -> bool {
        true
    }

    /// `PrepareForCreate`: what the server changes in a new object before validating it
    /// (nothing by default).
    fn prepare_create(&self, _obj: &mut Value) {}

    /// `PrepareForUpdate`: what the server changes in an update (`new`, the body with the
    /// server's metadata fields kept) before validating it, from the stored `old` (nothing
    /// by default).
    fn prepare_update(&self, _new: &mut Value, _old: &Value) {}

    /// The `status` subresource's `PrepareForUpdate` and `ValidateUpdate`, for kinds that
    /// have one: `None` (the default) for the others.
    fn status(&self) -> Option<&dyn StatusStrategy> {
        None
    }

    /// The value of a selectable field (empty when unset): by default the field's dotted
    /// path in the object.
    fn field<'a>(&self, obj: &'a Value, f: &str) -> &'a str {
        obj.pointer(&format!("/{}", f.replace('.', "/")))
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// The strategy of a kind's `status` subresource (kube-apiserver's `statusStrategy`).
pub(crate) trait StatusStrategy: Sync {
    /// `PrepareForUpdate`: the stored `old` with only the body's status taken from `new`.
    fn prepare_update(&self, new: &mut Value, old: &Value);

    /// `ValidateUpdate` of a status update.
    fn validate_update(&self, new: &Value, old: &Value) -> Vec<FieldError>;
}

/// The strategy of kinds with nothing of their own to check: object meta only (pods and
/// namespaces are not stored in the registry; see `store.rs` and `Registry::create_namespace`).
pub(crate) struct MetaOnly;

impl Strategy for MetaOnly {
    fn validate(&self, obj: &Value, _ns: &str) -> Vec<FieldError> {
        let mut errs = Vec::new();
        validate_meta(obj.get("metadata").unwrap_or(&Value::Null), &mut errs);
        errs
    }
}
