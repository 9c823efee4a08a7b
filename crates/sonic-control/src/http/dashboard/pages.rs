//! The dashboard's pages: what each reads from the database and the executor, and the HTML.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use axum::extract::rejection::{FormRejection, PathRejection, QueryRejection};
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use sonic_api::control::{
    AgentInfo, InstanceLog, JobEvent, JobMode, JobStatus, JobSummary, PlanUsed,
};
use sonic_api::plan::Baseline;
use sonic_core::dag::{Dag, Instances};
use sonic_core::dist::nearest_rank;
use sonic_core::planner::{Policy, Predicted};
use sonic_core::regression::Model;

use super::html::{self, esc, page, url};
use super::svg::{self, Bar, EdgeLabel};
use super::{Shared, local_path, over_tls, see_other, session_cookie, signed_in};
use crate::http::api::{
    JobInput, SubmitJob, agent_info, checked_dag_name, checked_job_id, dag_summary, job_view,
};
use crate::http::error::ApiError;
use crate::store::JobRecord;

/// A refusal as a page: the status, and what went wrong in words (internals only in the log).
pub struct PageError(ApiError);

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        PageError(e)
    }
}

impl From<crate::admission::AdmitError> for PageError {
    fn from(e: crate::admission::AdmitError) -> Self {
        PageError(e.into())
    }
}

impl From<crate::store::StoreError> for PageError {
    fn from(e: crate::store::StoreError) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let message = match self.0 {
            ApiError::Internal(detail) => {
                tracing::error!(error = %detail, "dashboard: internal error");
                "internal error (the details are in the control plane's log)".to_owned()
            }
            ApiError::InvalidDag(e) => e.to_string(),
            ApiError::BadRequest(m)
            | ApiError::NotFound(m)
            | ApiError::Conflict(m)
            | ApiError::Unprocessable(m)
            | ApiError::UnsupportedMediaType(m)
            | ApiError::Unavailable(m) => m,
            other => other.status().canonical_reason().unwrap_or("").to_owned(),
        };
        let body = format!(
            "<h1>{} {}</h1><p class=\"error\" role=\"alert\">{}</p><p><a href=\"/\">Back to the overview</a></p>",
            status.as_u16(),
            esc(status.canonical_reason().unwrap_or("")),
            esc(&message)
        );
        (status, Html(page("Error", &body, true))).into_response()
    }
}

type PageResult = Result<Html<String>, PageError>;

fn path_value(p: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    p.map(|Path(v)| v)
        .map_err(|e| ApiError::BadRequest(format!("bad path: {}", e.body_text())))
}

// ---- login ----

#[derive(Debug, Deserialize)]
pub struct LoginQuery {
    next: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
}

fn login_page(next: &str, error: Option<&str>) -> String {
    let mut body = String::from("<h1>Log in</h1>");
    if let Some(e) = error {
        let _ = write!(body, "<p class=\"error\" role=\"alert\">{}</p>", esc(e));
    }
    let _ = write!(
        body,
        "<p>The dashboard opens with the control plane's token.</p>\
         <form method=\"post\" action=\"/login\">\
         <label for=\"token\">Token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required size=\"40\" aria-describedby=\"token-hint\">\
         <p class=\"hint\" id=\"token-hint\">The control plane's <code>SONIC_TOKEN</code>; after <code>ofctl up</code>, the <code>token</code> of <code>~/.config/sonic/config.json</code>. It is kept in a cookie of this site only.</p>\
         <input type=\"hidden\" name=\"next\" value=\"{}\">\
         <button class=\"primary\" type=\"submit\">Log in</button></form>",
        esc(next)
    );
    page("Log in", &body, false)
}

pub async fn login_form(
    State(state): State<Shared>,
    headers: HeaderMap,
    query: Result<Query<LoginQuery>, QueryRejection>,
) -> Response {
    let next = query
        .ok()
        .and_then(|Query(q)| q.next)
        .and_then(|n| local_path(&n).map(str::to_owned))
        .unwrap_or_else(|| "/".to_owned());
    if signed_in(&state, &headers) {
        return see_other(&next);
    }
    Html(login_page(&next, None)).into_response()
}

pub async fn login(
    State(state): State<Shared>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    // Failed logins are counted per client address (one count for all when the server does not
    // know it: an in-process test).
    let client = peer.map(|axum::Extension(axum::extract::ConnectInfo(a))| a.ip());
    let now = std::time::Instant::now();
    if let Some(wait) = state.dashboard.locked_out(client, now) {
        tracing::warn!(client = ?client, "dashboard login refused: too many failed logins");
        let mut r = (
            StatusCode::TOO_MANY_REQUESTS,
            Html(login_page(
                "/",
                Some(&format!(
                    "Too many failed logins from this address: try again in {} s.",
                    wait.as_secs().max(1)
                )),
            )),
        )
            .into_response();
        if let Ok(v) = header::HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return r;
    }
    let Ok(Form(f)) = form else {
        return (
            StatusCode::BAD_REQUEST,
            Html(login_page("/", Some("The form could not be read."))),
        )
            .into_response();
    };
    let next = local_path(&f.next).unwrap_or("/").to_owned();
    let expected = &state.settings.token;
    let token = f.token.trim();
    if !sonic_daemon::secret::matches(token.as_bytes(), expected.as_bytes()) {
        state.dashboard.failed(client, now);
        tracing::warn!(client = ?client, "dashboard login refused: wrong token");
        return (
            StatusCode::UNAUTHORIZED,
            Html(login_page(
                &next,
                Some("That is not the control plane's token."),
            )),
        )
            .into_response();
    }
    state.dashboard.succeeded(client);
    let session = match state.dashboard.sessions.open(now) {
        Ok(id) => id,
        Err(e) => {
            tracing::error!(error = %e, "cannot make a session id");
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Html(login_page(
                    &next,
                    Some("The control plane could not open a session."),
                )),
            )
                .into_response();
        }
    };
    let cookie = session_cookie(Some(&session), over_tls(&state, &headers));
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, next), (header::SET_COOKIE, cookie)],
    )
        .into_response()
}

pub async fn logout(State(state): State<Shared>, headers: HeaderMap) -> Response {
    if let Some(id) = super::cookie(&headers, super::COOKIE) {
        state.dashboard.sessions.close(id);
    }
    let cookie = session_cookie(None, over_tls(&state, &headers));
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/login".to_owned()),
            (header::SET_COOKIE, cookie),
        ],
    )
        .into_response()
}

pub async fn script() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/javascript; charset=utf-8",
        )],
        include_str!("dashboard.js"),
    )
        .into_response()
}

// ---- shared pieces ----

fn job_rows(jobs: &[JobRecord]) -> Vec<Vec<String>> {
    jobs.iter()
        .map(|r| {
            let s = job_view(r.clone());
            let ended = s.status.is_terminal() && s.latency_s > 0.0;
            vec![
                format!("<a href=\"/jobs/{0}\">{0}</a>", esc(&s.job_id)),
                format!("<a href=\"/dags/{}\">{}</a>", url(&s.dag), esc(&s.dag)),
                html::job_status(&s),
                esc(s.mode.as_str()),
                esc(s.policy.as_str()),
                html::bytes(s.input_bytes as f64),
                html::when(r.created_ms),
                if ended {
                    html::secs(s.latency_s)
                } else {
                    "-".into()
                },
                if ended {
                    html::usd(s.cost_usd)
                } else {
                    "-".into()
                },
                // Perf/$ is a succeeded job's: a failed one's latency is not the job's.
                if ended && s.status == JobStatus::Succeeded && s.perf_per_dollar > 0.0 {
                    html::num(s.perf_per_dollar)
                } else {
                    "-".into()
                },
            ]
        })
        .collect()
}

const JOB_HEADERS: [&str; 10] = [
    "Job",
    "DAG",
    "Status",
    "Mode",
    "Policy",
    "Input ",
    "Submitted",
    "Latency ",
    "Cost ",
    "Perf/$ ",
];

