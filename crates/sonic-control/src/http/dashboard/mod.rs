//! The web dashboard, served by the control plane at `/` on its own port: server-rendered HTML
//! (readable without JavaScript; one small script makes a job's page follow the job live).
//!
//! Access is the API's token: the login page takes it and keeps it in a cookie (`HttpOnly`,
//! `SameSite=Strict`, `Path=/`, `Secure` over TLS); `Authorization: Bearer <token>` opens every
//! page too (scripts). A page asked for without either redirects a browser (`Accept: text/html`)
//! to the login page and answers anything else 401. The pages are their own route table
//! ([`pages`]), beside the API's: the access tests walk it; the OpenAPI document describes the
//! JSON API only.

mod html;
mod pages;
mod svg;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use sonic_daemon::routes::{Route, RouteTable};

use crate::http::api::{ControlState, authorized};
use crate::http::error::ApiError;

type Shared = Arc<ControlState>;

/// The cookie that holds the token (hex-encoded, so that any token is a valid cookie value).
pub const COOKIE: &str = "sonic_token";

/// What the dashboard keeps besides the control plane's state.
#[derive(Debug, Default)]
pub struct DashboardState {
    /// The control plane serves HTTPS: cookies get `Secure`.
    tls: AtomicBool,
}

impl DashboardState {
    /// Whether the dashboard is served over HTTPS (its cookies are then `Secure`).
    pub fn set_tls(&self, on: bool) {
        self.tls.store(on, Ordering::Relaxed);
    }
}

/// Who may see a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageAccess {
    /// Anyone (logging in and out).
    Open,
    /// Signed in: the API token in the dashboard's cookie, or as a bearer token.
    SignedIn,
}

/// One route of the dashboard.
pub type PageInfo = Route<PageAccess>;

/// The dashboard's routes, each once with its handler. Only the login and logout routes are open.
fn table() -> RouteTable<Shared, PageAccess> {
    use PageAccess::{Open, SignedIn};
    RouteTable::new()
        .route(Method::GET, "/login", Open, pages::login_form)
        .route(Method::POST, "/login", Open, pages::login)
        .route(Method::POST, "/logout", Open, pages::logout)
        .route(Method::GET, "/", SignedIn, pages::index)
        .route(Method::GET, "/dags", SignedIn, pages::dags)
        .route(Method::GET, "/dags/{name}", SignedIn, pages::dag)
        .route(Method::POST, "/dags/{name}/run", SignedIn, pages::run)
        .route(Method::GET, "/jobs", SignedIn, pages::jobs)
        .route(Method::GET, "/jobs/{id}", SignedIn, pages::job)
        .route(Method::GET, "/jobs/{id}/live", SignedIn, pages::job_live)
        .route(
            Method::GET,
            "/jobs/{id}/events",
            SignedIn,
            crate::http::api::job_events,
        )
        .route(Method::POST, "/jobs/{id}/cancel", SignedIn, pages::cancel)
        .route(Method::GET, "/agents", SignedIn, pages::agents)
        .route(Method::GET, "/assets/dashboard.js", SignedIn, pages::script)
}

/// Every route of the dashboard (what the access tests walk).
pub fn pages() -> Vec<PageInfo> {
    table().routes()
}

/// The dashboard's router, merged into the API's (same port, same state).
pub fn router(state: Shared) -> Router<Shared> {
    table()
        .router(|access, routes| match access {
            PageAccess::Open => routes,
            PageAccess::SignedIn => routes.route_layer(middleware::from_fn_with_state(
                state.clone(),
                require_session,
            )),
        })
        .route_layer(middleware::from_fn(same_origin_posts))
        .route_layer(middleware::from_fn(headers))
}

/// The token as the cookie keeps it.
fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The value of the cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

/// Whether the request carries the token in the dashboard's cookie.
fn cookie_ok(headers: &HeaderMap, expected: &str) -> bool {
    let Some(value) = cookie(headers, COOKIE) else {
        return false;
    };
    let Some(token) = unhex(value) else {
        return false;
    };
    sonic_daemon::secret::matches(&token, expected.as_bytes())
}

/// Whether the request may see the dashboard: the bearer token, or the cookie.
pub fn signed_in(headers: &HeaderMap, expected: &str) -> bool {
    authorized(headers, expected) || cookie_ok(headers, expected)
}

/// A browser asking for a page (it can be sent to the login page).
fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"))
}

/// A path of this site to come back to after logging in (never another site).
fn local_path(p: &str) -> Option<&str> {
    let ok = p.starts_with('/')
        && !p.starts_with("//")
        && !p.contains('\\')
        && p.len() <= 2048
        && !p.chars().any(char::is_control);
    ok.then_some(p)
}

