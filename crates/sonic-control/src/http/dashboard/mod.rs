//! The web dashboard, served by the control plane at `/` on its own port: server-rendered HTML
//! (readable without JavaScript; one small script makes a job's page follow the job live).
//!
//! Access is the API's token: the login page takes it and opens a session, whose random id (not
//! the token) the browser keeps in a cookie (`HttpOnly`, `SameSite=Strict`, `Path=/`, `Secure`
//! over TLS; [`Sessions`]: 12 hours, forgotten at logout and when the control plane restarts);
//! `Authorization: Bearer <token>` opens every page too (scripts). Failed logins are limited per
//! client address ([`LOGIN_FAILURES`] in [`LOGIN_WINDOW`], then 429 until the window ends). A page asked for without either redirects a browser (`Accept: text/html`)
//! to the login page and answers anything else 401. The pages are their own route table
//! ([`pages`]), beside the API's: the access tests walk it; the OpenAPI document describes the
//! JSON API only.

mod html;
mod pages;
mod svg;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use sonic_daemon::routes::{Route, RouteTable};

use crate::http::api::{ControlState, authorized};
use crate::http::error::ApiError;

type Shared = Arc<ControlState>;

/// The cookie that holds a session's id.
pub const COOKIE: &str = "sonic_session";
/// How long a session lasts after its login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// The most sessions kept at once: past it the oldest goes.
pub const MAX_SESSIONS: usize = 10_000;
/// Failed logins allowed from one address within [`LOGIN_WINDOW`].
pub const LOGIN_FAILURES: u32 = 10;
/// The window failed logins are counted in.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(300);

/// What the dashboard keeps besides the control plane's state.
#[derive(Debug, Default)]
pub struct DashboardState {
    /// The control plane serves HTTPS: cookies get `Secure`.
    tls: AtomicBool,
    sessions: Sessions,
    failures: Mutex<HashMap<Option<IpAddr>, (Instant, u32)>>,
}

impl DashboardState {
    /// Whether the dashboard is served over HTTPS (its cookies are then `Secure`).
    pub fn set_tls(&self, on: bool) {
        self.tls.store(on, Ordering::Relaxed);
    }

    /// How long `client` must wait before it may try to log in again (`None`: it may now).
    fn locked_out(&self, client: Option<IpAddr>, now: Instant) -> Option<Duration> {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let &(since, n) = failures.get(&client)?;
        let left = (since + LOGIN_WINDOW).saturating_duration_since(now);
        (n >= LOGIN_FAILURES && !left.is_zero()).then_some(left)
    }

    /// Counts a failed login of `client`.
    fn failed(&self, client: Option<IpAddr>, now: Instant) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        // Forget what is past its window, so the map stays as small as the attack.
        failures.retain(|_, (since, _)| now.saturating_duration_since(*since) < LOGIN_WINDOW);
        let entry = failures.entry(client).or_insert((now, 0));
        entry.1 = entry.1.saturating_add(1);
    }

    /// Forgets `client`'s failures (it logged in).
    fn succeeded(&self, client: Option<IpAddr>) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        failures.remove(&client);
    }
}

/// The dashboard's sessions, by the SHA-256 of their id (the id itself is only in the
/// browser's cookie), with when each ends.
#[derive(Debug, Default)]
pub struct Sessions {
    open: Mutex<HashMap<[u8; 32], Instant>>,
}

impl Sessions {
    fn digest(id: &str) -> [u8; 32] {
        use sha2::Digest as _;
        sha2::Sha256::digest(id.as_bytes()).into()
    }

    /// Opens a session at `now`; its id (32 random bytes, hex).
    fn open(&self, now: Instant) -> std::io::Result<String> {
        let id = sonic_daemon::secret::random_hex(32)?;
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, ends| *ends > now);
        if open.len() >= MAX_SESSIONS
            && let Some(oldest) = open.iter().min_by_key(|(_, ends)| **ends).map(|(k, _)| *k)
        {
            open.remove(&oldest);
        }
        open.insert(Self::digest(&id), now + SESSION_TTL);
        Ok(id)
    }

    /// Whether `id` is a session open at `now`.
    fn valid(&self, id: &str, now: Instant) -> bool {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&Self::digest(id)).is_some_and(|ends| *ends > now)
    }

    /// Ends session `id`.
    fn close(&self, id: &str) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.remove(&Self::digest(id));
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
        .route(
            Method::GET,
            "/jobs/{id}/results/{*key}",
            SignedIn,
            pages::result,
        )
        .route(Method::POST, "/jobs/{id}/cancel", SignedIn, pages::cancel)
        .route(Method::POST, "/jobs/{id}/retry", SignedIn, pages::retry)
        .route(
            Method::POST,
            "/jobs/{id}/delete",
            SignedIn,
            pages::delete_job,
        )
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
            // Signed in, a page may take an uploaded input (the run form): checked after the
            // session, so no one else makes the server read that much.
            PageAccess::SignedIn => routes
                .route_layer(middleware::from_fn_with_state(
                    state.clone(),
                    require_session,
                ))
                .route_layer(axum::extract::DefaultBodyLimit::max(
                    pages::MAX_UPLOAD + 64 * 1024,
                )),
        })
        .route_layer(middleware::from_fn(same_origin_posts))
        .route_layer(middleware::from_fn(headers))
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