/// The DAG page's "predicted against measured" section (issue 36): for its planned jobs that
/// succeeded, newest first, what each plan predicted (the mean, and the p50 and p95 of its
/// latency distribution where the models know one), what the job measured, whether it ended
/// within its plan's p95, and its objective; above, the measured p50 and p95 over those jobs
/// against the plans' own, and how many jobs met their objective.
fn predicted_against_measured(jobs: &[JobRecord]) -> String {
    struct Row {
        id: String,
        input_bytes: u64,
        mean: f64,
        q: Option<sonic_core::planner::Quantiles>,
        slo: Option<sonic_core::planner::SloVerdict>,
        measured: f64,
    }
    let rows: Vec<Row> = jobs
        .iter()
        .filter(|r| r.mode == JobMode::Planned && r.status == JobStatus::Succeeded)
        .filter_map(|r| {
            let s = r.summary.as_ref()?;
            let report = s.plan.as_ref().or(r.plan.as_ref())?.report.as_ref()?;
            Some(Row {
                id: r.id.clone(),
                input_bytes: r.input_bytes,
                mean: report.predicted().latency_s,
                q: report.predicted().latency_quantiles_s,
                slo: report.plan.slo,
                measured: s.latency_s,
            })
        })
        .collect();
    let mut out = String::from("<h2>Planned jobs: predicted against measured</h2>");
    if rows.is_empty() {
        out.push_str("<p>No planned job of this DAG has succeeded yet.</p>");
        return out;
    }
    let mut measured: Vec<f64> = rows.iter().map(|r| r.measured).collect();
    measured.sort_by(f64::total_cmp);
    let with_q: Vec<&Row> = rows.iter().filter(|r| r.q.is_some()).collect();
    let mean_of = |f: &dyn Fn(&sonic_core::planner::Quantiles) -> f64| {
        with_q
            .iter()
            .filter_map(|r| r.q.as_ref().map(f))
            .sum::<f64>()
            / with_q.len() as f64
    };
    let _ = write!(
        out,
        "<p>Over the last {} planned jobs that succeeded: measured p50 {}, p95 {}{}.",
        rows.len(),
        nearest_rank(&measured, 0.5).map_or("-".into(), html::secs),
        nearest_rank(&measured, 0.95).map_or("-".into(), html::secs),
        if rows.len() < 20 {
            " (a p95 of fewer than 20 jobs is their slowest or near it)"
        } else {
            ""
        }
    );
    if !with_q.is_empty() {
        let within = with_q
            .iter()
            .filter(|r| r.q.is_some_and(|q| r.measured <= q.p95))
            .count();
        let _ = write!(
            out,
            " Their plans predicted p50 {} and p95 {} on average; {} of {} ended within their plan's p95.",
            html::secs(mean_of(&|q| q.p50)),
            html::secs(mean_of(&|q| q.p95)),
            within,
            with_q.len()
        );
    }
    let with_slo: Vec<&Row> = rows.iter().filter(|r| r.slo.is_some()).collect();
    if !with_slo.is_empty() {
        let met = with_slo
            .iter()
            .filter(|r| r.slo.is_some_and(|v| r.measured <= v.latency_s))
            .count();
        let _ = write!(
            out,
            " {} of {} jobs with a latency objective ended within it.",
            met,
            with_slo.len()
        );
    }
    out.push_str("</p>");
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                format!("<a href=\"/jobs/{0}\">{0}</a>", esc(&r.id)),
                html::bytes(r.input_bytes as f64),
                html::secs(r.mean),
                r.q.map_or("-".into(), |q| html::secs(q.p50)),
                r.q.map_or("-".into(), |q| html::secs(q.p95)),
                html::secs(r.measured),
                r.q.map_or("-".into(), |q| {
                    html::flag(r.measured <= q.p95, "within", "over")
                }),
                r.slo.map_or("-".into(), |v| {
                    format!(
                        "p{} &le; {}: {}",
                        v.percentile,
                        html::secs(v.latency_s),
                        html::flag(r.measured <= v.latency_s, "met", "missed")
                    )
                }),
            ]
        })
        .collect();
    out.push_str(&html::table(
        "Each planned job's prediction and what it measured",
        &[
            "Job",
            "Input ",
            "Predicted mean ",
            "Predicted p50 ",
            "Predicted p95 ",
            "Measured ",
            "Against p95",
            "Objective",
        ],
        &cells,
    ));
    out
}

fn decode_dag(parsed: Value) -> Result<Dag, ApiError> {
    serde_json::from_value(parsed)
        .map_err(|e| ApiError::Internal(format!("stored dag does not decode: {e}")))
}

/// How many instances each function runs, when the file says: `× 3`, `× params.trees`
/// (nothing for one, or when it follows its incoming edge).
fn instances_notes(dag: &Dag) -> Vec<String> {
    dag.functions
        .iter()
        .map(|f| match &f.instances {
            Instances::Fixed(1) | Instances::Follow => String::new(),
            Instances::Fixed(n) => format!("× {n}"),
            Instances::Param(p) => format!("× params.{p}"),
        })
        .collect()
}

