//! One resource API for every kind the client calls, in the manner of kube-rs's `Api<K>`
//! (`kube-client/src/api/core_methods.rs`), but blocking and over JSON values.
//!
//! A [`Resource`] says where a kind lives (its group version's URL prefix, its plural) and
//! what it is called; [`KubeClient::api`] / [`KubeClient::api_in`] pair one with a
//! namespace, and [`Api`] has the verbs: `get`, `create`, `replace`, `patch`, `delete`,
//! `list`. Building a request is pure (`Api::request`, as kube-core's `Request` builds
//! `http::Request` values): the URL, method, body, content type and the text that names the
//! call in logs and errors ("get lease NAME", "list pods") all come from the resource and
//! the verb. Sending, retrying, authentication and the write fence are the client's.

use std::io::Read;

use serde_json::Value;
use ureq::http::Method;

use super::client::{
    encode_component, Deleted, FieldValidation, KubeClient, ListStats, PageSink, Request, Response,
    MAX_LIST_RESTARTS,
};
use super::error::{ApiStatus, KubeError};
pub use super::resource::{Resource, CONFIG_MAPS, EVENTS, EXECUTOR_SETS, LEASES, PODS};

/// The `Accept` header of a list that may come back in Protobuf (what client-go sends for
/// built-in types since Kubernetes 1.32), JSON the fallback when the server has no Protobuf
/// for the kind (custom resources, simulators).
const ACCEPT_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, application/json;q=0.9";

/// The calls of one [`Resource`] in one namespace, through one [`KubeClient`] (kube-rs's
/// `Api::namespaced`). Cheap to make: one client, with its one TLS agent, token cache and
/// exec-plugin cache, serves every namespace.
#[derive(Debug)]
pub struct Api<'c> {
    client: &'c KubeClient,
    res: &'static Resource,
    ns: String,
}

/// The query of a list (kube-rs's `ListParams`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListParams<'a> {
    /// `labelSelector`, as written (`a=b,c!=d`; percent-encoded when sent); empty: none.
    pub label_selector: &'a str,
    /// `fieldSelector` (e.g. `status.phase=Pending`); `None` or empty: none.
    pub field_selector: Option<&'a str>,
    /// `limit`: objects per page; `None` or 0: one page with everything.
    pub limit: Option<u32>,
}

/// The options of a create (kube-rs's `PostParams`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostParams {
    /// `fieldValidation` (KEP-2885, Kubernetes 1.25+); `None`: not sent, the server's
    /// default applies.
    pub field_validation: Option<FieldValidation>,
}

/// The answer to a create.
#[derive(Clone, Debug, PartialEq)]
pub struct Created {
    /// The object as stored (with `uid`, `resourceVersion`, …).
    pub object: Value,
    /// The texts of the answer's `Warning` headers ([`super::warning_text`]), e.g. an
    /// unknown field under `fieldValidation=Warn`.
    pub warnings: Vec<String>,
}

/// A patch body and its type (kube-rs's `Patch`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Patch<'a> {
    /// `application/strategic-merge-patch+json` (what client-go's event sink sends).
    Strategic(&'a Value),
    /// `application/merge-patch+json` (RFC 7386).
    Merge(&'a Value),
}

/// Preconditions of a delete (metav1 `Preconditions`): the delete only happens to the
/// object with this uid (and resource version); a mismatch is 409 Conflict. An empty field
/// is left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Preconditions<'a> {
    /// `metadata.uid`.
    pub uid: &'a str,
    /// `metadata.resourceVersion`.
    pub resource_version: &'a str,
}