fn see_other(to: &str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to.to_owned())]).into_response()
}

async fn require_session(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if signed_in(req.headers(), &state.settings.token) {
        return next.run(req).await;
    }
    if wants_html(req.headers()) {
        let back = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let to = if back == "/" {
            "/login".to_owned()
        } else {
            format!("/login?next={}", html::url(&back))
        };
        return see_other(&to);
    }
    ApiError::Unauthorized.into_response()
}

/// Refuses a form posted from another site (the cookie is `SameSite=Strict` already; this also
/// covers browsers that ignore it). A browser says where a request comes from in
/// `Sec-Fetch-Site` (which pages cannot forge): it must be `same-origin` (or `none`, typed by
/// the user). Older browsers send only `Origin`, which must then be this host. A client that
/// sends neither is not a browser, and a cross-site form cannot come from it.
async fn same_origin_posts(req: Request, next: Next) -> Response {
    if req.method() == axum::http::Method::POST {
        let h = req.headers();
        let site = h.get("sec-fetch-site").and_then(|v| v.to_str().ok());
        // HTTP/1.1 names the host in `Host`, HTTP/2 in the URI's authority.
        let host = h
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()));
        let origin = h.get(header::ORIGIN).and_then(|v| v.to_str().ok());
        let ok = match (site, origin) {
            (Some(site), _) => matches!(site, "same-origin" | "none"),
            (None, Some(o)) => host.is_some_and(|host| {
                o.split_once("://")
                    .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
            }),
            (None, None) => true,
        };
        if !ok {
            return (
                StatusCode::FORBIDDEN,
                "a form of another site cannot post here",
            )
                .into_response();
        }
    }
    next.run(req).await
}

/// Headers of every dashboard answer: no caching of pages that show a cluster, no framing, only
/// this site's script, no sniffing, no referrer to other sites.
async fn headers(req: Request, next: Next) -> Response {
    let mut r = next.run(req).await;
    let h = r.headers_mut();
    let set = |h: &mut HeaderMap, k: &'static str, v: &'static str| {
        h.entry(k).or_insert(HeaderValue::from_static(v));
    };
    set(h, "cache-control", "no-store");
    set(h, "x-content-type-options", "nosniff");
    set(h, "referrer-policy", "same-origin");
    set(h, "x-frame-options", "DENY");
    set(
        h,
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'unsafe-inline'; img-src 'self' data:; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    );
    r
}

/// The `Set-Cookie` value that keeps the token (or, with `None`, forgets it).
fn session_cookie(token: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match token {
        Some(t) => format!(
            "{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/{secure}",
            hex(t)
        ),
        None => format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{secure}"),
    }
}

/// Whether the browser reached us over HTTPS: our own TLS, or a proxy that says so.
fn over_tls(state: &ControlState, headers: &HeaderMap) -> bool {
    state.dashboard.tls.load(Ordering::Relaxed)
        || headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_round_trip_any_token() {
        let token = "a+b/c=d;e \"f\"";
        let c = session_cookie(Some(token), true);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Path=/"));
        assert!(c.ends_with("; Secure"));
        assert!(!session_cookie(Some(token), false).contains("Secure"));
        let value = c
            .split(';')
            .next()
            .and_then(|kv| kv.split_once('='))
            .map(|(_, v)| v.to_owned())
            .expect("value");
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            format!("other=1; {COOKIE}={value}")
                .parse()
                .expect("header"),
        );
        assert!(signed_in(&h, token));
        assert!(!signed_in(&h, "another-token-0123"));
        h.insert(
            header::COOKIE,
            format!("{COOKIE}=zz").parse().expect("header"),
        );
        assert!(!signed_in(&h, token));
        assert!(!signed_in(&HeaderMap::new(), token));
        assert!(session_cookie(None, false).contains("Max-Age=0"));
    }

    #[test]
    fn only_local_paths_come_back() {
        assert_eq!(local_path("/jobs/j-1"), Some("/jobs/j-1"));
        assert_eq!(local_path("//evil.example/"), None);
        assert_eq!(local_path("https://evil.example/"), None);
        assert_eq!(local_path("/\\evil"), None);
    }

    #[test]
    fn pages_do_not_shadow_the_api() {
        let api = crate::http::api::routes();
        for p in pages() {
            assert!(
                !api.iter().any(|r| r.path == p.path && r.method == p.method),
                "{} is an API route",
                p.path
            );
            assert!(!p.path.starts_with("/v1/"), "{} under /v1", p.path);
        }
        let open: Vec<&str> = pages()
            .iter()
            .filter(|p| p.guard == PageAccess::Open)
            .map(|p| p.path)
            .collect();
        assert_eq!(open, ["/login", "/login", "/logout"]);
    }
}