fn kind_name(k: sonic_core::dag::EdgeKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

// ---- overview ----

pub async fn index(State(state): State<Shared>) -> PageResult {
    let now = state.clock.now_ms();
    let timeout = state.settings.heartbeat_timeout;
    let (dags, jobs, agents) = state
        .db
        .run(|db| Ok((db.list_dags()?, db.list_jobs(None, 10)?, db.list_agents()?)))
        .await?;
    let alive = agents.iter().filter(|a| a.alive(now, timeout)).count();
    let running = state.jobs.as_ref().map_or(0, |rt| rt.progress().len());
    let mut body = String::from("<h1>Overview</h1><div class=\"cards\">");
    for (n, what, href) in [
        (dags.len(), "DAGs", "/dags"),
        (running, "jobs running", "/jobs?status=running"),
        (alive, "agents alive", "/agents"),
    ] {
        let _ = write!(
            body,
            "<a class=\"card\" href=\"{href}\"><b>{n}</b>{what}</a>"
        );
    }
    if agents.len() > alive {
        let _ = write!(
            body,
            "<a class=\"card\" href=\"/agents\"><b>{}</b>agents not answering</a>",
            agents.len() - alive
        );
    }
    body.push_str("</div>");
    if state.jobs.is_none() {
        body.push_str(
            "<p class=\"error\">This control plane runs no jobs: it has no object store.</p>",
        );
    }
    body.push_str("<h2>DAGs</h2>");
    body.push_str(&dag_table(&dags));
    body.push_str("<h2>Recent jobs</h2>");
    body.push_str(&html::table("", &JOB_HEADERS, &job_rows(&jobs)));
    body.push_str("<p><a href=\"/jobs\">Every job, with filters</a></p>");
    Ok(Html(page("Overview", &body, true)))
}

fn dag_table(dags: &[crate::store::DagRecord]) -> String {
    let rows: Vec<Vec<String>> = dags
        .iter()
        .map(|r| {
            let s = dag_summary(r);
            vec![
                format!("<a href=\"/dags/{}\">{}</a>", url(&s.name), esc(&s.name)),
                esc(&s.functions.join(" → ")),
                s.edges.to_string(),
                s.revision.to_string(),
                html::when(s.updated_at_ms),
                format!("<span class=\"muted\">{}</span>", esc(&s.description)),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "<p>No DAG yet: <code>ofctl apply -f dag.yaml</code>.</p>".into();
    }
    html::table(
        "",
        &[
            "DAG",
            "Functions",
            "Edges ",
            "Revision ",
            "Updated",
            "Description",
        ],
        &rows,
    )
}

pub async fn dags(State(state): State<Shared>) -> PageResult {
    let dags = state.db.run(|db| db.list_dags()).await?;
    let body = format!("<h1>DAGs</h1>{}", dag_table(&dags));
    Ok(Html(page("DAGs", &body, true)))
}

// ---- one DAG ----

/// A model's parameter, how it reads, its unit.
fn models_of(
    dag: &Dag,
    m: &sonic_core::regression::DagModels,
) -> Vec<(String, &'static str, Model)> {
    let mut out = Vec::new();
    for f in &dag.functions {
        if let Some(fm) = m.functions.get(&f.name) {
            out.push((format!("{}.memory_mb", f.name), "MB", fm.memory_mb.clone()));
            out.push((format!("{}.cold_s", f.name), "s", fm.cold_s.clone()));
            out.push((format!("{}.hot_s", f.name), "s", fm.hot_s.clone()));
            out.push((
                format!("{}.instances", f.name),
                "instances",
                fm.instances.clone(),
            ));
        }
    }
    for e in &m.edges {
        out.push((
            format!("{}->{}.bytes", e.from, e.to),
            "bytes",
            e.bytes.clone(),
        ));
    }
    out
}

pub async fn dag(
    State(state): State<Shared>,
    name: Result<Path<String>, PathRejection>,
) -> PageResult {
    let name = checked_dag_name(path_value(name)?)?;
    Ok(Html(dag_page(&state, &name, None).await?))
}

async fn dag_page(state: &Shared, name: &str, error: Option<&str>) -> Result<String, PageError> {
    let rule = state.convergence();
    let lookup = name.to_owned();
    let found = state
        .db
        .run(move |db| {
            let Some(record) = db.get_dag(&lookup)? else {
                return Ok(None);
            };
            // The newest 200 for the predicted-against-measured section; the 20 newest listed.
            let jobs = db.list_jobs(Some(&lookup), 200)?;
            Ok(Some((record, jobs)))
        })
        .await?;
    let (record, jobs) = found.ok_or_else(|| ApiError::NotFound(format!("no dag named {name}")))?;
    let dag = decode_dag(record.parsed.clone())?;
    let for_models = dag.clone();
    let now = state.clock.now_ms();
    let (models, mode) = state
        .db
        .run(move |db| {
            // The default parameters' setting (what a run without overrides uses).
            let setting = crate::learn::default_setting(&for_models);
            let models = crate::learn::current(db, &for_models, &setting, rule)?;
            let mode = crate::learn::mode_of(db, &for_models.name, &setting, &models, now)?;
            Ok((models, mode))
        })
        .await?;
    let mode = crate::learn::mode_view(&mode, &models);
    let summary = dag_summary(&record);
    let mut body = String::new();
    let _ = write!(body, "<h1>DAG {}</h1>", esc(name));
    if let Some(e) = error {
        let _ = write!(
            body,
            "<p class=\"error\" role=\"alert\">The job was not started: {}</p>",
            esc(e)
        );
    }
    let _ = write!(
        body,
        "<dl class=\"facts\"><dt>Description</dt><dd>{}</dd><dt>Revision</dt><dd>{}</dd><dt>Updated</dt><dd>{}</dd><dt>Models</dt><dd>{} ({} jobs learned)</dd></dl>",
        esc(if summary.description.is_empty() {
            "-"
        } else {
            &summary.description
        }),
        summary.revision,
        html::when(summary.updated_at_ms),
        html::flag(models.converged(), "converged", "not converged"),
        models.jobs
    );

    // The run form: an input uploaded, generated or named in the store, and one field per
    // declared parameter (its default filled in).
    let mut param_fields = String::new();
    for (k, v) in &dag.params {
        let shown = match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let _ = write!(
            param_fields,
            "<label for=\"param-{k}\">{} <span class=\"muted\">(parameter)</span></label>\
             <input id=\"param-{k}\" name=\"param.{k}\" type=\"text\" size=\"20\" value=\"{}\">",
            esc(k),
            esc(&shown),
            k = esc(k)
        );
    }
    let _ = write!(
        body,
        "<form method=\"post\" action=\"/dags/{}/run\" id=\"run-form\" enctype=\"multipart/form-data\"><fieldset><legend>Run a job</legend>\
         <label for=\"policy\">Policy</label>\
         <select id=\"policy\" name=\"policy\" aria-describedby=\"policy-hint\">\
         <option value=\"\">automatic</option><option value=\"remote\">remote</option><option value=\"direct\">direct</option><option value=\"local\">local</option><option value=\"sonic\">sonic</option></select>\
         <p class=\"hint\" id=\"policy-hint\">Automatic: profiling with <code>remote</code> until the models converge, then planned (<code>sonic</code>).</p>\
         <label for=\"input_file\">Input file</label>\
         <input id=\"input_file\" name=\"input_file\" type=\"file\" aria-describedby=\"file-hint\">\
         <p class=\"hint\" id=\"file-hint\">Uploaded as the job's input (at most 64 MiB), under its own name.</p>\
         <label for=\"input_bytes\">Or a generated input (bytes)</label>\
         <input id=\"input_bytes\" name=\"input_bytes\" type=\"number\" min=\"0\" max=\"67108864\" step=\"1\" value=\"100000\" aria-describedby=\"input-hint\">\
         <p class=\"hint\" id=\"input-hint\">Used when no file is chosen and no store key given (0: no input).</p>\
         <label for=\"key\">Or an object of the store (key)</label>\
         <input id=\"key\" name=\"key\" type=\"text\" size=\"40\" placeholder=\"inputs/records.bin\">\
         {param_fields}\
         <div><button class=\"primary\" type=\"submit\" id=\"run\">Run</button></div></fieldset></form>",
        url(name)
    );

    // The graph.
    body.push_str("<h2>Graph</h2>");
    let labels: Vec<EdgeLabel> = dag
        .edges
        .iter()
        .map(|e| EdgeLabel {
            text: kind_name(e.kind),
            method: None,
        })
        .collect();
    let notes = instances_notes(&dag);
    let _ = write!(
        body,
        "<figure>{}<figcaption>Functions top to bottom; each arrow is an edge, labelled with its kind.</figcaption></figure>",
        svg::dag_graph("dag", &dag, &labels, &notes, &[])
    );
    let rows: Vec<Vec<String>> = dag
        .edges
        .iter()
        .map(|e| {
            vec![
                esc(&dag.functions[e.from].name),
                esc(&dag.functions[e.to].name),
                esc(&kind_name(e.kind)),
            ]
        })
        .collect();
    body.push_str(&html::table("Edges", &["From", "To", "Kind"], &rows));

    // The models.
    let _ = write!(
        body,
        "<h2>Models</h2><p>Each parameter is a polynomial in the input size <var>x</var> (bytes), fitted to one sample per job that succeeded; \
         a model converges with at least {} samples and a cross-validated error under {}. The DAG's models are {}. \
         Jobs without a forced policy run <strong>{}</strong>: {}.</p>",
        rule.min_samples,
        html::pct(rule.max_mape),
        if models.converged() {
            "converged"
        } else {
            "not converged"
        },
        mode.mode,
        esc(&mode.reason)
    );
    let all = models_of(&dag, &models);
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|(p, _, m)| {
            let fit = m.fit.as_ref();
            vec![
                esc(p),
                html::flag(m.converged(&rule), "converged", "not converged"),
                m.samples.len().to_string(),
                fit.map_or("-".into(), |f| f.degree.to_string()),
                fit.map_or("-".into(), |f| html::pct(f.cv_mape)),
                fit.map_or("-".into(), |f| format!("<code>{}</code>", esc(&f.equation))),
            ]
        })
        .collect();
    body.push_str(&html::table(
        "",
        &[
            "Parameter",
            "State",
            "Samples ",
            "Degree ",
            "CV error ",
            "Equation",
        ],
        &rows,
    ));
    body.push_str("<div class=\"charts\">");
    for (k, (p, unit, m)) in all.iter().enumerate() {
        if m.samples.is_empty() {
            continue;
        }
        let chart = svg::model_chart(&format!("model-{k}"), p, unit, &m.samples, &|x| {
            m.predict(x)
        });
        let caption = match &m.fit {
            Some(f) => format!(
                "<b>{}</b>: <code>{}</code>, CV error {}, {}",
                esc(p),
                esc(&f.equation),
                html::pct(f.cv_mape),
                html::flag(m.converged(&rule), "converged", "not converged")
            ),
            None => format!("<b>{}</b>: no fit yet", esc(p)),
        };
        let _ = write!(
            body,
            "<figure>{chart}<figcaption>{caption}</figcaption></figure>"
        );
    }
    body.push_str("</div>");
    if models.jobs == 0 {
        body.push_str("<p>Nothing learned yet: run a job.</p>");
    }

    body.push_str(&predicted_against_measured(&jobs));

    body.push_str("<h2>Recent jobs</h2>");
    let recent = &jobs[..jobs.len().min(20)];
    body.push_str(&html::table("", &JOB_HEADERS, &job_rows(recent)));
    let _ = write!(
        body,
        "<p><a href=\"/jobs?dag={}\">Every job of {}</a></p>",
        url(name),
        esc(name)
    );
    let _ = write!(
        body,
        "<details><summary>The DAG file</summary><pre>{}</pre></details>",
        esc(&record.yaml)
    );
    Ok(page(&format!("DAG {name}"), &body, true))
}

/// The run form as posted: multipart (with an uploaded file) or URL-encoded.
#[derive(Debug, Default, Deserialize)]
pub struct RunForm {
    #[serde(default)]
    policy: String,
    #[serde(default)]
    input_bytes: String,
    #[serde(default)]
    key: String,
    /// `key=value` lines (scripts posting the form; the page has a field per parameter).
    #[serde(default)]
    params: String,
    /// `param.NAME` fields, by name.
    #[serde(skip)]
    param_fields: BTreeMap<String, String>,
    /// An uploaded input: its file name and bytes.
    #[serde(skip)]
    file: Option<(String, Vec<u8>)>,
}

/// The most bytes of an uploaded input.
pub const MAX_UPLOAD: usize = 64 * 1024 * 1024;

impl RunForm {
    /// The form from a multipart body (the page's) or a URL-encoded one.
    async fn read(request: axum::extract::Request) -> Result<RunForm, ApiError> {
        use axum::extract::FromRequest;
        let multipart = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("multipart/form-data"));
        if !multipart {
            let Form(mut f): Form<RunForm> = Form::from_request(request, &())
                .await
                .map_err(|e: FormRejection| ApiError::BadRequest(e.body_text()))?;
            f.param_fields.clear();
            return Ok(f);
        }
        let mut m = axum::extract::Multipart::from_request(request, &())
            .await
            .map_err(|e| ApiError::BadRequest(e.body_text()))?;
        let bad = |e: axum::extract::multipart::MultipartError| {
            ApiError::BadRequest(format!("the form: {}", e.body_text()))
        };
        let mut f = RunForm::default();
        while let Some(field) = m.next_field().await.map_err(bad)? {
            let name = field.name().unwrap_or_default().to_owned();
            if name == "input_file" {
                let file_name = field.file_name().unwrap_or_default().to_owned();
                let bytes = field.bytes().await.map_err(bad)?;
                // A file field left empty is sent with no name and no bytes.
                if !file_name.is_empty() || !bytes.is_empty() {
                    if bytes.len() > MAX_UPLOAD {
                        return Err(ApiError::BadRequest(format!(
                            "an uploaded input is at most {MAX_UPLOAD} bytes"
                        )));
                    }
                    f.file = Some((file_name, bytes.to_vec()));
                }
                continue;
            }
            let text = field.text().await.map_err(bad)?;
            match name.as_str() {
                "policy" => f.policy = text,
                "input_bytes" => f.input_bytes = text,
                "key" => f.key = text,
                "params" => f.params = text,
                other => {
                    if let Some(p) = other.strip_prefix("param.") {
                        f.param_fields.insert(p.to_owned(), text);
                    }
                }
            }
        }
        Ok(f)
    }
}

/// A file name a job input can have: the uploaded one's last part, made safe.
fn upload_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or("");
    let safe: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    let safe = safe.trim_start_matches('.').to_owned();
    if safe.is_empty() {
        "input.bin".into()
    } else {
        safe
    }
}

