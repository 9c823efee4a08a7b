//! The control plane's HTTP API as `ofctl` calls it: bearer token, JSON, and refusals turned into
//! one-line errors (a route this control plane does not serve yet says so).

use std::time::Duration;

use anyhow::anyhow;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use crate::config::Target;

/// Why a request did not get a success answer.
#[derive(Debug)]
pub enum RequestError {
    /// No answer at all.
    Unreachable { server: String, reason: String },
    /// The control plane has no such route (an older version): `what` is `GET /v1/...`.
    RouteMissing { what: String },
    /// An answer with an error status; `message` is the server's `error` field.
    Refused { status: StatusCode, message: String },
    /// A success status with a body that does not decode.
    BadAnswer { what: String, reason: String },
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Unreachable { server, reason } => {
                write!(f, "cannot reach the control plane at {server}: {reason}")
            }
            RequestError::RouteMissing { what } => write!(
                f,
                "this control plane does not serve {what} yet (no such route): update it"
            ),
            RequestError::Refused { status, message } if *status == StatusCode::UNAUTHORIZED => {
                write!(
                    f,
                    "the control plane refused the token ({message}): set SONIC_TOKEN, or run `ofctl up` again"
                )
            }
            RequestError::Refused { status, message } => {
                write!(f, "{message} (HTTP {})", status.as_u16())
            }
            RequestError::BadAnswer { what, reason } => {
                write!(f, "unexpected answer to {what}: {reason}")
            }
        }
    }
}

impl std::error::Error for RequestError {}

impl RequestError {
    pub fn is_route_missing(&self) -> bool {
        matches!(self, RequestError::RouteMissing { .. })
    }

    pub fn status(&self) -> Option<StatusCode> {
        match self {
            RequestError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client of one control plane.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    target: Target,
}

impl Client {
    pub fn new(target: Target) -> anyhow::Result<Client> {
        let http = sonic_daemon::tls::client_builder(target.ca_file.as_deref())?
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| anyhow!("http client: {e}"))?;
        Ok(Client { http, target })
    }

    pub fn server(&self) -> &str {
        &self.target.server
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let r = self
            .http
            .request(method, format!("{}{path}", self.target.server));
        match &self.target.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    /// Sends and returns the response when its status is a success.
    pub async fn send(&self, what: &str, req: RequestBuilder) -> Result<Response, RequestError> {
        let r = req.send().await.map_err(|e| RequestError::Unreachable {
            server: self.target.server.clone(),
            reason: root_cause(&e),
        })?;
        if r.status().is_success() {
            return Ok(r);
        }
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| {
                let t = text.trim();
                if t.is_empty() {
                    status
                        .canonical_reason()
                        .unwrap_or("refused")
                        .to_lowercase()
                } else {
                    t.chars().take(300).collect()
                }
            });
        let missing = (status == StatusCode::NOT_FOUND && message == "no such route")
            || status == StatusCode::METHOD_NOT_ALLOWED;
        if missing {
            return Err(RequestError::RouteMissing {
                what: what.to_owned(),
            });
        }
        Err(RequestError::Refused { status, message })
    }

    /// `GET path` as JSON.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, RequestError> {
        let what = format!("GET {}", route_of(path));
        let r = self.send(&what, self.request(Method::GET, path)).await?;
        decode(&what, r).await
    }

    /// `POST path` with a JSON body; the answer as JSON.
    pub async fn post<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, RequestError> {
        let what = format!("POST {}", route_of(path));
        let r = self
            .send(&what, self.request(Method::POST, path).json(body))
            .await?;
        decode(&what, r).await
    }

    /// [`Client::post`] with an `Idempotency-Key` header when `key` is given.
    pub async fn post_keyed<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        key: Option<&str>,
    ) -> Result<T, RequestError> {
        let what = format!("POST {}", route_of(path));
        let mut req = self.request(Method::POST, path).json(body);
        if let Some(k) = key {
            req = req.header("idempotency-key", k);
        }
        let r = self.send(&what, req).await?;
        decode(&what, r).await
    }

    /// `PUT path` with a YAML body; the status and the answer as JSON.
    pub async fn put_yaml<T: DeserializeOwned>(
        &self,
        path: &str,
        body: String,
    ) -> Result<(StatusCode, T), RequestError> {
        let what = format!("PUT {}", route_of(path));
        let r = self
            .send(
                &what,
                self.request(Method::PUT, path)
                    .header("content-type", "application/yaml")
                    .body(body),
            )
            .await?;
        let status = r.status();
        Ok((status, decode(&what, r).await?))
    }

    /// `PUT path` with raw bytes as the body; the answer's status.
    pub async fn put_bytes(&self, path: &str, body: Vec<u8>) -> Result<StatusCode, RequestError> {
        let what = format!("PUT {}", route_of(path));
        let r = self
            .send(
                &what,
                self.request(Method::PUT, path)
                    .header("content-type", "application/octet-stream")
                    .body(body),
            )
            .await?;
        Ok(r.status())
    }

    /// `POST path` without a body; the answer as JSON.
    pub async fn post_empty<T: DeserializeOwned>(&self, path: &str) -> Result<T, RequestError> {
        let what = format!("POST {}", route_of(path));
        let r = self.send(&what, self.request(Method::POST, path)).await?;
        decode(&what, r).await
    }

    /// `DELETE path`; the answer's status.
    pub async fn delete(&self, path: &str) -> Result<StatusCode, RequestError> {
        let what = format!("DELETE {}", route_of(path));
        let r = self.send(&what, self.request(Method::DELETE, path)).await?;
        Ok(r.status())
    }

    /// `GET path`, the response itself (for streams: events, downloads).
    pub async fn get_raw(&self, path: &str) -> Result<Response, RequestError> {
        let what = format!("GET {}", route_of(path));
        self.send(&what, self.request(Method::GET, path)).await
    }
}

async fn decode<T: DeserializeOwned>(what: &str, r: Response) -> Result<T, RequestError> {
    let bytes = r.bytes().await.map_err(|e| RequestError::BadAnswer {
        what: what.to_owned(),
        reason: root_cause(&e),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| RequestError::BadAnswer {
        what: what.to_owned(),
        reason: e.to_string(),
    })
}

/// The path without its query, for messages.
fn route_of(path: &str) -> &str {
    path.split('?').next().unwrap_or(path)
}

/// The innermost error's message: reqwest's outer ones say only "error sending request".
fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Percent-encodes one path segment or query value (everything but unreserved characters).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// [`encode`] for each `/`-separated segment, keeping the slashes.
pub fn encode_path(s: &str) -> String {
    s.split('/').map(encode).collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoding() {
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        assert_eq!(encode_path("reduce/0/part-0"), "reduce/0/part-0");
        assert_eq!(encode_path("x y/z"), "x%20y/z");
    }
}
