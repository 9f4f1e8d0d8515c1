//! Label and field selectors, parsed and matched like k8s.io/apimachinery's `labels.Parse`
//! and `fields.ParseSelector` (same grammar, same error texts).

use std::collections::{BTreeMap, BTreeSet};

use super::validation;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    In,
    NotIn,
    Equals,
    NotEquals,
    Exists,
    DoesNotExist,
    GreaterThan,
    LessThan,
}

#[derive(Clone, Debug)]
struct Requirement {
    key: String,
    op: Op,
    values: BTreeSet<String>,
}

/// A parsed label selector: requirements that must all hold. Empty matches everything.
#[derive(Clone, Debug, Default)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Bang,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    In,
    NotIn,
    Open,
    Close,
    Comma,
    End,
    Error(String),
}

impl Tok {
    fn literal(&self) -> String {
        match self {
            Tok::Ident(s) | Tok::Error(s) => s.clone(),
            Tok::Bang => "!".into(),
            Tok::Eq => "=".into(),
            Tok::DoubleEq => "==".into(),
            Tok::NotEq => "!=".into(),
            Tok::Gt => ">".into(),
            Tok::Lt => "<".into(),
            Tok::In => "in".into(),
            Tok::NotIn => "notin".into(),
            Tok::Open => "(".into(),
            Tok::Close => ")".into(),
            Tok::Comma => ",".into(),
            Tok::End => String::new(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn lex(s: &str) -> Vec<Tok> {
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    loop {
        while i < chars.len() && is_space(chars[i]) {
            i += 1;
        }
        if i >= chars.len() {
            out.push(Tok::End);
            return out;
        }
        let c = chars[i];
        if is_special(c) {
            let next = chars.get(i + 1).copied();
            let (tok, n) = match (c, next) {
                ('=', Some('=')) => (Tok::DoubleEq, 2),
                ('!', Some('=')) => (Tok::NotEq, 2),
                ('=', _) => (Tok::Eq, 1),
                ('!', _) => (Tok::Bang, 1),
                ('(', _) => (Tok::Open, 1),
                (')', _) => (Tok::Close, 1),
                (',', _) => (Tok::Comma, 1),
                ('>', _) => (Tok::Gt, 1),
                ('<', _) => (Tok::Lt, 1),
                _ => (Tok::Error(c.to_string()), 1),
            };
            out.push(tok);
            i += n;
        } else {
            let start = i;
            while i < chars.len() && !is_space(chars[i]) && !is_special(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            out.push(match word.as_str() {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Ident(word),
            });
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    KeyAndOperator,
    Values,
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn get(&self, ctx: Ctx) -> Tok {
        let t = self.toks.get(self.pos).cloned().unwrap_or(Tok::End);
        match (ctx, t) {
            (Ctx::Values, Tok::In) => Tok::Ident("in".into()),
            (Ctx::Values, Tok::NotIn) => Tok::Ident("notin".into()),
            (_, t) => t,
        }
    }

    fn lookahead(&self, ctx: Ctx) -> Tok {
        self.get(ctx)
    }

    fn consume(&mut self, ctx: Ctx) -> Tok {
        let t = self.get(ctx);
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut reqs = Vec::new();
        loop {
            match self.lookahead(Ctx::Values) {
                Tok::Ident(_) | Tok::Bang => {
                    let r = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    reqs.push(r);
                    match self.consume(Ctx::Values) {
                        Tok::End => return Ok(reqs),
                        Tok::Comma => match self.lookahead(Ctx::Values) {
                            Tok::Ident(_) | Tok::Bang => {}
                            t => {
                                return Err(format!(
                                    "found '{}', expected: identifier after ','",
                                    t.literal()
                                ))
                            }
                        },
                        t => {
                            return Err(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            ))
                        }
                    }
                }
                Tok::End => return Ok(reqs),
                t => {
                    return Err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    ))
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, op) = self.parse_key_and_infer_operator()?;
        if op == Some(Op::Exists) || op == Some(Op::DoesNotExist) {
            return new_requirement(key, op.unwrap_or(Op::Exists), BTreeSet::new());
        }
        let op = self.parse_operator()?;
        let values = match op {
            Op::In | Op::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, op, values)
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Op>), String> {
        let mut op = None;
        let mut tok = self.consume(Ctx::Values);
        if tok == Tok::Bang {
            op = Some(Op::DoesNotExist);
            tok = self.consume(Ctx::Values);
        }
        let key = match tok {
            Tok::Ident(k) => k,
            t => return Err(format!("found '{}', expected: identifier", t.literal())),
        };
        validate_key(&key)?;
        if matches!(self.lookahead(Ctx::Values), Tok::End | Tok::Comma) && op.is_none() {
            op = Some(Op::Exists);
        }
        Ok((key, op))
    }

    fn parse_operator(&mut self) -> Result<Op, String> {
        match self.consume(Ctx::KeyAndOperator) {
            Tok::In => Ok(Op::In),
            Tok::Eq | Tok::DoubleEq => Ok(Op::Equals),
            Tok::Gt => Ok(Op::GreaterThan),
            Tok::Lt => Ok(Op::LessThan),
            Tok::NotIn => Ok(Op::NotIn),
            Tok::NotEq => Ok(Op::NotEquals),
            t => Err(format!(
                "found '{}', expected: '=', '!=', '==', 'in', notin'",
                t.literal()
            )),
        }
    }

    fn parse_values(&mut self) -> Result<BTreeSet<String>, String> {
        let t = self.consume(Ctx::Values);
        if t != Tok::Open {
            return Err(format!("found '{}' expected: '('", t.literal()));
        }
        match self.lookahead(Ctx::Values) {
            Tok::Ident(_) | Tok::Comma => {
                let s = self.parse_identifiers_list()?;
                let t = self.consume(Ctx::Values);
                if t != Tok::Close {
                    return Err(format!("found '{}', expected: ')'", t.literal()));
                }
                Ok(s)
            }
            Tok::Close => {
                self.consume(Ctx::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            t => Err(format!(
                "found '{}', expected: ',', ')' or identifier",
                t.literal()
            )),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut s = BTreeSet::new();
        loop {
            match self.consume(Ctx::Values) {
                Tok::Ident(v) => {
                    s.insert(v);
                    match self.lookahead(Ctx::Values) {
                        Tok::Comma => continue,
                        Tok::Close => return Ok(s),
                        t => return Err(format!("found '{}', expected: ',' or ')'", t.literal())),
                    }
                }
                Tok::Comma => {
                    if s.is_empty() {
                        s.insert(String::new());
                    }
                    match self.lookahead(Ctx::Values) {
                        Tok::Close => {
                            s.insert(String::new());
                            return Ok(s);
                        }
                        Tok::Comma => {
                            self.consume(Ctx::Values);
                            s.insert(String::new());
                        }
                        _ => {}
                    }
                }
                t => {
                    return Err(format!(
                        "found '{}', expected: ',', or identifier",
                        t.literal()
                    ))
                }
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        if matches!(self.lookahead(Ctx::Values), Tok::End | Tok::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        match self.consume(Ctx::Values) {
            Tok::Ident(v) => Ok(BTreeSet::from([v])),
            t => Err(format!("found '{}', expected: identifier", t.literal())),
        }
    }
}

fn validate_key(key: &str) -> Result<(), String> {
    let errs = validation::qualified_name(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "key: Invalid value: {}: {}",
            validation::go_quote(key),
            errs.join("; ")
        ))
    }
}

fn new_requirement(key: String, op: Op, values: BTreeSet<String>) -> Result<Requirement, String> {
    validate_key(&key)?;
    match op {
        Op::In | Op::NotIn if values.is_empty() => {
            return Err(
                "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
                    .into(),
            )
        }
        Op::Equals | Op::NotEquals if values.len() != 1 => {
            return Err(
                "values: Invalid value: exact-match compatibility requires one single value".into(),
            )
        }
        Op::GreaterThan | Op::LessThan => {
            let ok = values.len() == 1 && values.iter().all(|v| v.parse::<i64>().is_ok());
            if !ok {
                return Err(format!(
                    "values[0]: Invalid value: {}: for 'Gt', 'Lt' operators, the value must be an integer",
                    validation::go_quote(values.iter().next().map(String::as_str).unwrap_or(""))
                ));
            }
        }
        _ => {}
    }
    if !matches!(op, Op::GreaterThan | Op::LessThan) {
        for (i, v) in values.iter().enumerate() {
            let errs = validation::label_value(v);
            if !errs.is_empty() {
                return Err(format!(
                    "values[{i}][{key}]: Invalid value: {}: {}",
                    validation::go_quote(v),
                    errs.join("; ")
                ));
            }
        }
    }
    Ok(Requirement { key, op, values })
}

impl LabelSelector {
    /// Parses the `labelSelector` query value (already URL-decoded). The error text is the
    /// apiserver's, for a 400 BadRequest.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut p = Parser {
            toks: lex(s),
            pos: 0,
        };
        let mut reqs = p.parse()?;
        reqs.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { reqs })
    }

    /// True when the selector has no requirements.
    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// True when every requirement holds for `labels`.
    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| {
            let v = labels.get(&r.key);
            match r.op {
                Op::In | Op::Equals => v.is_some_and(|v| r.values.contains(v)),
                Op::NotIn | Op::NotEquals => v.is_none_or(|v| !r.values.contains(v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::GreaterThan | Op::LessThan => {
                    let (Some(have), Some(want)) = (
                        v.and_then(|v| v.parse::<i64>().ok()),
                        r.values.iter().next().and_then(|w| w.parse::<i64>().ok()),
                    ) else {
                        return false;
                    };
                    if r.op == Op::GreaterThan {
                        have > want
                    } else {
                        have < want
                    }
                }
            }
        })
    }
}

#[derive(Clone, Debug)]
struct FieldTerm {
    field: &'static str,
    value: String,
    negate: bool,
}

/// A parsed field selector: terms that must all hold. Empty matches everything.
#[derive(Clone, Debug, Default)]
pub(crate) struct FieldSelector {
    terms: Vec<FieldTerm>,
}

/// Splits on commas not escaped by a backslash (`fields.splitTerms`).
fn split_terms(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            cur.push(c);
            escaped = true;
        } else if c == ',' {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    out.push(cur);
    out
}

/// Finds the first operator (`!=`, `==`, `=`) scanning left to right (`fields.splitTerm`).
fn split_term(term: &str) -> Option<(&str, &str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if let Some(rhs) = rest.strip_prefix(op) {
                return Some((&term[..i], op, rhs));
            }
        }
    }
    None
}

/// `fields.UnescapeValue`: `\\`, `\,` and `\=` are the only escapes; a bare `,` or `=`
/// is an error.
fn unescape_value(s: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    ))
                }
                None => return Err("invalid field selector: invalid escape sequence: \\".into()),
            },
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {c}"
                ))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses a `fieldSelector` query value (`fields.ParseSelector`) against the field
    /// labels the kind supports (its row's `fields` in [`super::resources`]; `spec.host` is
    /// read as `spec.nodeName`, the pods' legacy alias). Errors carry the apiserver's text
    /// (`field label not supported: foo`) for a 400 BadRequest.
    pub(crate) fn parse(s: &str, supported: &[&'static str]) -> Result<Self, String> {
        let mut parts = split_terms(s);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts.iter().filter(|p| !p.is_empty()) {
            let Some((lhs, op, rhs)) = split_term(part) else {
                return Err(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                ));
            };
            let value = unescape_value(rhs)?;
            let label = if lhs == "spec.host" {
                "spec.nodeName"
            } else {
                lhs
            };
            let Some(field) = supported.iter().find(|f| **f == label) else {
                return Err(format!("field label not supported: {lhs}"));
            };
            terms.push(FieldTerm {
                field,
                value,
                negate: op == "!=",
            });
        }
        Ok(FieldSelector { terms })
    }

    /// True when the selector has no terms.
    pub(crate) fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// True when every term holds; `get` returns a field's value (empty when unset).
    pub(crate) fn matches<'a>(&self, get: impl Fn(&str) -> &'a str) -> bool {
        self.terms
            .iter()
            .all(|t| (get(t.field) == t.value) != t.negate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{of, Kind};

    /// A pod field selector.
    fn pods(s: &str) -> Result<FieldSelector, String> {
        FieldSelector::parse(s, of(Kind::Pod).fields)
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn m(sel: &str, l: &[(&str, &str)]) -> bool {
        LabelSelector::parse(sel).unwrap().matches(&labels(l))
    }

    #[test]
    fn every_label_operator() {
        let a = [("app", "x"), ("role", "executor"), ("n", "5")];
        assert!(m("", &a));
        assert!(m("app=x", &a));
        assert!(m("app==x", &a));
        assert!(!m("app=y", &a));
        assert!(m("app!=y", &a));
        assert!(m("missing!=y", &a));
        assert!(m("role in (executor, driver)", &a));
        assert!(!m("role in (driver)", &a));
        assert!(m("role notin (driver)", &a));
        assert!(m("missing notin (driver)", &a));
        assert!(!m("role notin (executor)", &a));
        assert!(m("app", &a));
        assert!(!m("missing", &a));
        assert!(m("!missing", &a));
        assert!(!m("!app", &a));
        assert!(m("app=x,role=executor", &a));
        assert!(!m("app=x,role=driver", &a));
        assert!(m("n>4,n<6", &a));
        assert!(!m("n>5", &a));
        assert!(m("app in (x),!missing, role", &a));
        assert!(m("empty=", &[("empty", "")]));
        assert!(m("empty in ()", &[("empty", "")]));
        assert!(m("x in (in, notin)", &[("x", "notin")]));
    }

    #[test]
    fn malformed_label_selectors_are_rejected_with_real_text() {
        let err = |s: &str| LabelSelector::parse(s).unwrap_err();
        assert_eq!(
            err("component not in (x)"),
            "unable to parse requirement: found 'not', expected: '=', '!=', '==', 'in', notin'"
        );
        assert_eq!(
            err("a in b"),
            "unable to parse requirement: found 'b' expected: '('"
        );
        assert!(err("a=b c").starts_with("found 'c', expected: ',' or 'end of string'"));
        assert!(err("a=(").contains("expected: identifier"));
        assert!(err("a in (b").contains("expected: ',' or ')'"));
        assert!(err("a=b,").contains("expected: identifier after ','"));
        assert!(err("bad key=1").contains("expected: '='"));
        assert!(err("a=b!").contains("'end of string'"));
        assert!(err("a=bad value!x").contains("end of string"));
        assert!(err("k=-x").contains("values[0][k]: Invalid value"));
        assert!(err("-k=x").contains("key: Invalid value"));
        assert!(err("n>x").contains("must be an integer"));
        assert!(err(",a").contains("expected: !, identifier"));
    }

    #[test]
    fn field_selectors() {
        let get = |f: &str| match f {
            "status.phase" => "Pending",
            "metadata.name" => "p-1",
            _ => "",
        };
        let ok = |s: &str| pods(s).unwrap().matches(get);
        assert!(ok(""));
        assert!(ok("status.phase=Pending"));
        assert!(ok("status.phase==Pending"));
        assert!(!ok("status.phase!=Pending"));
        assert!(ok("spec.nodeName="));
        assert!(ok("spec.host="));
        assert!(ok("metadata.name=p-1,status.phase!=Running"));
        assert!(!ok("metadata.namespace=default"));
        assert_eq!(
            pods("foo=bar").unwrap_err(),
            "field label not supported: foo"
        );
        assert_eq!(
            pods("status.phase").unwrap_err(),
            "invalid selector: 'status.phase'; can't understand 'status.phase'"
        );
        assert!(pods("status.phase=a=b").is_err());
        assert!(pods("status.phase = x").is_err());
    }
}