/// The most bytes of generated input the run form makes.
const MAX_GENERATED: u64 = 64 * 1024 * 1024;

fn parse_params(text: &str) -> Result<serde_json::Map<String, Value>, String> {
    let mut out = serde_json::Map::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("parameter {line:?} is not key=value"))?;
        let v = v.trim();
        let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned()));
        out.insert(k.trim().to_owned(), value);
    }
    Ok(out)
}

pub async fn run(
    State(state): State<Shared>,
    name: Result<Path<String>, PathRejection>,
    request: axum::extract::Request,
) -> Result<Response, PageError> {
    let name = checked_dag_name(path_value(name)?)?;
    let f = RunForm::read(request).await?;
    let refuse = |why: String| ApiError::BadRequest(why);
    let submitted = async {
        let mut params = parse_params(&f.params).map_err(refuse)?;
        // A field per declared parameter: only what differs from the DAG's default is an
        // override (an unchanged field keeps the job in the default setting).
        let defaults = match state.db.parsed_dag(&name).await {
            Ok(Some(p)) => p.dag.params.clone(),
            _ => BTreeMap::new(),
        };
        for (k, text) in &f.param_fields {
            let text = text.trim();
            let value =
                serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()));
            if defaults.get(k) != Some(&value) {
                params.insert(k.clone(), value);
            }
        }
        let key = f.key.trim();
        let size = f.input_bytes.trim();
        let size: u64 = if size.is_empty() {
            0
        } else {
            size.parse()
                .map_err(|_| refuse(format!("input size {size:?} is not a number of bytes")))?
        };
        if size > MAX_GENERATED {
            return Err(refuse(format!(
                "a generated input is at most {MAX_GENERATED} bytes"
            )));
        }
        let input = if let Some((file_name, data)) = &f.file {
            Some(JobInput {
                name: Some(upload_name(file_name)),
                base64: Some(crate::exec::requests::encode_base64(data)),
                key: None,
            })
        } else if !key.is_empty() {
            Some(JobInput {
                name: None,
                base64: None,
                key: Some(key.to_owned()),
            })
        } else if size > 0 {
            let data: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
            Some(JobInput {
                name: Some("input.bin".into()),
                base64: Some(crate::exec::requests::encode_base64(&data)),
                key: None,
            })
        } else {
            None
        };
        // The form's policy, read as the API reads it: a name that is none refuses the run.
        let policy = match f.policy.trim() {
            "" => None,
            name => Some(
                name.parse::<sonic_core::planner::Policy>()
                    .map_err(refuse)?,
            ),
        };
        crate::admission::submit(
            &state.ctx,
            SubmitJob {
                revision: None,
                dag: name.clone(),
                input,
                params,
                policy,
                planned: false,
                slo: None,
                slo_best_effort: false,
            },
        )
        .await
        .map_err(ApiError::from)
    }
    .await;
    match submitted {
        Ok(accepted) => {
            tracing::info!(job = %accepted.job_id, dag = %name, "job started from the dashboard");
            Ok(see_other(&format!("/jobs/{}", url(&accepted.job_id))))
        }
        Err(e @ ApiError::Internal(_)) | Err(e @ ApiError::NotFound(_)) => Err(e.into()),
        Err(e) => {
            let status = e.status();
            let message = PageError(e).message();
            let page = dag_page(&state, &name, Some(&message)).await?;
            Ok((status, Html(page)).into_response())
        }
    }
}

impl PageError {
    /// What a person is told (internals only in the log).
    fn message(&self) -> String {
        match &self.0 {
            ApiError::BadRequest(m)
            | ApiError::NotFound(m)
            | ApiError::Conflict(m)
            | ApiError::Unprocessable(m)
            | ApiError::UnsupportedMediaType(m)
            | ApiError::Unavailable(m) => m.clone(),
            other => other.status().canonical_reason().unwrap_or("").to_owned(),
        }
    }
}

// ---- jobs ----

#[derive(Debug, Deserialize)]
pub struct JobsQuery {
    dag: Option<String>,
    status: Option<String>,
    policy: Option<String>,
    limit: Option<u32>,
}

fn select(id: &str, label: &str, options: &[String], chosen: &str) -> String {
    let mut out = format!(
        "<div><label for=\"{id}\">{label}</label><select id=\"{id}\" name=\"{id}\"><option value=\"\">any</option>"
    );
    for o in options {
        let sel = if o == chosen { " selected" } else { "" };
        let _ = write!(out, "<option{sel}>{}</option>", esc(o));
    }
    out.push_str("</select></div>");
    out
}

pub async fn jobs(
    State(state): State<Shared>,
    query: Result<Query<JobsQuery>, QueryRejection>,
) -> PageResult {
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let dag = q
        .dag
        .filter(|d| !d.is_empty())
        .map(checked_dag_name)
        .transpose()?;
    let status: Option<JobStatus> = q
        .status
        .filter(|s| !s.is_empty())
        .map(|s| s.parse())
        .transpose()
        .map_err(|e: sonic_api::control::UnknownName| ApiError::BadRequest(e.to_string()))?;
    let policy = q.policy.filter(|p| !p.is_empty());
    let limit = q.limit.unwrap_or(50).clamp(1, 500) as usize;
    let lookup = dag.clone();
    let (all, dags) = state
        .db
        .run(move |db| Ok((db.list_jobs(lookup.as_deref(), 1000)?, db.list_dags()?)))
        .await?;
    let shown: Vec<JobRecord> = all
        .into_iter()
        .filter(|j| status.is_none_or(|s| j.status == s))
        .filter(|j| policy.as_deref().is_none_or(|p| j.policy.as_str() == p))
        .take(limit)
        .collect();
    let names: Vec<String> = dags.iter().map(|d| d.name.clone()).collect();
    let statuses: Vec<String> = ["queued", "running", "succeeded", "failed"]
        .map(String::from)
        .to_vec();
    let policies: Vec<String> = sonic_core::planner::Policy::ALL
        .map(|p| p.as_str().to_owned())
        .to_vec();
    let mut body = String::from("<h1>Jobs</h1>");
    let _ = write!(
        body,
        "<form method=\"get\" action=\"/jobs\" class=\"cards\" aria-label=\"Filters\">{}{}{}\
         <div><label for=\"limit\">At most</label><input id=\"limit\" name=\"limit\" type=\"number\" min=\"1\" max=\"500\" value=\"{limit}\"></div>\
         <div><button class=\"primary\" type=\"submit\">Filter</button></div></form>",
        select("dag", "DAG", &names, dag.as_deref().unwrap_or("")),
        select(
            "status",
            "Status",
            &statuses,
            status.map_or("", JobStatus::as_str)
        ),
        select(
            "policy",
            "Policy",
            &policies,
            policy.as_deref().unwrap_or("")
        ),
    );
    if shown.is_empty() {
        body.push_str("<p>No job matches.</p>");
    } else {
        body.push_str(&html::table(
            &format!("{} jobs, newest first", shown.len()),
            &JOB_HEADERS,
            &job_rows(&shown),
        ));
    }
    Ok(Html(page("Jobs", &body, true)))
}

/// Everything a job's page shows.
/// Where each function of the job stands: a succeeded job's all done; a failed one's failing
/// function failed, those with instances that succeeded done, the rest never run; a running
/// one's current stage running.
fn node_states(dag: &Dag, v: &JobView) -> Vec<svg::NodeState> {
    use svg::NodeState;
    let s = &v.summary;
    let failing = (s.status == JobStatus::Failed)
        .then(|| s.failed_attempts.last().map(|f| f.name.as_str()))
        .flatten();
    let live: Vec<&str> = v
        .live
        .as_ref()
        .and_then(|e| e.stage.as_deref())
        .map(|st| st.split(',').map(str::trim).collect())
        .unwrap_or_default();
    dag.functions
        .iter()
        .map(|f| {
            let name = f.name.as_str();
            if s.status == JobStatus::Succeeded {
                NodeState::Done
            } else if failing == Some(name) {
                NodeState::Failed
            } else if !s.status.is_terminal() && live.contains(&name) {
                NodeState::Running
            } else if s.functions.iter().any(|r| r.name == name) {
                NodeState::Done
            } else {
                NodeState::Pending
            }
        })
        .collect()
}

/// Past this many instances a job's page lists them per function, the instances themselves
/// folded away.
const LONG_JOB: usize = 24;

struct JobView {
    record: JobRecord,
    summary: JobSummary,
    dag: Option<Dag>,
    logs: Vec<InstanceLog>,
    live: Option<JobEvent>,
}

async fn load_job(state: &Shared, id: String) -> Result<JobView, PageError> {
    let lookup = id.clone();
    let found = state
        .db
        .run(move |db| {
            let Some(record) = db.get_job(&lookup)? else {
                return Ok(None);
            };
            let dag = db.get_dag(&record.dag)?;
            let logs = db.logs(&lookup, None)?;
            Ok(Some((record, dag, logs)))
        })
        .await?;
    let (record, dag, logs) = found.ok_or_else(|| ApiError::NotFound(format!("no job {id}")))?;
    let dag = dag.and_then(|d| serde_json::from_value::<Dag>(d.parsed).ok());
    let live = state
        .jobs
        .as_ref()
        .and_then(|rt| rt.subscribe(&id))
        .map(|rx| rx.borrow().clone());
    Ok(JobView {
        summary: job_view(record.clone()),
        record,
        dag,
        logs,
        live,
    })
}