/// One call, before it is a request.
#[derive(Clone, Copy, Debug)]
enum Call<'a> {
    Get(&'a str),
    /// The list's query and the page's `continue` token.
    List(&'a ListParams<'a>, Option<&'a str>),
    Create(&'a Value, &'a PostParams),
    Replace(&'a str, &'a Value),
    /// `PUT …/NAME/status`: the status subresource.
    ReplaceStatus(&'a str, &'a Value),
    Patch(&'a str, Patch<'a>),
    Delete(&'a str, Option<Preconditions<'a>>),
    /// `DELETE` of the collection: every object the selectors match.
    DeleteCollection(&'a ListParams<'a>),
    /// `POST …/pods/NAME/eviction`: a policy/v1 `Eviction` of the pod.
    Evict(&'a str, Option<Preconditions<'a>>),
}

impl Call<'_> {
    /// The HTTP method and the verb's word in logs and errors (kube-apiserver's verbs:
    /// a PUT is `update`).
    fn method(&self) -> (Method, &'static str) {
        match self {
            Call::Get(_) => (Method::GET, "get"),
            Call::List(..) => (Method::GET, "list"),
            Call::Create(..) | Call::Evict(..) => (Method::POST, "create"),
            Call::Replace(..) | Call::ReplaceStatus(..) => (Method::PUT, "update"),
            Call::Patch(..) => (Method::PATCH, "patch"),
            Call::Delete(..) => (Method::DELETE, "delete"),
            Call::DeleteCollection(..) => (Method::DELETE, "deletecollection"),
        }
    }

    /// The object's name: in the URL, or (a create) the body's `metadata.name`, else its
    /// `generateName`; `None` for a list.
    fn name(&self) -> Option<&str> {
        match *self {
            Call::Get(n)
            | Call::Replace(n, _)
            | Call::ReplaceStatus(n, _)
            | Call::Patch(n, _)
            | Call::Delete(n, _)
            | Call::Evict(n, _) => Some(n),
            Call::Create(obj, _) => (obj["metadata"]["name"].as_str())
                .or_else(|| obj["metadata"]["generateName"].as_str()),
            Call::List(..) | Call::DeleteCollection(..) => None,
        }
    }

    /// The query parameters, percent-encoded.
    fn query(&self) -> Vec<String> {
        match *self {
            Call::List(lp, cont) => list_query(lp, cont),
            Call::DeleteCollection(lp) => list_query(&ListParams { limit: None, ..*lp }, None),
            Call::Create(_, p) => (p.field_validation.iter())
                .map(|v| format!("fieldValidation={}", v.as_str()))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The body and its content type.
    fn body(&self) -> (Option<Value>, &'static str) {
        const JSON: &str = "application/json";
        match *self {
            Call::Create(obj, _) | Call::Replace(_, obj) | Call::ReplaceStatus(_, obj) => {
                (Some(obj.clone()), JSON)
            }
            Call::Patch(_, Patch::Strategic(p)) => {
                (Some(p.clone()), "application/strategic-merge-patch+json")
            }
            Call::Patch(_, Patch::Merge(p)) => (Some(p.clone()), "application/merge-patch+json"),
            Call::Delete(_, Some(pre)) => (Some(delete_options(pre)), JSON),
            Call::Evict(name, pre) => (Some(eviction(name, pre)), JSON),
            Call::Get(_) | Call::List(..) | Call::Delete(_, None) | Call::DeleteCollection(_) => {
                (None, JSON)
            }
        }
    }
}

/// The query every page of a list shares: `labelSelector`, `fieldSelector` (left out when
/// empty), `limit` (left out when 0 or `None`), then `continue` when given.
fn list_query(lp: &ListParams<'_>, cont: Option<&str>) -> Vec<String> {
    let mut query = Vec::new();
    if !lp.label_selector.is_empty() {
        let selector = encode_component(lp.label_selector);
        query.push(format!("labelSelector={selector}"));
    }
    if let Some(fs) = lp.field_selector.filter(|f| !f.is_empty()) {
        query.push(format!("fieldSelector={}", encode_component(fs)));
    }
    if let Some(l) = lp.limit.filter(|l| *l > 0) {
        query.push(format!("limit={l}"));
    }
    if let Some(c) = cont {
        query.push(format!("continue={}", encode_component(c)));
    }
    query
}

/// A `DeleteOptions` body with `pre` (empty fields left out).
fn delete_options(pre: Preconditions<'_>) -> Value {
    let mut p = serde_json::Map::new();
    if !pre.uid.is_empty() {
        p.insert("uid".into(), pre.uid.into());
    }
    if !pre.resource_version.is_empty() {
        p.insert("resourceVersion".into(), pre.resource_version.into());
    }
    serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": p})
}

/// The body of an eviction of pod `name` (policy/v1 `Eviction`), with `pre` as its
/// `deleteOptions.preconditions` when given.
fn eviction(name: &str, pre: Option<Preconditions<'_>>) -> Value {
    let mut e = serde_json::json!({"apiVersion": "policy/v1", "kind": "Eviction",
        "metadata": {"name": name}});
    if let Some(pre) = pre {
        e["deleteOptions"] = delete_options(pre);
    }
    e
}

/// What an eviction did ([`Api::evict`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evicted {
    /// The server deleted the pod (201: a budget allowed it, or none covers the pod).
    Evicted,
    /// The pod did not exist (404).
    NotFound,
    /// Not now (429 TooManyRequests): a PodDisruptionBudget allows no disruption now, or
    /// its status is not computed yet. The server's message and causes, one line.
    NotNow(String),
}

impl KubeClient {
    /// The calls of `res` in the client's namespace ([`KubeClient::namespace`]).
    pub fn api(&self, res: &'static Resource) -> Api<'_> {
        self.api_in(self.namespace(), res)
    }

    /// The calls of `res` in namespace `ns` (kube-rs's `Api::namespaced`): one client serves
    /// every namespace, with one TLS agent, one token cache and one exec-plugin run.
    pub fn api_in(&self, ns: &str, res: &'static Resource) -> Api<'_> {
        Api {
            client: self,
            res,
            ns: ns.to_string(),
        }
    }
}

impl<'c> Api<'c> {
    /// The client the calls go through (its write fence, its deadline).
    pub fn client(&self) -> &'c KubeClient {
        self.client
    }
}

impl Api<'_> {
    /// The namespace this calls into.
    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// The request of one call, without sending it (pure). The verb text names the call in
    /// logs and errors: `VERB SINGULAR NAME` (`get lease l`), `create pod` for a create
    /// without a name, `list PLURAL`.
    ///
    /// Errors: [`KubeError::Config`] for an empty name where the URL needs one.
    fn request(&self, call: Call<'_>) -> Result<Request, KubeError> {
        let r = self.res;
        let (method, word) = call.method();
        let name = call.name().unwrap_or("");
        let verb = match call {
            Call::List(..) | Call::DeleteCollection(..) => format!("{word} {}", r.plural),
            _ if name.is_empty() => format!("{word} {}", r.singular),
            Call::ReplaceStatus(..) => format!("{word} {} {name}/status", r.singular),
            Call::Evict(..) => format!("{word} {} {name}/eviction", r.singular),
            _ => format!("{word} {} {name}", r.singular),
        };
        let ns = encode_component(&self.ns);
        let base = self.client.base_url();
        let mut url = format!("{base}/{}/namespaces/{ns}/{}", r.api, r.plural);
        if !matches!(
            call,
            Call::List(..) | Call::Create(..) | Call::DeleteCollection(..)
        ) {
            if name.is_empty() {
                return Err(KubeError::Config(format!(
                    "{verb}: empty {} name",
                    r.singular
                )));
            }
            url = format!("{url}/{}", encode_component(name));
            if matches!(call, Call::ReplaceStatus(..)) {
                url.push_str("/status");
            }
            if matches!(call, Call::Evict(..)) {
                url.push_str("/eviction");
            }
        }
        let query = call.query();
        if !query.is_empty() {
            url = format!("{url}?{}", query.join("&"));
        }
        let (body, content_type) = call.body();
        let body = match body {
            Some(b) => Some(serde_json::to_vec(&b).map_err(|e| KubeError::Decode {
                what: format!("the body of {verb}"),
                message: e.to_string(),
            })?),
            None => None,
        };
        Ok(Request {
            method,
            url,
            body,
            content_type,
            verb,
            op: word,
            res: r,
            accept: "application/json",
            limit: self.client.options().body_limit,
            // An eviction's 429 is a disruption budget's "not now", not throttling: the
            // caller asks again next tick instead of sleeping on it inside the call.
            retry_429: !matches!(call, Call::Evict(..)),
        })
    }

    /// Sends a call; the final response whatever its code (see [`KubeClient::execute`]).
    fn send(&self, call: Call<'_>) -> Result<(Request, Response), KubeError> {
        let req = self.request(call)?;
        let resp = self.client.execute(&req)?;
        Ok((req, resp))
    }

    /// The object a 2xx answer to `call` carries, and the answer's warnings; else the API
    /// error. The object must be of the resource's kind.
    fn object(
        &self,
        call: Call<'_>,
        req: &Request,
        resp: Response,
    ) -> Result<(Value, Vec<String>), KubeError> {
        if !(200..300).contains(&resp.status) {
            return Err(KubeClient::api_error(&req.verb, &resp));
        }
        let what = match call {
            Call::Get(name) => format!("{} {name}", self.res.singular),
            _ => format!("the answer to {}", req.verb),
        };
        let object = self.client.decode_kind(&what, &resp.body, self.res.kind)?;
        Ok((object, resp.warnings))
    }

    /// Sends a write whose answer is the object as stored.
    fn write(&self, call: Call<'_>) -> Result<(Value, Vec<String>), KubeError> {
        let (req, resp) = self.send(call)?;
        self.object(call, &req, resp)
    }

    /// Reads object `name` (`GET …/PLURAL/NAME`); 404 → `Ok(None)` (kube-rs's `get_opt`).
    ///
    /// Errors: [`KubeError::Api`] for other HTTP errors (403 when RBAC lacks get),
    /// `Transport`, `Auth`, `Decode` (an answer that is not JSON of the resource's kind),
    /// `Config` (empty name).
    pub fn get(&self, name: &str) -> Result<Option<Value>, KubeError> {
        let call = Call::Get(name);
        let (req, resp) = self.send(call)?;
        match resp.status {
            404 => Ok(None),
            _ => Ok(Some(self.object(call, &req, resp)?.0)),
        }
    }

    /// Creates `obj` (`POST …/PLURAL`, with `?fieldValidation=` when `p` sets it: under
    /// `Strict` an unknown or duplicate field is a 400 BadRequest, under `Warn` the object
    /// is created and the server's `Warning` headers come back in [`Created::warnings`]; a
    /// server older than 1.25 ignores the parameter).
    ///
    /// Retried on transient failures like every call; a retried create that had in fact
    /// succeeded comes back as 409 `AlreadyExists` ([`KubeError::is_already_exists`]).
    ///
    /// Errors: [`KubeError::Api`] (409 AlreadyExists, 422 Invalid, 403 Forbidden / quota —
    /// see [`KubeError::is_quota`]), `Transport`, `Auth`, `Decode` (then the caller cannot
    /// tell whether the object was made).
    pub fn create(&self, obj: &Value, p: &PostParams) -> Result<Created, KubeError> {
        let (object, warnings) = self.write(Call::Create(obj, p))?;
        Ok(Created { object, warnings })
    }

    /// Replaces object `name` with `obj` (`PUT …/PLURAL/NAME`; kube-apiserver's verb
    /// `update`). With `metadata.resourceVersion` set, the server applies it only to that
    /// version and answers 409 Conflict otherwise (optimistic concurrency). Returns the
    /// object as stored.
    ///
    /// Errors: [`KubeError::Api`] (409 Conflict, 404, 403, 422), `Transport`, `Auth`,
    /// `Decode`, `Config` (empty name).
    pub fn replace(&self, name: &str, obj: &Value) -> Result<Value, KubeError> {
        Ok(self.write(Call::Replace(name, obj))?.0)
    }

    /// Replaces the status of object `name` with `obj`'s (`PUT …/PLURAL/NAME/status`, the
    /// status subresource; kube-apiserver's verb `update` on `PLURAL/status`): the server
    /// keeps the stored `spec`, labels and annotations and takes only `status`. With
    /// `metadata.resourceVersion` set, 409 Conflict unless it is the stored version. Returns
    /// the object as stored.
    ///
    /// Errors: [`KubeError::Api`] (409 Conflict, 404, 403 when RBAC lacks `PLURAL/status`
    /// update, 422), `Transport`, `Auth`, `Decode`, `Config` (empty name).
    pub fn replace_status(&self, name: &str, obj: &Value) -> Result<Value, KubeError> {
        Ok(self.write(Call::ReplaceStatus(name, obj))?.0)
    }

    /// Patches object `name` (`PATCH …/PLURAL/NAME`, the content type of `patch`'s kind).
    /// Returns the object as stored.
    ///
    /// Errors: [`KubeError::Api`] (404 when it is gone, 403 when RBAC lacks patch),
    /// `Transport`, `Auth`, `Decode`, `Config` (empty name).
    pub fn patch(&self, name: &str, patch: Patch<'_>) -> Result<Value, KubeError> {
        Ok(self.write(Call::Patch(name, patch))?.0)
    }

    /// Deletes object `name` (`DELETE …/PLURAL/NAME`, its own grace period), with a
    /// `DeleteOptions` body holding `pre` when given. 2xx → [`Deleted::Deleted`] (a pod may
    /// still be terminating); 404 → [`Deleted::NotFound`].
    ///
    /// Errors: [`KubeError::Api`] (409 when a precondition fails, 403), `Transport`, `Auth`,
    /// `Config` (empty name).
    pub fn delete(&self, name: &str, pre: Option<Preconditions<'_>>) -> Result<Deleted, KubeError> {
        let (req, resp) = self.send(Call::Delete(name, pre))?;
        match resp.status {
            404 => Ok(Deleted::NotFound),
            200..=299 => Ok(Deleted::Deleted),
            _ => Err(KubeClient::api_error(&req.verb, &resp)),
        }
    }

    /// Evicts pod `name` (`POST …/pods/NAME/eviction`, a policy/v1 `Eviction`; RBAC verb
    /// `create` on `pods/eviction`): the server deletes it unless a PodDisruptionBudget
    /// covering it allows no disruption now (kube-apiserver's
    /// `pkg/registry/core/pod/storage/eviction.go`; pending, ended and terminating pods are
    /// deleted whatever the budget). `pre` become the delete's preconditions. A 429 is not
    /// retried inside the call: it is [`Evicted::NotNow`].
    ///
    /// Errors: [`KubeError::Api`] (403 when RBAC lacks `pods/eviction` create, 409 when a
    /// precondition fails, 500 when several budgets cover the pod), `Transport`, `Auth`,
    /// `Config` (empty name).
    pub fn evict(&self, name: &str, pre: Option<Preconditions<'_>>) -> Result<Evicted, KubeError> {
        let (req, resp) = self.send(Call::Evict(name, pre))?;
        match resp.status {
            200..=299 => Ok(Evicted::Evicted),
            404 => Ok(Evicted::NotFound),
            429 => {
                let s = ApiStatus::from_body(resp.status, &resp.body, resp.retry_after);
                let causes: Vec<&str> = (s.causes.iter())
                    .map(|c| c.message.as_str())
                    .filter(|m| !m.is_empty())
                    .collect();
                Ok(Evicted::NotNow(match causes.is_empty() {
                    true => s.message,
                    false => format!("{} ({})", s.message, causes.join("; ")),
                }))
            }
            _ => Err(KubeClient::api_error(&req.verb, &resp)),
        }
    }

    /// Deletes every object `lp`'s selectors match in one request (`DELETE …/PLURAL?
    /// labelSelector=…&fieldSelector=…`, kube-apiserver's verb `deletecollection`; `limit`
    /// is not sent), each with its own grace period. Returns the names of the objects the
    /// server matched: kube-apiserver lists them, deletes each (one already gone counts as
    /// deleted) and answers the list as it read it; an object the selectors did not match
    /// is not in it.
    ///
    /// Errors: [`KubeError::Api`] (403 when RBAC lacks `deletecollection`, 405 where the
    /// resource does not serve it, 400 for a bad selector), `Transport`, `Auth`, `Decode` (an
    /// answer that is not a list).
    pub fn delete_collection(&self, lp: &ListParams<'_>) -> Result<Vec<String>, KubeError> {
        let (req, resp) = self.send(Call::DeleteCollection(lp))?;
        if !(200..300).contains(&resp.status) {
            return Err(KubeClient::api_error(&req.verb, &resp));
        }
        // The answer is one page of a list: read as `list_items` reads its pages.
        let mut sink = ItemsSink {
            what: format!("the answer to {}", req.verb),
            items: Vec::new(),
        };
        sink.page(&resp.body)?;
        Ok((sink.items.iter())
            .filter_map(|i| i["metadata"]["name"].as_str().map(str::to_string))
            .collect())
    }

    /// Lists the objects matching `lp`, page by page with `limit`/`continue`, handing each
    /// page to `sink` as it arrives.
    ///
    /// Each page's body (the `…List` JSON, gzip already decoded) goes to
    /// [`PageSink::page_reader`], capped at [`super::ClientOptions::list_body_limit`] (or the
    /// streamed limit for a [`PageSink::bounded_memory`] sink). On 410 Gone for a continued
    /// page (expired token), the list restarts from the first page after
    /// [`PageSink::restart`], at most [`MAX_LIST_RESTARTS`] times (the Kubernetes API
    /// concepts page, "Retrieving large results sets in chunks").
    ///
    /// Errors: [`KubeError::Api`] (e.g. 400 for a bad selector, 403 RBAC), `Transport`,
    /// `Auth`, `Decode` (a page over the cap, or a server that returns the same continue
    /// token twice), or whatever the sink's `page` returns.
    pub fn list<S: PageSink + ?Sized>(
        &self,
        lp: &ListParams<'_>,
        sink: &mut S,
    ) -> Result<ListStats, KubeError> {
        let mut stats = ListStats::default();
        let mut cont: Option<String> = None;
        let cap = self.client.list_cap(sink.bounded_memory());
        loop {
            let mut req = self.request(Call::List(lp, cont.as_deref()))?;
            req.limit = cap;
            if sink.accepts_protobuf() && self.client.options().protobuf_lists {
                req.accept = ACCEPT_PROTOBUF;
            }
            // The body is decoded by the sink while it arrives; `outcome` is what the sink
            // made of the last attempt that was read to its end.
            let mut outcome = None;
            let resp = self
                .client
                .execute_with(
                    &req,
                    Some(&mut |body: &mut dyn Read| outcome = Some(sink.page_reader(body))),
                )
                .map_err(|e| self.client.over_cap(e, cap))?;
            if resp.status == 410 && cont.is_some() {
                if stats.restarts >= MAX_LIST_RESTARTS {
                    return Err(KubeClient::api_error(&req.verb, &resp));
                }
                stats.restarts += 1;
                log::warn!(
                    "{}: continue token expired (410 Gone); restarting the list from the \
                     first page ({}/{MAX_LIST_RESTARTS})",
                    req.verb,
                    stats.restarts
                );
                sink.restart();
                cont = None;
                continue;
            }
            if !(200..300).contains(&resp.status) {
                return Err(KubeClient::api_error(&req.verb, &resp));
            }
            stats.pages += 1;
            stats.bytes += resp.received;
            let next = match outcome {
                Some(next) => next.map_err(Into::into)?,
                None => sink.page(&resp.body).map_err(Into::into)?,
            };
            match next.filter(|c| !c.is_empty()) {
                None => return Ok(stats),
                Some(c) if cont.as_deref() == Some(c.as_str()) => {
                    return Err(KubeError::Decode {
                        what: format!("{} response", req.verb),
                        message: "the server returned the same continue token twice".to_string(),
                    })
                }
                Some(c) => cont = Some(c),
            }
        }
    }

    /// Lists every matching object and returns their `items` (a convenience over
    /// [`Api::list`] that holds the whole list in memory; kube-rs's `Api::list`).
    ///
    /// Errors: as [`Api::list`]; [`KubeError::Decode`] when a page is not JSON or its
    /// `items` is not an array.
    pub fn list_items(&self, lp: &ListParams<'_>) -> Result<(Vec<Value>, ListStats), KubeError> {
        let mut sink = ItemsSink {
            what: format!("list {} response", self.res.plural),
            items: Vec::new(),
        };
        let stats = self.list(lp, &mut sink)?;
        Ok((sink.items, stats))
    }
}

/// The sink of [`Api::list_items`]: every page's `items`, in order.
struct ItemsSink {
    /// Names the list in errors: `list pods response`.
    what: String,
    items: Vec<Value>,
}

impl PageSink for ItemsSink {
    type Error = KubeError;

    fn restart(&mut self) {
        self.items.clear();
    }

    fn page(&mut self, body: &[u8]) -> Result<Option<String>, KubeError> {
        let bad = |message: String| KubeError::Decode {
            what: self.what.clone(),
            message,
        };
        let mut v: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        let cont = v["metadata"]["continue"].as_str().map(str::to_string);
        match v.get_mut("items").map(Value::take) {
            Some(Value::Array(list)) => self.items.extend(list),
            Some(Value::Null) | None => {}
            Some(_) => return Err(bad("items is not an array".to_string())),
        }
        Ok(cont)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::{ClientOptions, ClusterConfig};

    fn client() -> KubeClient {
        let cfg = ClusterConfig::for_server("http://127.0.0.1:1", "spark");
        KubeClient::with_options(cfg, ClientOptions::default()).unwrap()
    }

    const BASE: &str = "http://127.0.0.1:1";

    /// `r` is a `method` of `BASE` + `path`, logged as `verb`.
    fn assert_call(r: &Request, method: Method, path: &str, verb: &str) {
        assert_eq!(r.method, method);
        assert_eq!(r.url, format!("{BASE}{path}"));
        assert_eq!(r.verb, verb);
    }

    /// A namespace view shares the connection's counters, by verb, resource and code, with
    /// its parent and with derived clients; each call goes to the view's namespace.
    #[test]
    fn namespace_views_and_derived_clients_share_one_set_of_request_counts() {
        use crate::kube::testutil::{FakeServer, Reply};
        let server = FakeServer::http(|req, _| match req.method.as_str() {
            "GET" => Reply::json(404, r#"{"kind":"Status","code":404,"reason":"NotFound"}"#),
            _ => Reply::json(201, r#"{"kind":"ConfigMap","metadata":{"name":"x"}}"#),
        });
        let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
        cfg.allow_insecure_http = true;
        let root = KubeClient::with_options(cfg, ClientOptions::default()).unwrap();
        let view = root.in_namespace("other");
        assert_eq!(view.namespace(), "other");
        assert_eq!(view.api(&PODS).get("p").unwrap(), None);
        let body = serde_json::json!({"metadata": {"name": "x"}});
        let derived = root.derive(ClientOptions::default()).unwrap();
        derived
            .api(&CONFIG_MAPS)
            .create(&body, &PostParams::default())
            .unwrap();
        let paths: Vec<String> = server
            .recorded()
            .iter()
            .map(|r| r.path().to_string())
            .collect();
        assert_eq!(
            paths,
            [
                "/api/v1/namespaces/other/pods/p",
                "/api/v1/namespaces/spark/configmaps"
            ]
        );
        let want = |v, r, c: &str| ((v, r, c.to_string()), 1u64);
        let counts: Vec<_> = root.stats().requests_by.into_iter().collect();
        assert_eq!(
            counts,
            [
                want("create", "configmaps", "201"),
                want("get", "pods", "404")
            ]
        );
        assert_eq!(
            view.stats().requests,
            1,
            "the view and its parent share the stats"
        );
        assert_eq!(root.stats().requests, 1);
        assert_eq!(
            derived.stats().requests,
            1,
            "a derived client has stats of its own"
        );
    }

    #[test]
    fn a_get_names_the_kind_and_the_object() {
        let c = client();
        let r = c.api(&LEASES).request(Call::Get("podalloc-ha")).unwrap();
        assert_call(
            &r,
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/spark/leases/podalloc-ha",
            "get lease podalloc-ha",
        );
        assert_eq!(r.res, &LEASES);
        assert!(r.body.is_none());
    }

    #[test]
    fn another_namespace_and_names_are_percent_encoded() {
        let c = client();
        let r = c
            .api_in("other ns", &CONFIG_MAPS)
            .request(Call::Replace("a b", &serde_json::json!({})))
            .unwrap();
        assert_call(
            &r,
            Method::PUT,
            "/api/v1/namespaces/other%20ns/configmaps/a%20b",
            "update configmap a b",
        );
        assert_eq!(r.body.as_deref(), Some(&b"{}"[..]));
        assert_eq!(r.content_type, "application/json");
    }

    #[test]
    fn a_status_update_goes_to_the_status_subresource_of_its_group() {
        let c = client();
        let body = serde_json::json!({"status": {"replicas": 2}});
        let r = (c.api(&EXECUTOR_SETS))
            .request(Call::ReplaceStatus("etl", &body))
            .unwrap();
        assert_call(
            &r,
            Method::PUT,
            "/apis/podalloc.io/v1alpha1/namespaces/spark/executorsets/etl/status",
            "update executorset etl/status",
        );
        assert_eq!(r.res, &EXECUTOR_SETS);
        assert_eq!(r.body, Some(serde_json::to_vec(&body).unwrap()));
    }

    #[test]
    fn a_create_is_named_from_its_body_and_carries_field_validation() {
        let c = client();
        let pods = c.api(&PODS);
        let p = PostParams {
            field_validation: Some(FieldValidation::Strict),
        };
        let pod = serde_json::json!({"metadata": {"generateName": "app-exec-"}});
        let r = pods.request(Call::Create(&pod, &p)).unwrap();
        assert_call(
            &r,
            Method::POST,
            "/api/v1/namespaces/spark/pods?fieldValidation=Strict",
            "create pod app-exec-",
        );
        let nameless = serde_json::json!({});
        let r = pods.request(Call::Create(&nameless, &PostParams::default()));
        let r = r.unwrap();
        assert_eq!(r.url, format!("{BASE}/api/v1/namespaces/spark/pods"));
        assert_eq!(r.verb, "create pod");
    }

    #[test]
    fn a_list_page_carries_the_selectors_the_limit_and_the_token() {
        let c = client();
        let lp = ListParams {
            label_selector: "a in (x, y),!b",
            field_selector: Some("status.phase=Pending"),
            limit: Some(2),
        };
        let r = c.api(&PODS).request(Call::List(&lp, Some("t/1"))).unwrap();
        assert_eq!(r.verb, "list pods");
        assert_eq!(
            r.url,
            format!(
                "{BASE}/api/v1/namespaces/spark/pods?labelSelector=a%20in%20%28x%2C%20y%29%2C%21b\
                 &fieldSelector=status.phase%3DPending&limit=2&continue=t%2F1"
            )
        );
        let r = c
            .api(&EVENTS)
            .request(Call::List(&ListParams::default(), None));
        assert_eq!(
            r.unwrap().url,
            format!("{BASE}/api/v1/namespaces/spark/events")
        );
    }

    #[test]
    fn patches_say_their_type_and_deletes_carry_preconditions() {
        let c = client();
        let events = c.api(&EVENTS);
        let body = serde_json::json!({"count": 2});
        let r = events.request(Call::Patch("e.1", Patch::Strategic(&body)));
        let r = r.unwrap();
        assert_eq!(
            (r.method, r.verb.as_str()),
            (Method::PATCH, "patch event e.1")
        );
        assert_eq!(r.content_type, "application/strategic-merge-patch+json");
        let r = events
            .request(Call::Patch("e.1", Patch::Merge(&body)))
            .unwrap();
        assert_eq!(r.content_type, "application/merge-patch+json");
        let pre = Preconditions {
            uid: "u1",
            resource_version: "",
        };
        let r = c.api(&PODS).request(Call::Delete("p", Some(pre))).unwrap();
        assert_eq!(r.verb, "delete pod p");
        let body: Value = serde_json::from_slice(r.body.as_deref().unwrap()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"kind": "DeleteOptions", "apiVersion": "v1",
                "preconditions": {"uid": "u1"}})
        );
        let r = c.api(&PODS).request(Call::Delete("p", None)).unwrap();
        assert!(r.body.is_none());
    }

    /// A delete of a collection is `DELETE …/pods?labelSelector=…&fieldSelector=…` (no
    /// limit, no body), counted as `deletecollection`; the answer's items are the names.
    #[test]
    fn a_collection_delete_sends_the_selectors_and_returns_the_names_it_matched() {
        use crate::kube::testutil::{FakeServer, Reply};
        let server = FakeServer::http(|_, _| {
            Reply::json(
                200,
                r#"{"kind":"PodList","items":[{"metadata":{"name":"a-exec-3"}},{"metadata":{"name":"a-exec-4"}}]}"#,
            )
        });
        let mut cfg = ClusterConfig::for_server(&server.url(), "spark");
        cfg.allow_insecure_http = true;
        let c = KubeClient::with_options(cfg, ClientOptions::default()).unwrap();
        let lp = ListParams {
            label_selector: "app=a,id in (3,4)",
            field_selector: Some("status.phase=Pending"),
            limit: Some(500),
        };
        let names = c.api(&PODS).delete_collection(&lp).unwrap();
        assert_eq!(names, ["a-exec-3", "a-exec-4"]);
        let sent = &server.recorded()[0];
        assert_eq!(sent.method, "DELETE");
        assert_eq!(sent.path(), "/api/v1/namespaces/spark/pods");
        assert_eq!(
            sent.query("labelSelector").as_deref(),
            Some("app=a,id in (3,4)")
        );
        assert_eq!(
            sent.query("fieldSelector").as_deref(),
            Some("status.phase=Pending")
        );
        assert_eq!(sent.query("limit"), None);
        assert!(sent.body.is_empty());
        let counts: Vec<_> = c.stats().requests_by.into_iter().collect();
        assert_eq!(
            counts,
            [(("deletecollection", "pods", "200".to_string()), 1)]
        );
    }

    #[test]
    fn an_empty_name_is_refused_before_anything_is_sent() {
        let c = client();
        for call in [Call::Get(""), Call::Delete("", None)] {
            let err = c.api(&PODS).request(call).err().expect("refused");
            assert!(
                matches!(&err, KubeError::Config(m) if m.contains("empty pod name")),
                "{err}"
            );
        }
    }
}