/// Whether the request may see the dashboard: the bearer token, or an open session's cookie.
pub fn signed_in(state: &ControlState, headers: &HeaderMap) -> bool {
    authorized(headers, &state.settings.token)
        || cookie(headers, COOKIE)
            .is_some_and(|id| state.dashboard.sessions.valid(id, Instant::now()))
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
    if signed_in(&state, req.headers()) {
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

/// The `Set-Cookie` value that keeps a session's id (or, with `None`, forgets it).
fn session_cookie(id: Option<&str>, secure: bool) -> String {
    let secure = if secure { "; Secure" } else { "" };
    match id {
        Some(id) => format!(
            "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
            SESSION_TTL.as_secs()
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
    fn a_session_cookie_holds_an_id_with_its_flags() {
        let c = session_cookie(Some("abc123"), true);
        assert!(c.starts_with(&format!("{COOKIE}=abc123;")), "{c}");
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.contains("Path=/"));
        assert!(
            c.contains(&format!("Max-Age={}", SESSION_TTL.as_secs())),
            "{c}"
        );
        assert!(c.ends_with("; Secure"));
        assert!(!session_cookie(Some("abc123"), false).contains("Secure"));
        assert!(session_cookie(None, false).contains("Max-Age=0"));
    }

    #[test]
    fn sessions_open_end_at_logout_or_in_time_and_are_not_their_ids() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let id = s.open(t0).expect("random");
        assert_eq!(id.len(), 64);
        assert!(s.valid(&id, t0));
        assert!(!s.valid("not-a-session", t0));
        let other = s.open(t0).expect("random");
        assert_ne!(id, other);
        // Kept by digest, not by id.
        let open = s.open.lock().expect("lock");
        assert!(!open.keys().any(|k| k.as_slice() == id.as_bytes()));
        drop(open);
        assert!(s.valid(&id, t0 + SESSION_TTL - Duration::from_secs(1)));
        assert!(!s.valid(&id, t0 + SESSION_TTL), "expired");
        s.close(&id);
        assert!(!s.valid(&id, t0));
        assert!(s.valid(&other, t0));
    }

    #[test]
    fn sessions_past_the_cap_drop_the_oldest() {
        let s = Sessions::default();
        let t0 = Instant::now();
        let first = s.open(t0).expect("random");
        for k in 1..MAX_SESSIONS {
            s.open(t0 + Duration::from_millis(k as u64))
                .expect("random");
        }
        assert!(s.valid(&first, t0 + Duration::from_secs(60)));
        let last = s.open(t0 + Duration::from_secs(61)).expect("random");
        assert!(
            !s.valid(&first, t0 + Duration::from_secs(61)),
            "the oldest went"
        );
        assert!(s.valid(&last, t0 + Duration::from_secs(61)));
        assert_eq!(s.open.lock().expect("lock").len(), MAX_SESSIONS);
    }

    #[test]
    fn failed_logins_lock_an_address_out_for_the_rest_of_the_window() {
        let d = DashboardState::default();
        let t0 = Instant::now();
        let a: Option<IpAddr> = Some([10, 0, 0, 1].into());
        let b: Option<IpAddr> = Some([10, 0, 0, 2].into());
        for _ in 0..LOGIN_FAILURES - 1 {
            d.failed(a, t0);
        }
        assert_eq!(d.locked_out(a, t0), None, "one failure left");
        d.failed(a, t0);
        let wait = d
            .locked_out(a, t0 + Duration::from_secs(10))
            .expect("locked");
        assert_eq!(wait, LOGIN_WINDOW - Duration::from_secs(10));
        assert_eq!(d.locked_out(b, t0), None, "another address is not");
        assert_eq!(d.locked_out(a, t0 + LOGIN_WINDOW), None, "the window ended");
        // A success forgets the failures.
        d.failed(b, t0);
        d.succeeded(b);
        assert!(d.failures.lock().expect("lock").get(&b).is_none());
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