pub async fn job(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> PageResult {
    let id = checked_job_id(path_value(id)?)?;
    let v = load_job(&state, id.clone()).await?;
    let body = format!(
        "<h1>Job {}</h1><div id=\"job\" data-job=\"{}\" data-status=\"{}\">{}</div>",
        esc(&id),
        esc(&id),
        v.summary.status.as_str(),
        job_body(&v)
    );
    Ok(Html(page(&format!("Job {id}"), &body, true)))
}

/// The part of a job's page its script reloads when the job moves on.
pub async fn job_live(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> PageResult {
    let id = checked_job_id(path_value(id)?)?;
    let v = load_job(&state, id).await?;
    Ok(Html(job_body(&v)))
}

pub async fn cancel(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, PageError> {
    let id = checked_job_id(path_value(id)?)?;
    crate::admission::cancel(&state, id.clone()).await?;
    Ok(see_other(&format!("/jobs/{}", url(&id))))
}

/// A result of a succeeded job, downloaded (the API's `GET /v1/jobs/{id}/results/{key}`,
/// opened by the session), as an attachment named after the file.
pub async fn result(
    state: State<Shared>,
    params: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, PageError> {
    let name = params
        .as_ref()
        .ok()
        .and_then(|Path((_, key))| key.rsplit('/').next())
        .map(|n| {
            n.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "._-".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect::<String>()
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "result".into());
    let mut response = crate::http::api::get_result(state, params).await?;
    if let Ok(v) = axum::http::HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        response
            .headers_mut()
            .insert(axum::http::header::CONTENT_DISPOSITION, v);
    }
    Ok(response)
}

/// The job page's retry button: the failed job runs again, reusing what succeeded.
pub async fn retry(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, PageError> {
    let id = checked_job_id(path_value(id)?)?;
    crate::admission::retry(&state.ctx, id.clone()).await?;
    Ok(see_other(&format!("/jobs/{}", url(&id))))
}

/// The job page's delete button: the ended job goes, with its results; back to the jobs.
pub async fn delete_job(
    State(state): State<Shared>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, PageError> {
    let id = checked_job_id(path_value(id)?)?;
    crate::admission::delete_job(&state.ctx, id).await?;
    Ok(see_other("/jobs"))
}

fn job_body(v: &JobView) -> String {
    let s = &v.summary;
    let r = &v.record;
    let ended = s.status.is_terminal();
    let mut out = String::new();
    let _ = write!(
        out,
        "<dl class=\"facts\"><dt>Status</dt><dd id=\"job-status\">{}</dd><dt>DAG</dt><dd><a href=\"/dags/{}\">{}</a></dd>\
         <dt>Policy</dt><dd>{} ({})</dd><dt>Input</dt><dd>{}</dd><dt>Submitted</dt><dd>{}</dd>",
        html::job_status(s),
        url(&s.dag),
        esc(&s.dag),
        esc(s.policy.as_str()),
        esc(s.mode.as_str()),
        html::bytes(s.input_bytes as f64),
        html::when(r.created_ms)
    );
    if let Some(t) = r.started_ms {
        let _ = write!(out, "<dt>Started</dt><dd>{}</dd>", html::when(t));
    }
    if let Some(t) = r.finished_ms {
        let _ = write!(out, "<dt>Ended</dt><dd>{}</dd>", html::when(t));
    }
    if ended && s.latency_s > 0.0 {
        let _ = write!(
            out,
            "<dt>Latency</dt><dd>{}</dd><dt>Cost</dt><dd>{}</dd>",
            html::secs(s.latency_s),
            html::usd(s.cost_usd),
        );
        // Perf/$ is a succeeded job's: a failed one's latency is not the job's.
        if s.status == JobStatus::Succeeded {
            let _ = write!(
                out,
                "<dt>Perf/$</dt><dd>{}</dd>",
                html::num(s.perf_per_dollar)
            );
        }
    }
    if let Some(e) = &s.error {
        let _ = write!(
            out,
            "<dt>Error</dt><dd class=\"bad\" style=\"white-space:pre-wrap\">{}</dd>",
            esc(e)
        );
    }
    if let Some(h) = &s.on_failure {
        let _ = match &h.error {
            None => write!(
                out,
                "<dt>On failure</dt><dd>{} ran on {} ({} s)</dd>",
                esc(&h.function),
                esc(&h.agent),
                html::num(h.seconds)
            ),
            Some(e) => write!(
                out,
                "<dt>On failure</dt><dd class=\"bad\">{} failed: {}</dd>",
                esc(&h.function),
                esc(e)
            ),
        };
    }
    if !s.bounds_missed.is_empty() {
        // It succeeded, but not within the DAG's bounds.
        let _ = write!(
            out,
            "<dt>Bounds</dt><dd class=\"bad\">missed: {}</dd>",
            esc(&s.bounds_missed.join("; "))
        );
    }
    out.push_str("</dl>");

    // Progress, which the script keeps current from the job's event stream.
    let (stage, done, total, message) = match &v.live {
        Some(e) => (
            e.stage.clone().unwrap_or_default(),
            e.done_instances,
            e.total_instances,
            e.message.clone().unwrap_or_default(),
        ),
        None => (String::new(), 0, 0, String::new()),
    };
    if !ended {
        let _ = write!(
            out,
            "<section id=\"live\" aria-live=\"polite\"><h2>Progress</h2>\
             <p>Stage <b id=\"live-stage\">{}</b>: <span id=\"live-done\">{done}</span> of <span id=\"live-total\">{total}</span> instances done. <span id=\"live-message\" class=\"muted\">{}</span></p>\
             <progress id=\"live-progress\" max=\"{}\" value=\"{done}\" aria-label=\"instances done\"></progress>\
             <noscript><p>Reload the page to see the job move on.</p></noscript>\
             <form method=\"post\" action=\"/jobs/{}/cancel\" class=\"inline\"><button class=\"danger\" type=\"submit\">Cancel the job</button></form></section>",
            esc(if stage.is_empty() { "-" } else { &stage }),
            esc(&message),
            total.max(1),
            url(&s.job_id)
        );
    } else {
        // A failed (or cancelled) job can run again, reusing what succeeded; an ended job can go.
        let retry = if s.status == JobStatus::Failed {
            format!(
                "<form method=\"post\" action=\"/jobs/{}/retry\" class=\"inline\"><button type=\"submit\">Retry the job</button></form> \
                 <span class=\"muted\">its instances that succeeded are reused, not run again</span> ",
                url(&s.job_id)
            )
        } else {
            String::new()
        };
        let _ = write!(
            out,
            "<section id=\"actions\" aria-label=\"Actions\">{retry}<form method=\"post\" action=\"/jobs/{}/delete\" class=\"inline\"><button class=\"danger\" type=\"submit\">Delete the job</button></form> \
             <span class=\"muted\">with its logs, results and input</span></section>",
            url(&s.job_id)
        );
    }

    let report = s.plan.as_ref().and_then(|p| p.report.as_ref());

    // Predicted against measured.
    if let Some(rep) = report {
        out.push_str("<h2>Predicted and measured</h2>");
        let mut rows = Vec::new();
        let pred = rep.predicted();
        for (what, p, measured, fmt) in [
            (
                "Latency",
                pred.latency_s,
                s.latency_s,
                html::secs as fn(f64) -> String,
            ),
            ("Cost", pred.cost_usd, s.cost_usd, html::usd),
            ("Perf/$", pred.perf_per_dollar, s.perf_per_dollar, html::num),
        ] {
            // A failed job measured no Perf/$ worth comparing.
            let have =
                ended && measured > 0.0 && (what != "Perf/$" || s.status == JobStatus::Succeeded);
            // Signed: + the plan predicted more than the job measured, − less.
            let err = if have {
                html::signed_pct((p - measured) / measured)
            } else {
                "-".into()
            };
            rows.push(vec![
                what.to_owned(),
                fmt(p),
                if have { fmt(measured) } else { "-".into() },
                err,
            ]);
        }
        // Per stage: when the plan predicted it would start and end, and when it did (its first
        // instance sent, its last one back), the error signed as above.
        let stage_rows: Vec<Vec<String>> = rep
            .plan
            .timing
            .iter()
            .map(|t| {
                let runs: Vec<_> = s
                    .functions
                    .iter()
                    .filter(|f| f.name == t.function)
                    .collect();
                let from = runs.iter().filter_map(|f| f.started_s).reduce(f64::min);
                let to = runs.iter().filter_map(|f| f.ended_s).reduce(f64::max);
                let took = from.zip(to).map(|(a, b)| b - a);
                let predicted = t.end_s - t.start_s;
                vec![
                    esc(&t.function),
                    html::secs(t.start_s),
                    html::secs(t.end_s),
                    html::secs(predicted),
                    from.map_or("-".into(), html::secs),
                    to.map_or("-".into(), html::secs),
                    took.map_or("-".into(), html::secs),
                    match took {
                        Some(m) if ended && m > 0.0 => html::signed_pct((predicted - m) / m),
                        _ => "-".into(),
                    },
                ]
            })
            .collect();
        out.push_str(&html::table(
            "The plan's prediction at this input size, and what the job measured",
            &[
                "",
                "Predicted ",
                "Measured ",
                "Error (predicted − measured) / measured ",
            ],
            &rows,
        ));
        if !stage_rows.is_empty() {
            out.push_str(&html::table(
                "Per stage: when the plan predicted it would run, and when it did (from the job's start)",
                &[
                    "Function",
                    "Predicted from ",
                    "to ",
                    "took ",
                    "Measured from ",
                    "to ",
                    "took ",
                    "Error ",
                ],
                &stage_rows,
            ));
        }
    }

    // The plan and why.
    if let Some(plan) = &s.plan {
        out.push_str("<h2>Plan</h2>");
        let used = match plan.used {
            PlanUsed::Best => "the best plan",
            PlanUsed::SecondBest => {
                "the second-best plan (the resource manager refused the best one's vm-storage placement)"
            }
            PlanUsed::None => "no plan: planning failed and the job profiled",
        };
        let _ = write!(out, "<p>It ran {}.</p>", esc(used));
        if !plan.notes.is_empty() {
            out.push_str("<ul>");
            for n in &plan.notes {
                let _ = write!(out, "<li>{}</li>", esc(n));
            }
            out.push_str("</ul>");
        }
        if let Some(rep) = report {
            // The objective, said; each other plan held against the one that ran.
            let chosen = rep.plan.predicted;
            match &rep.plan.slo {
                Some(v) => {
                    let _ = write!(
                        out,
                        "<p>The objective: the cheapest plan whose predicted p{} latency is at most {} (this one's: {}, {}).</p>",
                        html::num(v.percentile),
                        html::secs(v.latency_s),
                        html::secs(v.predicted_s),
                        if v.met { "met" } else { "not met: the fastest reachable ran" }
                    );
                }
                None => out.push_str(
                    "<p>The objective: the highest performance per dollar, Perf/$ = 1 / (latency × cost), of the predicted mean latency and cost, within the DAG's bounds.</p>",
                ),
            }
            let why_not = |latency_s: f64, cost_usd: f64, perf: f64| -> String {
                if rep.plan.slo.is_some() || chosen.perf_per_dollar <= 0.0 {
                    return "-".into();
                }
                let lower = 1.0 - perf / chosen.perf_per_dollar;
                if latency_s < chosen.latency_s {
                    format!(
                        "faster by {}, but costs {}× as much: Perf/$ {} lower",
                        html::secs(chosen.latency_s - latency_s),
                        html::num(cost_usd / chosen.cost_usd.max(f64::MIN_POSITIVE)),
                        html::pct(lower)
                    )
                } else if cost_usd < chosen.cost_usd {
                    format!(
                        "cheaper, but {}× as slow: Perf/$ {} lower",
                        html::num(latency_s / chosen.latency_s.max(f64::MIN_POSITIVE)),
                        html::pct(lower)
                    )
                } else {
                    format!("slower and costlier: Perf/$ {} lower", html::pct(lower))
                }
            };
            let mut rows = Vec::new();
            let row = |name: String, p: Option<Baseline>, ran: bool| -> Vec<String> {
                match p {
                    Some(Baseline::Failed { error }) => vec![
                        name,
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        format!("<span class=\"muted\">{}</span>", esc(&error)),
                    ],
                    Some(Baseline::Predicted {
                        latency_s,
                        cost_usd,
                        perf_per_dollar,
                    }) => vec![
                        name,
                        html::secs(latency_s),
                        html::usd(cost_usd),
                        html::num(perf_per_dollar),
                        if ran {
                            "ran".into()
                        } else {
                            why_not(latency_s, cost_usd, perf_per_dollar)
                        },
                    ],
                    None => vec![name, "-".into(), "-".into(), "-".into(), "-".into()],
                }
            };
            let of = |p: &Predicted| Some(Baseline::of(p));
            rows.push(row(
                format!("<b>the plan that ran ({})</b>", esc(s.policy.as_str())),
                of(&rep.plan.predicted),
                true,
            ));
            if plan.used == PlanUsed::SecondBest {
                rows.push(row(
                    "the best plan (refused)".into(),
                    rep.best.as_ref().and_then(|b| of(&b.predicted)),
                    false,
                ));
            } else if let Some(second) = &rep.plan.second_best {
                rows.push(row(
                    "second best (no vm-storage where the best uses it)".into(),
                    of(&second.predicted),
                    false,
                ));
            }
            if let Some(b) = &rep.baselines {
                for (policy, p) in b {
                    let what = match policy {
                        Policy::Remote => "remote: every edge through the store (OpenLambda + S3)",
                        Policy::Direct => "direct: every edge VM to VM",
                        Policy::Local => "local: one VM, vm-storage (SAND)",
                        Policy::Memory => {
                            "memory: every edge through the memory tier (OpenLambda + Pocket)"
                        }
                        other => other.as_str(),
                    };
                    rows.push(row(
                        format!("baseline {}", esc(what)),
                        Some(p.clone()),
                        false,
                    ));
                }
            }
            out.push_str(&html::table(
                "Why this plan: predicted at the same DAG parameters",
                &["Plan", "Latency ", "Cost ", "Perf/$ ", "Why not"],
                &rows,
            ));
            if rep.baselines.is_none() {
                out.push_str("<p class=\"muted\">The baselines' predictions were not recorded for this job.</p>");
            }
        }
        let stage_rows: Vec<Vec<String>> = plan
            .stages
            .iter()
            .map(|st| {
                let vms =
                    report.and_then(|r| r.plan.stages.iter().find(|x| x.function == st.function));
                vec![
                    esc(&st.function),
                    esc(&st.vm_type),
                    vms.map_or_else(|| st.agents.len().to_string(), |x| x.vms.to_string()),
                    vms.map_or("-".into(), |x| x.per_vm.to_string()),
                    st.concurrent.to_string(),
                    // The CPUs each instance was given (right-sizing).
                    vms.map_or("-".into(), |x| {
                        format!("{:.2}", x.cores)
                            .trim_end_matches('0')
                            .trim_end_matches('.')
                            .to_owned()
                    }),
                    format!("{} MB", st.memory_limit_mb),
                    // How the plan priced its first batch: in containers its agents kept warm,
                    // in containers started while its senders ran, or cold.
                    if st.warm {
                        "warm".into()
                    } else if vms.is_some_and(|x| x.prewarmed) {
                        "prewarmed".into()
                    } else {
                        "cold".into()
                    },
                    esc(&st.agents.join(", ")),
                ]
            })
            .collect();
        if !stage_rows.is_empty() {
            out.push_str(&html::table(
                "Where each stage ran",
                &[
                    "Function",
                    "VM type",
                    "VMs ",
                    "Per VM ",
                    "Concurrent ",
                    "CPUs ",
                    "Memory limit ",
                    "Start",
                    "Agents",
                ],
                &stage_rows,
            ));
        }
    }

    // Edges: the graph with each edge's method, and the numbers.
    if let Some(dag) = &v.dag {
        out.push_str("<h2>Data passing</h2>");
        let planned_edge = |from: &str, to: &str| {
            report.and_then(|r| r.plan.edges.iter().find(|e| e.from == from && e.to == to))
        };
        let planned_method = |from: &str, to: &str| -> Option<String> {
            planned_edge(from, to).map(|e| e.method.as_str().to_owned())
        };
        let predicted_s =
            |from: &str, to: &str| -> Option<f64> { planned_edge(from, to).map(|e| e.predicted_s) };
        let mut labels = Vec::new();
        let mut rows = Vec::new();
        for e in &dag.edges {
            let (from, to) = (&dag.functions[e.from].name, &dag.functions[e.to].name);
            let measured = s.edges.iter().find(|x| &x.from == from && &x.to == to);
            let method = measured
                .map(|m| m.method.as_str().to_owned())
                .or_else(|| planned_method(from, to));
            labels.push(EdgeLabel {
                text: method.clone().unwrap_or_else(|| kind_name(e.kind)),
                method: method.clone(),
            });
            rows.push(vec![
                esc(from),
                esc(to),
                esc(&kind_name(e.kind)),
                format!(
                    "<span data-edge=\"{}-&gt;{}\">{}</span>",
                    esc(from),
                    esc(to),
                    esc(method.as_deref().unwrap_or("pending"))
                ),
                measured.map_or("-".into(), |m| html::bytes(m.bytes as f64)),
                measured.map_or("-".into(), |m| html::secs(m.seconds)),
                predicted_s(from, to).map_or("-".into(), html::secs),
            ]);
        }
        let notes = instances_notes(dag);
        let _ = write!(
            out,
            "<figure>{}<figcaption>Each edge labelled with how its data moved: <b>vm-storage</b> (thick), <b>direct</b> (solid), <b>remote</b> (dashed).</figcaption></figure>",
            svg::dag_graph("job-dag", dag, &labels, &notes, &node_states(dag, v))
        );
        out.push_str(&html::table(
            "Per edge: bytes the receivers staged; seconds of the slowest receiving instance",
            &[
                "From",
                "To",
                "Kind",
                "Method",
                "Bytes ",
                "Seconds ",
                "Predicted ",
            ],
            &rows,
        ));
    } else if !s.edges.is_empty() {
        let rows: Vec<Vec<String>> = s
            .edges
            .iter()
            .map(|e| {
                vec![
                    esc(&e.from),
                    esc(&e.to),
                    format!(
                        "<span data-edge=\"{}-&gt;{}\">{}</span>",
                        esc(&e.from),
                        esc(&e.to),
                        esc(e.method.as_str())
                    ),
                    html::bytes(e.bytes as f64),
                    html::secs(e.seconds),
                ]
            })
            .collect();
        out.push_str("<h2>Data passing</h2>");
        out.push_str(&html::table(
            "",
            &["From", "To", "Method", "Bytes ", "Seconds "],
            &rows,
        ));
    }

    // Instances on a timeline by agent.
    if !s.functions.is_empty() || !s.failed_attempts.is_empty() {
        out.push_str("<h2>Instances</h2>");
        let agents: Vec<String> = s
            .functions
            .iter()
            .map(|f| f.agent.clone())
            .chain(s.failed_attempts.iter().map(|f| f.agent.clone()))
            .filter(|a| !a.is_empty())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let bars: Vec<Bar> = s
            .functions
            .iter()
            .filter_map(|f| {
                Some(Bar {
                    agent: f.agent.clone(),
                    start: f.started_s?,
                    end: f.ended_s?,
                    label: format!("{}[{}]", f.name, f.instance),
                    cold: f.cold,
                    failed: false,
                })
            })
            .chain(s.failed_attempts.iter().filter_map(|f| {
                Some(Bar {
                    agent: f.agent.clone(),
                    start: f.started_s?,
                    end: f.ended_s?,
                    label: format!("{}[{}] ✗{}", f.name, f.instance, f.attempt),
                    cold: false,
                    failed: true,
                })
            }))
            .collect();
        if !bars.is_empty() {
            let _ = write!(
                out,
                "<figure class=\"tall\">{}<figcaption>From the first attempt sent to the report back (staging, the run, routing). Dark: cold start; light: hot (a warm container); red: an attempt that failed (✗ and its number).</figcaption></figure>",
                svg::timeline("timeline", &agents, &bars)
            );
        }
        if !s.failed_attempts.is_empty() {
            let rows: Vec<Vec<String>> = s
                .failed_attempts
                .iter()
                .map(|f| {
                    vec![
                        esc(&f.name),
                        f.instance.to_string(),
                        f.attempt.to_string(),
                        esc(&f.agent),
                        format!(
                            "<span class=\"badge bad\">{}</span>",
                            esc(&serde_json::to_value(f.kind)
                                .ok()
                                .and_then(|k| k.as_str().map(str::to_owned))
                                .unwrap_or_default())
                        ),
                        f.started_s.map_or("-".into(), html::secs),
                        f.ended_s.map_or("-".into(), html::secs),
                        format!("<span class=\"wrap-text\">{}</span>", esc(&f.error)),
                    ]
                })
                .collect();
            out.push_str(&html::table(
                "Attempts that failed, where and when (retried after, or the one that failed the job)",
                &[
                    "Function",
                    "Instance ",
                    "Attempt ",
                    "Agent",
                    "Kind",
                    "From ",
                    "To ",
                    "Error",
                ],
                &rows,
            ));
        }
        let cold = s.functions.iter().filter(|f| f.cold).count();
        let _ = write!(
            out,
            "<p>{} instances: {cold} cold, {} hot.</p>",
            s.functions.len(),
            s.functions.len() - cold
        );
        let rows: Vec<Vec<String>> = s
            .functions
            .iter()
            .map(|f| {
                vec![
                    esc(&f.name),
                    f.instance.to_string(),
                    esc(&f.agent),
                    esc(&f.vm_type),
                    if f.cold { "cold" } else { "hot" }.into(),
                    f.started_s.map_or("-".into(), html::secs),
                    f.ended_s.map_or("-".into(), html::secs),
                    html::secs(f.seconds),
                    f.peak_memory_mb
                        .map_or("-".into(), |m| format!("{} MB", html::num(m))),
                    if f.reused {
                        format!("{} <span class=\"badge\" title=\"succeeded before the retry; not run again\">reused</span>", f.attempts)
                    } else {
                        f.attempts.to_string()
                    },
                ]
            })
            .collect();
        let headers = [
            "Function",
            "Instance ",
            "Agent",
            "VM type",
            "Start",
            "From ",
            "To ",
            "Run ",
            "Peak memory ",
            "Attempts ",
        ];
        if rows.len() <= LONG_JOB {
            out.push_str(&html::table("", &headers, &rows));
        } else {
            // A long job: per function, then every instance folded away.
            let mut per: Vec<(&str, Vec<&sonic_api::control::FunctionRun>)> = Vec::new();
            for f in &s.functions {
                match per.iter_mut().find(|(n, _)| *n == f.name) {
                    Some((_, runs)) => runs.push(f),
                    None => per.push((&f.name, vec![f])),
                }
            }
            let summary: Vec<Vec<String>> = per
                .iter()
                .map(|(name, runs)| {
                    let mut secs: Vec<f64> = runs.iter().map(|r| r.seconds).collect();
                    secs.sort_by(f64::total_cmp);
                    let agents: BTreeSet<&str> = runs.iter().map(|r| r.agent.as_str()).collect();
                    vec![
                        esc(name),
                        runs.len().to_string(),
                        runs.iter().filter(|r| r.cold).count().to_string(),
                        html::secs(secs[0]),
                        html::secs(secs[secs.len() / 2]),
                        html::secs(secs[secs.len() - 1]),
                        runs.iter()
                            .map(|r| r.attempts.saturating_sub(1))
                            .sum::<u32>()
                            .to_string(),
                        agents.len().to_string(),
                    ]
                })
                .collect();
            out.push_str(&html::table(
                "Per function",
                &[
                    "Function",
                    "Instances ",
                    "Cold ",
                    "Fastest ",
                    "Median ",
                    "Slowest ",
                    "Retries ",
                    "Agents ",
                ],
                &summary,
            ));
            let _ = write!(
                out,
                "<details id=\"all-instances\"><summary>All {} instances</summary>{}</details>",
                rows.len(),
                html::table("", &headers, &rows)
            );
        }
    }

    if !s.outputs.is_empty() {
        out.push_str("<h2>Results</h2><ul class=\"results\">");
        let marker = format!("jobs/{}/result/", s.job_id);
        for o in &s.outputs {
            // A succeeded job's results download from here; the path under its result/.
            match o.split_once(&marker) {
                Some((_, key)) if s.status == JobStatus::Succeeded => {
                    let _ = write!(
                        out,
                        "<li><a href=\"/jobs/{}/results/{}\" download>{}</a> <code class=\"muted\">{}</code></li>",
                        url(&s.job_id),
                        key.split('/').map(url).collect::<Vec<_>>().join("/"),
                        esc(key),
                        esc(o)
                    );
                }
                _ => {
                    let _ = write!(out, "<li><code>{}</code></li>", esc(o));
                }
            }
        }
        out.push_str(
            "</ul><p class=\"hint\">Or all at once: <code>ofctl fetch JOB --to DIR</code>.</p>",
        );
    }

    if !v.logs.is_empty() {
        let _ = write!(
            out,
            "<h2>Logs</h2><details><summary>{} instance attempts</summary>",
            v.logs.len()
        );
        for l in &v.logs {
            let _ = write!(
                out,
                "<h3>{}[{}], attempt {} on {}</h3><pre>{}</pre>",
                esc(&l.function),
                l.instance,
                l.attempt,
                esc(&l.agent),
                esc(l.log.trim_end())
            );
        }
        out.push_str("</details>");
    }
    out
}

// ---- agents ----

/// What an agent's own metrics say about its warm environments (`None` when it does not answer
/// or does not know).
async fn warm_of(http: &reqwest::Client, token: &str, a: &AgentInfo) -> Option<f64> {
    let url = format!("{}/metrics", a.url.trim_end_matches('/'));
    let text = http
        .get(url)
        .bearer_auth(token)
        .timeout(Duration::from_millis(800))
        .send()
        .await
        .ok()?
        .error_for_status()
        .ok()?
        .text()
        .await
        .ok()?;
    sonic_daemon::metrics::sample(&text, "sonic_agent_warm_environments", &[])
}

fn mbit(bytes_per_s: f64) -> String {
    format!("{} Mbit/s", html::num(bytes_per_s * 8.0 / 1e6))
}

pub async fn agents(State(state): State<Shared>) -> PageResult {
    let now = state.clock.now_ms();
    let timeout = state.settings.heartbeat_timeout;
    let records = state.db.run(|db| db.list_agents()).await?;
    let infos: Vec<AgentInfo> = records
        .into_iter()
        .map(|a| agent_info(a, now, timeout))
        .collect();
    let warm: Vec<Option<f64>> = match &state.jobs {
        Some(rt) => {
            let token = rt.config.agent_token.clone();
            futures::future::join_all(infos.iter().map(|a| {
                let token = token.clone();
                async move {
                    if a.alive {
                        warm_of(rt.http(), &token, a).await
                    } else {
                        None
                    }
                }
            }))
            .await
        }
        None => vec![None; infos.len()],
    };
    let rows: Vec<Vec<String>> = infos
        .iter()
        .zip(&warm)
        .map(|(a, warm)| {
            let c = &a.capacity;
            let in_use = if c.vcpus > 0 {
                f64::from(c.running) / f64::from(c.vcpus)
            } else {
                0.0
            };
            let nominal = c.network_mbps.map(|m| m * 1e6 / 8.0);
            let measured = [c.bandwidth.egress_bps, c.bandwidth.ingress_bps]
                .into_iter()
                .flatten()
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            vec![
                esc(&a.agent_id),
                esc(&a.vm_type),
                format!(
                    "{} <span class=\"muted\">{} ago</span>",
                    html::flag(a.alive, "alive", "not answering"),
                    html::secs(a.heartbeat_age_ms as f64 / 1000.0)
                ),
                esc(&c.sandbox),
                c.vcpus.to_string(),
                format!("{} MB", c.memory_mb),
                format!(
                    "<meter min=\"0\" max=\"1\" value=\"{in_use:.2}\" aria-label=\"capacity in use\"></meter> {} of {} ({})",
                    c.running,
                    c.vcpus,
                    html::pct(in_use)
                ),
                warm.map_or("unknown".into(), |w| format!("{w:.0}")),
                nominal.map_or("unlimited".into(), mbit),
                c.bandwidth.egress_bps.map_or("-".into(), mbit),
                c.bandwidth.ingress_bps.map_or("-".into(), mbit),
                match (measured, nominal) {
                    (Some(m), Some(n)) if n > 0.0 => html::pct(m / n),
                    _ => "-".into(),
                },
            ]
        })
        .collect();
    let mut body = String::from("<h1>Agents</h1>");
    if rows.is_empty() {
        body.push_str("<p>No agent registered yet.</p>");
    } else {
        body.push_str(&html::table(
            "One agent per VM; bandwidth measured over completed transfers (moving average) against the VM type's nominal",
            &[
                "Agent",
                "VM type",
                "State",
                "Sandbox",
                "vCPUs ",
                "Memory ",
                "Capacity in use",
                "Warm ",
                "Nominal ",
                "Egress ",
                "Ingress ",
                "Measured / nominal ",
            ],
            &rows,
        ));
    }
    let (_, bandwidth) = state.planning_catalog();
    let per_type: BTreeMap<String, _> = bandwidth.into_iter().collect();
    if !per_type.is_empty() {
        let rows: Vec<Vec<String>> = per_type
            .iter()
            .map(|(t, b)| {
                vec![
                    esc(t),
                    format!("{} Mbit/s", html::num(b.network_mbps)),
                    esc(b.source.as_str()),
                    b.reports.to_string(),
                ]
            })
            .collect();
        body.push_str("<h2>What the planner uses</h2>");
        body.push_str(&html::table(
            "Per VM type: the agents' measured average, or the catalog's nominal value when nobody measured it",
            &["VM type", "Bandwidth ", "Source", "Reports "],
            &rows,
        ));
    }
    Ok(Html(page("Agents", &body, true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_form_parameters() {
        let p = parse_params("mids=3\n\n name = x \nflag=true").expect("params");
        assert_eq!(p["mids"], 3);
        assert_eq!(p["name"], "x");
        assert_eq!(p["flag"], true);
        assert!(parse_params("novalue").is_err());
    }

    fn job(id: &str, mode: JobMode, latency_s: f64, p95: f64, slo_s: Option<f64>) -> JobRecord {
        let mut report = serde_json::json!({
            "dag": "d", "policy": "sonic", "stages": [], "edges": [],
            "predicted": {
                "latency_s": 1.5, "cost_usd": 1e-5, "perf_per_dollar": 1.0,
                "latency_quantiles_s": { "p50": 1.5, "p90": p95, "p95": p95, "p99": p95 }
            },
            "planning_time_us": 1, "input_bytes": 1000
        });
        if let Some(t) = slo_s {
            report["slo"] = serde_json::json!({
                "percentile": 95.0, "latency_s": t, "predicted_s": p95, "met": p95 <= t
            });
        }
        let summary = serde_json::json!({
            "job_id": id, "dag": "d", "status": "succeeded", "policy": "sonic",
            "mode": mode.as_str(), "input_bytes": 1000, "latency_s": latency_s,
            "cost_usd": 1e-5, "perf_per_dollar": 1.0,
            "plan": { "used": "best", "notes": [], "report": report, "stages": [] }
        });
        JobRecord {
            dag_revision: None,
            retried_ms: None,
            id: id.into(),
            dag: "d".into(),
            status: JobStatus::Succeeded,
            policy: Policy::Sonic,
            mode,
            input_bytes: 1000,
            params: serde_json::Map::new(),
            summary: Some(serde_json::from_value(summary).expect("summary")),
            error: None,
            created_ms: 0,
            started_ms: None,
            finished_ms: None,
            updated_ms: 0,
            plan: None,
            mode_reason: None,
            slo: None,
        }
    }

    /// The job page: prediction errors signed, and Perf/$ only for a job that succeeded.
    #[test]
    fn a_jobs_page_signs_its_errors_and_gives_a_failed_job_no_perf_per_dollar() {
        let view = |r: JobRecord| JobView {
            summary: crate::http::api::job_view(r.clone()),
            record: r,
            dag: None,
            logs: Vec::new(),
            live: None,
        };
        // Predicted 1.5 s, measured 1.0 s: +50%; measured 3.0 s: −50%.
        let over = job_body(&view(job("j-1", JobMode::Planned, 1.0, 3.0, None)));
        assert!(over.contains("+50.0%"), "{over}");
        assert!(over.contains("<dt>Perf/$</dt>"), "{over}");
        let under = job_body(&view(job("j-2", JobMode::Planned, 3.0, 3.0, None)));
        assert!(under.contains("\u{2212}50.0%"), "{under}");
        let mut failed = job("j-3", JobMode::Planned, 3.0, 3.0, None);
        failed.status = JobStatus::Failed;
        let failed = job_body(&view(failed));
        assert!(!failed.contains("<dt>Perf/$</dt>"), "{failed}");
        assert!(failed.contains("<dt>Latency</dt>"), "{failed}");
        // A failed job can be retried and deleted; a succeeded one only deleted; a cancelled
        // one reads `cancelled`, and a retry's reused instances say so.
        assert!(failed.contains("action=\"/jobs/j-3/retry\""), "{failed}");
        assert!(failed.contains("action=\"/jobs/j-3/delete\""), "{failed}");
        assert!(!over.contains("/retry\""), "{over}");
        assert!(over.contains("action=\"/jobs/j-1/delete\""), "{over}");
        let mut cancelled = job("j-4", JobMode::Planned, 3.0, 3.0, None);
        cancelled.status = JobStatus::Failed;
        if let Some(s) = cancelled.summary.as_mut() {
            s.failure = Some(sonic_core::machine::Failure::Cancelled);
            s.functions = vec![sonic_api::control::FunctionRun {
                name: "f".into(),
                instance: 0,
                agent: "a-1".into(),
                vm_type: "m5.large".into(),
                cold: true,
                seconds: 1.0,
                start_latency_s: None,
                start_contention: None,
                peak_memory_mb: None,
                cpus: None,
                attempts: 1,
                started_s: None,
                ended_s: None,
                reused: true,
            }];
        }
        let cancelled = job_body(&view(cancelled));
        assert!(cancelled.contains(">cancelled</span>"), "{cancelled}");
        assert!(cancelled.contains(">reused</span>"), "{cancelled}");
        assert!(!failed.contains(">cancelled</span>"), "{failed}");
    }

    /// The DAG page's section: measured quantiles over the planned jobs, how many ended within
    /// their plan's p95 and their objective; profiling jobs left out.
    #[test]
    fn planned_jobs_are_held_against_their_predicted_distribution() {
        assert_eq!(nearest_rank(&[], 0.5), None);
        assert_eq!(nearest_rank(&[1.0, 2.0, 5.0], 0.5), Some(2.0));
        assert_eq!(nearest_rank(&[1.0, 2.0, 5.0], 0.95), Some(5.0));
        let jobs = [
            job("j-1", JobMode::Planned, 1.0, 3.0, Some(4.0)),
            job("j-2", JobMode::Planned, 2.0, 3.0, Some(4.0)),
            job("j-3", JobMode::Planned, 5.0, 3.0, Some(4.0)),
            job("j-4", JobMode::Profiling, 9.0, 3.0, None),
        ];
        let html = predicted_against_measured(&jobs);
        assert!(html.contains("Over the last 3 planned jobs"), "{html}");
        assert!(html.contains("measured p50 2.00 s, p95 5.00 s"), "{html}");
        assert!(
            html.contains("2 of 3 ended within their plan's p95"),
            "{html}"
        );
        assert!(
            html.contains("2 of 3 jobs with a latency objective ended within it"),
            "{html}"
        );
        assert!(html.contains("j-3") && !html.contains("j-4"), "{html}");
        assert!(html.contains("over") && html.contains("missed"), "{html}");
        let none = predicted_against_measured(&jobs[3..]);
        assert!(
            none.contains("No planned job of this DAG has succeeded yet"),
            "{none}"
        );
    }
}
