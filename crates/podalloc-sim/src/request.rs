//! A resource request parsed once from its method and path, as kube-apiserver's
//! `RequestInfoFactory.NewRequestInfo` parses it: `/api/v1/…` or `/apis/GROUP/VERSION/…`,
//! then `namespaces/NS/PLURAL[/NAME[/SUBRESOURCE]]` or `PLURAL[/NAME]`; the verb from the
//! method (GET with a name is `get`, without one `list`; DELETE without a name is
//! `deletecollection`).

use super::resources::{self, Resource, SubResource, Verb};
use super::status::ApiError;

/// What a resource request asks for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestInfo<'a> {
    pub verb: Verb,
    pub res: &'static Resource,
    /// The namespace of a namespaced resource; `None` for a list across all namespaces and
    /// for cluster-scoped resources.
    pub ns: Option<&'a str>,
    /// The object's name; `None` for collection verbs (list, create, deletecollection).
    pub name: Option<&'a str>,
    /// The subresource (`status`, `scale`) of a row that has it.
    pub sub: Option<&'static SubResource>,
}

impl<'a> RequestInfo<'a> {
    /// Parses `segs` (the decoded path segments). Errors: 404 `the server could not find
    /// the requested resource` for a path naming no served resource (or an empty segment,
    /// or a subresource), 405 for a verb the resource does not serve (see
    /// [`Resource::verbs`]).
    pub(crate) fn parse(method: &str, segs: &[&'a str]) -> Result<Self, ApiError> {
        let (group, version, rest) = match segs {
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return Err(ApiError::path_not_found()),
        };
        let (ns, rest) = match rest {
            // `namespaces/NS` alone is the Namespace NS itself.
            ["namespaces", ns, more @ ..] if !more.is_empty() => (Some(*ns), more),
            _ => (None, rest),
        };
        let (plural, name, sub) = match rest {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(*name), None),
            [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
            _ => return Err(ApiError::path_not_found()),
        };
        let res = resources::find(group, version, plural).ok_or_else(ApiError::path_not_found)?;
        let sub = match sub {
            None => None,
            Some(s) => Some(res.subresource(s).ok_or_else(ApiError::path_not_found)?),
        };
        let scoped = match (res.namespaced, ns, name) {
            // A namespaced object needs its namespace (without one, the collection is the
            // list across all namespaces); a cluster-scoped resource has none.
            (true, None, Some(_)) | (false, Some(_), _) => false,
            _ => !ns.is_some_and(str::is_empty) && !name.is_some_and(str::is_empty),
        };
        if !scoped {
            return Err(ApiError::path_not_found());
        }
        let verb = match (method, sub) {
            // A POST to a subresource of an object creates it (`pods/NAME/eviction`).
            ("POST", Some(_)) => Verb::Create,
            _ => verb_of(method, name.is_some()).ok_or_else(ApiError::method_not_allowed)?,
        };
        // Across all namespaces only list is served.
        let all_namespaces = res.namespaced && ns.is_none();
        let served = sub.map_or(res.serves(verb), |s| s.serves(verb));
        if !served || all_namespaces && verb != Verb::List {
            return Err(ApiError::method_not_allowed());
        }
        Ok(RequestInfo {
            verb,
            res,
            ns,
            name,
            sub,
        })
    }

    /// The verb name fault rules, `forbid` and the request log use (`cm-update`,
    /// `es-status-update`).
    pub(crate) fn fault_verb(&self) -> String {
        match self.sub {
            Some(s) => self.res.sub_fault_verb(s, self.verb),
            None => self.res.fault_verb(self.verb),
        }
    }

    /// The resource as RBAC names it: `executorsets/status` for a subresource.
    pub(crate) fn rbac_resource(&self) -> String {
        match self.sub {
            Some(s) => format!("{}/{}", self.res.plural, s.name),
            None => self.res.plural.to_string(),
        }
    }
}

/// The verb of `method` on a named object or on a collection.
fn verb_of(method: &str, named: bool) -> Option<Verb> {
    Some(match (method, named) {
        ("GET", true) => Verb::Get,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Kind;

    fn parse(
        method: &str,
        path: &str,
    ) -> Result<(Verb, Kind, Option<String>, Option<String>), u16> {
        let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        RequestInfo::parse(method, &segs)
            .map(|r| {
                let own = |s: Option<&str>| s.map(str::to_string);
                (r.verb, r.res.id, own(r.ns), own(r.name))
            })
            .map_err(|e| e.code)
    }

    #[test]
    fn paths_name_resources_as_the_table_lists_them() {
        let s = |x: &str| Some(x.to_string());
        assert_eq!(
            parse("GET", "/api/v1/pods"),
            Ok((Verb::List, Kind::Pod, None, None))
        );
        assert_eq!(
            parse("PATCH", "/api/v1/namespaces/a/pods/p"),
            Ok((Verb::Patch, Kind::Pod, s("a"), s("p")))
        );
        assert_eq!(
            parse("DELETE", "/api/v1/namespaces/a/pods"),
            Ok((Verb::DeleteCollection, Kind::Pod, s("a"), None))
        );
        assert_eq!(
            parse("PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/l"),
            Ok((Verb::Update, Kind::Lease, s("a"), s("l")))
        );
        assert_eq!(
            parse("GET", "/api/v1/namespaces/a"),
            Ok((Verb::Get, Kind::Namespace, None, s("a")))
        );
        assert_eq!(
            parse("POST", "/api/v1/namespaces"),
            Ok((Verb::Create, Kind::Namespace, None, None))
        );
    }

    #[test]
    fn unserved_paths_and_verbs_are_refused() {
        // Each case: the status, then the request line.
        for case in [
            "404 GET /api/v1/namespaces/a/secrets",
            "404 GET /api/v1/namespaces/a/pods/p/status",
            "404 GET /apis/podalloc.io/v1alpha1/namespaces/a/executorsets/e/x",
            "405 DELETE /apis/podalloc.io/v1alpha1/namespaces/a/executorsets/e/scale",
            "404 GET /api/v1/namespaces//pods",
            "404 GET /api/v1/pods/p",
            "404 GET /api/v1/namespaces/a/leases/l",
            "404 GET /api/v1/namespaces/a/namespaces",
            "405 PUT /api/v1/namespaces/a/pods/p",
            "405 POST /api/v1/pods",
            "405 PATCH /apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            "405 GET /apis/coordination.k8s.io/v1/namespaces/a/leases",
            "405 DELETE /api/v1/namespaces/a",
        ] {
            let (code, request) = case.split_once(' ').unwrap();
            let (m, p) = request.split_once(' ').unwrap();
            assert_eq!(
                parse(m, p).map(|_| ()),
                Err(code.parse().unwrap()),
                "{m} {p}"
            );
        }
    }

    #[test]
    fn subresources_are_parsed_with_their_verbs() {
        let segs: Vec<&str> = "apis/podalloc.io/v1alpha1/namespaces/a/executorsets/e/scale"
            .split('/')
            .collect();
        let r = RequestInfo::parse("PATCH", &segs).unwrap();
        assert_eq!(
            (r.verb, r.res.id, r.name),
            (Verb::Patch, Kind::ExecutorSet, Some("e"))
        );
        assert_eq!(r.sub.map(|s| s.name), Some("scale"));
        assert_eq!(r.fault_verb(), "es-scale-patch");
        assert_eq!(r.rbac_resource(), "executorsets/scale");
    }

    /// Every verb the table lists (and so discovery advertises) is routed, and no other.
    #[test]
    fn routing_serves_exactly_the_verbs_discovery_lists() {
        for r in crate::resources::RESOURCES {
            let base = match r.group {
                "" => "/api/v1".to_string(),
                g => format!("/apis/{g}/{}", r.version),
            };
            let coll = match r.namespaced {
                true => format!("{base}/namespaces/a/{}", r.plural),
                false => format!("{base}/{}", r.plural),
            };
            for v in Verb::ALL {
                let (method, path) = match v {
                    Verb::List => ("GET", coll.clone()),
                    Verb::Create => ("POST", coll.clone()),
                    Verb::DeleteCollection => ("DELETE", coll.clone()),
                    Verb::Get => ("GET", format!("{coll}/x")),
                    Verb::Update => ("PUT", format!("{coll}/x")),
                    Verb::Patch => ("PATCH", format!("{coll}/x")),
                    Verb::Delete => ("DELETE", format!("{coll}/x")),
                    // A list with `watch=true`: the query decides it, in `api.rs`
                    // (`sim_watch` and `a_watch_is_its_own_verb` test it).
                    Verb::Watch => continue,
                };
                let got = parse(method, &path).map(|(verb, kind, _, _)| (verb, kind));
                let want = match r.serves(v) {
                    true => Ok((v, r.id)),
                    false => Err(405),
                };
                assert_eq!(got, want, "{method} {path}");
            }
        }
    }
}
