//! The OpenAPI 3.1 document of the control plane's HTTP API (`GET /v1/openapi.json`), generated:
//! each operation from its handler's `#[utoipa::path]` annotation, each schema from its wire type
//! (`ToSchema` in `sonic-api`), and each route's guard from the route table ([`routes`]): a
//! public route says `security: []`, a guarded one inherits the bearer token and answers 401 and
//! 500 besides its own. The tests check that the document and the table list the same routes.

use sonic_api::agent::ErrorBody;
use sonic_core::planner::Policy;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
use utoipa::{IntoParams, Modify, OpenApi};

use crate::http::api::{self, RouteInfo, routes};

/// The whole document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// A route's path as the document writes it: axum's catch-all `{*key}` is OpenAPI's `{key}`.
pub fn path_of(route: &str) -> String {
    route.replace("{*", "{")
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sonic control plane",
        description = "DAG and agent registry of the Sonic serverless DAG orchestrator. Every \
            route but /v1/health requires `Authorization: Bearer <token>`. Errors are JSON \
            `{\"error\": \"...\"}`."
    ),
    paths(
        api::health,
        api::openapi,
        api::render_metrics,
        api::list_dags,
        api::apply_dag,
        api::get_dag,
        api::delete_dag,
        api::dag_models,
        api::dag_plan,
        api::list_agents,
        api::register_agent,
        api::heartbeat,
        crate::http::reports::report_run,
        api::list_jobs,
        api::submit_job,
        api::get_job,
        api::cancel_job,
        api::retry_job,
        api::delete_job,
        api::get_result,
        api::job_events,
        api::job_logs,
        api::list_secrets,
        api::put_secret,
        api::delete_secret,
    ),
    components(schemas(ErrorBody, sonic_api::control::DagErrorBody)),
    security(("bearer" = [])),
    modifiers(&PostDag, &Guards)
)]
struct ApiDoc;

/// `POST /v1/dags` is `PUT /v1/dags` again (one handler): the same operation, its own id.
struct PostDag;

impl Modify for PostDag {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        if let Some(item) = doc.paths.paths.get_mut("/v1/dags")
            && let Some(mut post) = item.put.clone()
        {
            post.operation_id = Some("postDag".into());
            post.summary = Some("Create or update a DAG file (same as PUT)".into());
            item.post = Some(post);
        }
    }
}

/// Each route's guard, from the route table (and its summary on one line).
struct Guards;

impl Modify for Guards {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let bearer = HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build();
        doc.components
            .get_or_insert_with(Default::default)
            .add_security_scheme("bearer", SecurityScheme::Http(bearer));
        for route in routes() {
            let Some(op) = operation(&mut doc.paths.paths, &route) else {
                continue; // the tests say which
            };
            // A summary is the first paragraph of the handler's doc comment: one line.
            op.summary = op.summary.take().map(|s| s.replace('\n', " "));
            if route.guard.needs_token() {
                op.responses
                    .responses
                    .insert("401".into(), error("missing or wrong token").into());
                op.responses.responses.insert(
                    "500".into(),
                    error("internal error (details in the server log)").into(),
                );
            } else {
                op.security = Some(Vec::new());
            }
        }
    }
}

/// An answer with an [`ErrorBody`].
fn error(description: &str) -> utoipa::openapi::Response {
    let body = ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("ErrorBody")))
        .build();
    ResponseBuilder::new()
        .description(description)
        .content("application/json", body)
        .build()
}

/// The operation of `route` in the document's paths.
fn operation<'a>(
    paths: &'a mut utoipa::openapi::path::PathsMap<String, PathItem>,
    route: &RouteInfo,
) -> Option<&'a mut Operation> {
    let item = paths.get_mut(&path_of(route.path))?;
    match route.method.as_str() {
        "GET" => item.get.as_mut(),
        "PUT" => item.put.as_mut(),
        "POST" => item.post.as_mut(),
        "DELETE" => item.delete.as_mut(),
        "PATCH" => item.patch.as_mut(),
        "HEAD" => item.head.as_mut(),
        "OPTIONS" => item.options.as_mut(),
        _ => None,
    }
}

