//! A daemon's route table: each route once, with its method, path template, guard and handler.
//!
//! The router is built from the table, each guard's routes behind what the daemon puts around
//! that guard, and the same table lists the routes for the tests that walk them and the documents
//! that describe them: a route cannot be served without its guard, nor listed without being
//! served. The guard type is the daemon's own (`G`), so a `match` on it names every guard.

use std::fmt;

use axum::Router;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{MethodFilter, MethodRouter};

/// One route as the table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route<G> {
    pub method: Method,
    /// The path template, `{param}` for a path parameter (as axum and OpenAPI both write it).
    pub path: &'static str,
    /// Who may call it.
    pub guard: G,
}

/// A daemon's routes with their handlers, on the router state `S`, guarded by a `G`.
pub struct RouteTable<S, G> {
    entries: Vec<(Route<G>, MethodRouter<S>)>,
}

impl<S, G: fmt::Debug> fmt::Debug for RouteTable<S, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(route, _)| route))
            .finish()
    }
}

impl<S, G> Default for RouteTable<S, G> {
    fn default() -> Self {
        RouteTable {
            entries: Vec::new(),
        }
    }
}

impl<S, G> RouteTable<S, G>
where
    S: Clone + Send + Sync + 'static,
    G: Copy + PartialEq + fmt::Debug,
{
    /// An empty table.
    pub fn new() -> Self {
        RouteTable::default()
    }

    /// The table with `handler` answering `method path`, behind `guard`.
    ///
    /// # Panics
    ///
    /// When the table has `method path` already, or `method` is not one a router can match
    /// (`GET`, `POST`, ...): the table is a constant of the daemon, and its tests build it.
    pub fn route<H, T>(mut self, method: Method, path: &'static str, guard: G, handler: H) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        if self
            .entries
            .iter()
            .any(|(r, _)| r.method == method && r.path == path)
        {
            panic!("{method} {path} is twice in the route table");
        }
        let filter = match MethodFilter::try_from(method.clone()) {
            Ok(filter) => filter,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let route = Route {
            method,
            path,
            guard,
        };
        self.entries
            .push((route, axum::routing::on(filter, handler)));
        self
    }

    /// Every route, in the table's order.
    pub fn routes(&self) -> Vec<Route<G>> {
        self.entries
            .iter()
            .map(|(route, _)| route.clone())
            .collect()
    }

    /// The router: the routes of each guard together, passed through `guard` (which puts the
    /// guard's check around them, typically as a `route_layer`, so that the check runs only on
    /// matched routes and before any extractor reads the request), then merged.
    pub fn router(self, mut guard: impl FnMut(G, Router<S>) -> Router<S>) -> Router<S> {
        let mut groups: Vec<(G, Router<S>)> = Vec::new();
        for (route, handler) in self.entries {
            match groups.iter().position(|(g, _)| *g == route.guard) {
                Some(i) => {
                    let routes = std::mem::take(&mut groups[i].1);
                    groups[i].1 = routes.route(route.path, handler);
                }
                None => groups.push((route.guard, Router::new().route(route.path, handler))),
            }
        }
        groups.into_iter().fold(Router::new(), |all, (g, routes)| {
            all.merge(guard(g, routes))
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::middleware::{self, Next};
    use axum::response::{IntoResponse, Response};
    use tower::ServiceExt;

    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Guard {
        Open,
        Closed,
    }

    fn table() -> RouteTable<(), Guard> {
        RouteTable::new()
            .route(Method::GET, "/open", Guard::Open, || async { "open" })
            .route(Method::GET, "/closed", Guard::Closed, || async { "closed" })
            .route(Method::POST, "/open", Guard::Open, || async { "posted" })
            .route(Method::DELETE, "/open/{id}", Guard::Closed, || async {
                "deleted"
            })
    }

    async fn refuse(_req: Request<Body>, _next: Next) -> Response {
        StatusCode::UNAUTHORIZED.into_response()
    }

    async fn status(router: &Router, method: Method, uri: &str) -> StatusCode {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .expect("request");
        router.clone().oneshot(req).await.expect("answer").status()
    }

    #[test]
    fn lists_every_route_in_order() {
        let listed: Vec<(Method, &str, Guard)> = table()
            .routes()
            .into_iter()
            .map(|r| (r.method, r.path, r.guard))
            .collect();
        assert_eq!(
            listed,
            [
                (Method::GET, "/open", Guard::Open),
                (Method::GET, "/closed", Guard::Closed),
                (Method::POST, "/open", Guard::Open),
                (Method::DELETE, "/open/{id}", Guard::Closed),
            ]
        );
    }

    #[tokio::test]
    async fn each_guard_wraps_its_own_routes_only() {
        let mut seen = Vec::new();
        let router = table().router(|g, routes| {
            seen.push(g);
            match g {
                Guard::Open => routes,
                Guard::Closed => routes.route_layer(middleware::from_fn(refuse)),
            }
        });
        assert_eq!(seen, [Guard::Open, Guard::Closed], "once per guard");
        assert_eq!(status(&router, Method::GET, "/open").await, StatusCode::OK);
        assert_eq!(status(&router, Method::POST, "/open").await, StatusCode::OK);
        let closed = StatusCode::UNAUTHORIZED;
        assert_eq!(status(&router, Method::GET, "/closed").await, closed);
        assert_eq!(status(&router, Method::DELETE, "/open/1").await, closed);
        // Routed by the table's methods only; no guard sees a path no route matches.
        assert_eq!(
            status(&router, Method::PUT, "/open").await,
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            status(&router, Method::GET, "/nowhere").await,
            StatusCode::NOT_FOUND
        );
    }

    #[test]
    #[should_panic(expected = "GET /open is twice in the route table")]
    fn a_route_twice_is_refused() {
        let _ = table().route(Method::GET, "/open", Guard::Closed, || async { "again" });
    }
}
