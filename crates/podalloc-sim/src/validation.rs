//! Kubernetes' name and label validation (k8s.io/apimachinery `util/validation`), with the
//! same messages, plus `field.Error` rendering.

use std::fmt;

/// The kind of a field error; each maps to a `CauseType` (`FieldValueInvalid`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorType {
    Invalid,
    Required,
    Duplicate,
    NotSupported,
    Forbidden,
    TooLong,
    /// `field.TypeInvalid`: rendered as `Invalid value`, cause `FieldValueTypeInvalid`.
    TypeInvalid,
}

/// One validation failure on one field, as `field.Error`.
#[derive(Clone, Debug)]
pub(crate) struct FieldError {
    pub kind: ErrorType,
    /// Path such as `metadata.name` or `spec.containers[0].image`.
    pub field: String,
    /// The offending value, already rendered the way Go's `%#v`/`%q` would print it.
    pub value: String,
    pub detail: String,
}

impl FieldError {
    /// `field.Invalid(path, value, detail)` for a string value.
    pub(crate) fn invalid(
        field: impl Into<String>,
        value: &str,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            kind: ErrorType::Invalid,
            field: field.into(),
            value: go_quote(value),
            detail: detail.into(),
        }
    }

    /// `field.Invalid(path, value, detail)` for a JSON value, rendered as `field.Error`
    /// renders a Go value: numbers, booleans and nil (`null`) plain, strings quoted, objects
    /// and arrays not at all.
    pub(crate) fn invalid_json(
        field: impl Into<String>,
        value: &serde_json::Value,
        detail: impl Into<String>,
    ) -> Self {
        let value = match value {
            serde_json::Value::String(s) => go_quote(s),
            serde_json::Value::Object(_) | serde_json::Value::Array(_) => String::new(),
            other => other.to_string(),
        };
        FieldError {
            kind: ErrorType::Invalid,
            field: field.into(),
            value,
            detail: detail.into(),
        }
    }

    /// `field.Required(path, detail)`.
    pub(crate) fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::Required,
            field: field.into(),
            value: String::new(),
            detail: detail.into(),
        }
    }

    /// `field.Duplicate(path, value)`.
    pub(crate) fn duplicate(field: impl Into<String>, value: &str) -> Self {
        FieldError {
            kind: ErrorType::Duplicate,
            field: field.into(),
            value: go_quote(value),
            detail: String::new(),
        }
    }

    /// `field.NotSupported(path, value, valid)`.
    pub(crate) fn not_supported(field: impl Into<String>, value: &str, valid: &[&str]) -> Self {
        FieldError {
            kind: ErrorType::NotSupported,
            field: field.into(),
            value: go_quote(value),
            detail: format!(
                "supported values: {}",
                valid
                    .iter()
                    .map(|v| go_quote(v))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// `field.Forbidden(path, detail)`.
    pub(crate) fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            kind: ErrorType::Forbidden,
            field: field.into(),
            value: String::new(),
            detail: detail.into(),
        }
    }

    /// `field.TooLong(path, value, max)` for a byte limit (the value is never shown).
    pub(crate) fn too_long(field: impl Into<String>, max_bytes: usize) -> Self {
        FieldError {
            kind: ErrorType::TooLong,
            field: field.into(),
            value: String::new(),
            detail: format!("may not be more than {max_bytes} bytes"),
        }
    }

    /// The `CauseType` string.
    pub(crate) fn cause_type(&self) -> &'static str {
        match self.kind {
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    /// `ErrorBody()`: the message without the field path (what `causes[].message` holds).
    pub(crate) fn body(&self) -> String {
        let head = match self.kind {
            // A value `field.Error` does not print (an object's, from a CEL rule).
            ErrorType::Invalid | ErrorType::TypeInvalid if self.value.is_empty() => {
                "Invalid value".to_string()
            }
            ErrorType::Invalid | ErrorType::TypeInvalid => format!("Invalid value: {}", self.value),
            ErrorType::Required => "Required value".to_string(),
            ErrorType::Duplicate => format!("Duplicate value: {}", self.value),
            ErrorType::NotSupported => format!("Unsupported value: {}", self.value),
            ErrorType::Forbidden => "Forbidden".to_string(),
            ErrorType::TooLong => "Too long".to_string(),
        };
        if self.detail.is_empty() {
            head
        } else {
            format!("{head}: {}", self.detail)
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// A Go-style double-quoted string (close to `strconv.Quote` for the inputs we meet).
pub(crate) fn go_quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

/// `RegexError(msg, fmt, examples...)`, including Go's double space before "or".
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// Matches `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn matches_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && is_alnum_lower(b[0])
        && is_alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| is_alnum_lower(c) || c == b'-')
}

/// Matches `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn matches_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `IsDNS1123Label`: the messages for an invalid value, empty when valid.
pub(crate) fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !matches_dns_label(s) {
        errs.push(regex_error(
            DNS1123_LABEL_MSG,
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    errs
}

/// `IsDNS1123Subdomain`: the messages for an invalid value, empty when valid.
pub(crate) fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    if !s.split('.').all(matches_dns_label) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// `NameIsDNSSubdomain(name, prefix)`: with `prefix`, a trailing `-` is allowed
/// (generateName).
pub(crate) fn object_name(name: &str, prefix: bool) -> Vec<String> {
    if prefix && name.ends_with('-') {
        let masked = format!("{}a", &name[..name.len() - 1]);
        dns1123_subdomain(&masked)
    } else {
        dns1123_subdomain(name)
    }
}

/// `IsQualifiedName` (label keys): an optional DNS-subdomain prefix and `/`, then a name
/// of at most 63 characters.
pub(crate) fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                for m in dns1123_subdomain(prefix) {
                    errs.push(format!("prefix part {m}"));
                }
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_MSG, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push(format!("name part {}", max_len_error(63)));
    }
    if !matches_qualified_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

/// `IsValidLabelValue`: empty, or at most 63 characters of `[A-Za-z0-9._-]` starting and
/// ending alphanumeric.
pub(crate) fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push(max_len_error(63));
    }
    if !s.is_empty() && !matches_qualified_name(s) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

const CONFIG_MAP_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_MAP_KEY_MSG: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";

/// `IsConfigMapKey`: at most 253 characters of `[-._a-zA-Z0-9]`, not `.` or `..` and not
/// starting with `..`.
pub(crate) fn config_map_key(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push(max_len_error(253));
    }
    let ok = !s.is_empty()
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'));
    if !ok {
        errs.push(regex_error(
            CONFIG_MAP_KEY_MSG,
            CONFIG_MAP_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    if s == "." {
        errs.push("must not be '.'".to_string());
    } else if s == ".." {
        errs.push("must not be '..'".to_string());
    } else if s.starts_with("..") {
        errs.push("must not start with '..'".to_string());
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_value_message_is_the_real_one() {
        assert_eq!(
            label_value("bad value!"),
            vec!["a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string()]
        );
        assert!(label_value("").is_empty());
        assert!(label_value("A.b_c-9").is_empty());
        assert_eq!(label_value(&"a".repeat(64)), vec![max_len_error(63)]);
        assert!(!label_value("-a").is_empty());
    }

    #[test]
    fn names_and_keys() {
        assert!(object_name("exec-1.x", false).is_empty());
        assert!(!object_name("Exec", false).is_empty());
        assert!(!object_name("a..b", false).is_empty());
        assert!(object_name("spark-exec-", true).is_empty());
        assert!(!object_name("spark-exec-", false).is_empty());
        assert_eq!(
            object_name(&"a".repeat(254), false),
            vec![max_len_error(253)]
        );
        assert!(qualified_name("spark-app-selector").is_empty());
        assert!(qualified_name("example.com/My_Name").is_empty());
        assert_eq!(qualified_name("/x"), vec!["prefix part must be non-empty"]);
        assert_eq!(qualified_name("a/b/c").len(), 1);
        assert_eq!(qualified_name("").len(), 2);
        assert!(dns1123_label("exec").is_empty());
        assert!(!dns1123_label("a.b").is_empty());
    }

    #[test]
    fn config_map_keys() {
        assert!(config_map_key("app.properties").is_empty());
        assert!(config_map_key("KEY_NAME-1").is_empty());
        assert_eq!(
            config_map_key("a b"),
            vec!["a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')".to_string()]
        );
        assert_eq!(config_map_key(".."), vec!["must not be '..'".to_string()]);
        assert_eq!(
            config_map_key("..x"),
            vec!["must not start with '..'".to_string()]
        );
        assert_eq!(config_map_key(&"k".repeat(254)), vec![max_len_error(253)]);
        assert_eq!(
            FieldError::too_long("[]", 1048576).to_string(),
            "[]: Too long: may not be more than 1048576 bytes"
        );
        assert_eq!(
            FieldError::forbidden("data", "field is immutable when `immutable` is set").body(),
            "Forbidden: field is immutable when `immutable` is set"
        );
    }

    #[test]
    fn field_error_rendering() {
        let e = FieldError::invalid("metadata.labels", "x y", "bad");
        assert_eq!(
            e.to_string(),
            r#"metadata.labels: Invalid value: "x y": bad"#
        );
        assert_eq!(
            FieldError::required("spec.containers", "").to_string(),
            "spec.containers: Required value"
        );
        assert_eq!(
            FieldError::required("metadata.name", "name or generateName is required").body(),
            "Required value: name or generateName is required"
        );
    }
}