// The path parameters, described once: the handlers read them as text and check them
// themselves (`checked_dag_name`, `checked_agent_id`, `checked_job_id`).

/// `{name}`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // described, never built
pub(crate) struct DagName {
    /// A DAG's name.
    #[param(pattern = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")]
    name: String,
}

/// `{name}` of a secret.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // described, never built
pub(crate) struct SecretName {
    /// A secret's name.
    #[param(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$")]
    name: String,
}

/// `{id}`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // described, never built
pub(crate) struct Id {
    /// An agent's or a job's id.
    #[param(pattern = "^[A-Za-z0-9._-]{1,64}$")]
    id: String,
}

/// `{run_id}`.
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // described, never built
pub(crate) struct RunId {
    /// The run's id, as the run request named it.
    #[param(max_length = 512)]
    run_id: String,
}

/// `{key}` (axum's `{*key}`: it takes the rest of the path).
#[derive(IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // described, never built
pub(crate) struct ResultKey {
    /// The object's path under `jobs/<id>/result/`, slashes included.
    key: String,
}

/// The policies a plan can be asked for: every one but `oracle`, which plans with measured
/// parameters (`admission::plan_dag` refuses it).
pub(crate) fn plan_policies() -> Object {
    let names: Vec<&str> = Policy::ALL
        .iter()
        .filter(|p| **p != Policy::Oracle)
        .map(|p| p.as_str())
        .collect();
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(names))
        .default(Some(Policy::Sonic.as_str().into()))
        .build()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn json() -> Value {
        serde_json::to_value(document()).expect("document")
    }

    /// Every route of the router is in the document with its guard, and nothing else is.
    #[test]
    fn document_matches_the_route_table() {
        let doc = json();
        let paths = doc["paths"].as_object().expect("paths");
        let table = routes();
        assert_eq!(doc["security"], serde_json::json!([{ "bearer": [] }]));
        for r in &table {
            let method = r.method.as_str().to_ascii_lowercase();
            let op = &paths
                .get(&path_of(r.path))
                .unwrap_or_else(|| panic!("{} missing from the document", r.path))[&method];
            assert!(
                op.is_object(),
                "{method} {} missing from the document",
                r.path
            );
            let public = op["security"].as_array().is_some_and(Vec::is_empty);
            assert_eq!(
                public,
                !r.guard.needs_token(),
                "{method} {}: security does not match the guard",
                r.path
            );
            if r.guard.needs_token() {
                assert!(op.get("security").is_none(), "{method} {}", r.path);
                for status in ["401", "500"] {
                    assert_eq!(
                        op["responses"][status]["content"]["application/json"]["schema"]["$ref"],
                        "#/components/schemas/ErrorBody",
                        "{method} {} lacks {status}",
                        r.path
                    );
                }
            }
            assert!(op["operationId"].is_string());
            let summary = op["summary"].as_str().unwrap_or("\n");
            assert!(!summary.contains('\n'), "{method} {}: {summary:?}", r.path);
            assert!(op["tags"][0].is_string(), "{method} {}", r.path);
        }
        let mut documented = 0;
        for (path, item) in paths {
            for method in item.as_object().expect("path item").keys() {
                documented += 1;
                assert!(
                    table.iter().any(|r| path_of(r.path) == *path
                        && r.method.as_str().eq_ignore_ascii_case(method)),
                    "{method} {path} documented but not routed"
                );
            }
        }
        assert_eq!(documented, table.len());
    }

    #[test]
    fn every_reference_resolves_and_ids_are_unique() {
        let doc = json();
        let mut refs = Vec::new();
        let mut ids = Vec::new();
        fn walk(v: &Value, refs: &mut Vec<String>, ids: &mut Vec<String>) {
            match v {
                Value::Object(m) => {
                    for (k, v) in m {
                        match (k.as_str(), v) {
                            ("$ref", Value::String(s)) => refs.push(s.clone()),
                            ("operationId", Value::String(s)) => ids.push(s.clone()),
                            _ => walk(v, refs, ids),
                        }
                    }
                }
                Value::Array(a) => a.iter().for_each(|v| walk(v, refs, ids)),
                _ => {}
            }
        }
        walk(&doc, &mut refs, &mut ids);
        assert!(!refs.is_empty());
        for r in refs {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("unexpected ref {r}"));
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{r} does not resolve"
            );
        }
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "operationId repeated");
    }

    /// What clients of the old hand-written document relied on.
    #[test]
    fn what_clients_read_is_kept() {
        let doc = json();
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["info"]["title"], "Sonic control plane");
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"],
            serde_json::json!({ "type": "http", "scheme": "bearer" })
        );
        let op = |path: &str, method: &str| doc["paths"][path][method].clone();
        let ids: Vec<(&str, &str, &str, &str)> = vec![
            ("/v1/health", "get", "health", "system"),
            ("/v1/openapi.json", "get", "openapi", "system"),
            ("/metrics", "get", "metrics", "system"),
            ("/v1/dags", "get", "listDags", "dags"),
            ("/v1/dags", "put", "putDag", "dags"),
            ("/v1/dags", "post", "postDag", "dags"),
            ("/v1/dags/{name}", "get", "getDag", "dags"),
            ("/v1/dags/{name}", "delete", "deleteDag", "dags"),
            ("/v1/dags/{name}/models", "get", "getDagModels", "dags"),
            ("/v1/dags/{name}/plan", "get", "getDagPlan", "dags"),
            ("/v1/agents", "get", "listAgents", "agents"),
            ("/v1/agents/register", "post", "registerAgent", "agents"),
            ("/v1/agents/{id}/heartbeat", "post", "heartbeat", "agents"),
            (
                "/v1/agents/{id}/runs/{run_id}/report",
                "post",
                "reportRun",
                "agents",
            ),
            ("/v1/jobs", "get", "listJobs", "jobs"),
            ("/v1/jobs", "post", "submitJob", "jobs"),
            ("/v1/jobs/{id}", "get", "getJob", "jobs"),
            ("/v1/jobs/{id}", "delete", "deleteJob", "jobs"),
            ("/v1/jobs/{id}/cancel", "post", "cancelJob", "jobs"),
            ("/v1/jobs/{id}/retry", "post", "retryJob", "jobs"),
            ("/v1/jobs/{id}/results/{key}", "get", "getJobResult", "jobs"),
            ("/v1/jobs/{id}/events", "get", "getJobEvents", "jobs"),
            ("/v1/jobs/{id}/logs", "get", "getJobLogs", "jobs"),
            ("/v1/secrets", "get", "listSecrets", "secrets"),
            ("/v1/secrets/{name}", "put", "putSecret", "secrets"),
            ("/v1/secrets/{name}", "delete", "deleteSecret", "secrets"),
        ];
        assert_eq!(ids.len(), routes().len());
        for (path, method, id, tag) in ids {
            let op = op(path, method);
            assert_eq!(op["operationId"], id, "{method} {path}");
            assert_eq!(op["tags"], serde_json::json!([tag]), "{method} {path}");
        }
        // The DAG file: YAML (or text), named by ?file=, refused with where and why.
        for method in ["put", "post"] {
            let apply = op("/v1/dags", method);
            let body = &apply["requestBody"];
            assert_eq!(body["required"], true);
            for media in ["application/yaml", "text/plain"] {
                assert_eq!(
                    body["content"][media]["schema"]["type"], "string",
                    "{media}"
                );
            }
            let file = &apply["parameters"][0];
            assert_eq!(file["name"], "file");
            assert_eq!(file["in"], "query");
            assert_eq!(file["schema"]["maxLength"], 256);
            assert_eq!(
                apply["responses"]["400"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/DagErrorBody"
            );
        }
        assert_eq!(
            op("/v1/dags", "post")["summary"],
            "Create or update a DAG file (same as PUT)"
        );
        let error = &doc["components"]["schemas"]["ErrorBody"];
        assert_eq!(error["required"], serde_json::json!(["error"]));
        assert_eq!(error["properties"]["error"]["type"], "string");
        let plan = op("/v1/dags/{name}/plan", "get");
        let policy = plan["parameters"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == "policy"))
            .expect("policy");
        assert_eq!(
            policy["schema"]["enum"],
            serde_json::json!(["sonic", "sonic-mean", "remote", "local", "direct", "memory"])
        );
    }
}
