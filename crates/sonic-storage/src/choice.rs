//! Which store a daemon uses, as its configuration names it, and how it is told to a joining
//! agent ([`sonic_api::control::StoreSpec`]).

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use sonic_api::control::StoreSpec;

use crate::s3::{S3Config, S3Store};
use crate::{ObjectStore, StoreError, Throttle};

/// Where `remote` files go: the `store` setting of the control plane and of the agents.
///
/// ```yaml
/// store: { s3: { endpoint: http://store:8333, bucket: sonic, access_key: ..., secret_key: ... } }
/// # or, on one machine only:
/// store: { local: { root: /var/lib/sonic/store } }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum StoreChoice {
    /// An S3-compatible endpoint.
    S3(S3Config),
    /// A directory shared by every daemon of this machine (tests, single-machine clusters).
    Local { root: PathBuf },
}

impl StoreChoice {
    /// Opens the store (for S3: makes the bucket if it is missing, waiting up to
    /// `outage_window_ms` for a store that does not answer yet — a daemon may start before its
    /// store — and rides out later outages as long); S3 traffic goes through `throttle` when
    /// given.
    pub async fn open(
        &self,
        throttle: Option<Throttle>,
    ) -> Result<Arc<dyn ObjectStore>, StoreError> {
        Ok(match self {
            StoreChoice::Local { root } => Arc::new(crate::local::LocalStore::new(root)?),
            StoreChoice::S3(cfg) => {
                let mut store = S3Store::new(cfg.clone())?;
                if let Some(t) = throttle {
                    store = store.with_throttle(t);
                }
                let deadline = std::time::Instant::now()
                    + std::time::Duration::from_millis(cfg.outage_window_ms);
                let mut delay = std::time::Duration::from_millis(100);
                loop {
                    match store.ensure_bucket().await {
                        Ok(()) => break,
                        Err(StoreError::Unavailable(why))
                            if std::time::Instant::now() + delay < deadline =>
                        {
                            tracing::warn!(
                                endpoint = %cfg.endpoint,
                                error = %why,
                                "the object store does not answer yet: waiting"
                            );
                            tokio::time::sleep(delay).await;
                            delay = (delay * 2).min(std::time::Duration::from_secs(2));
                        }
                        Err(e) => return Err(e),
                    }
                }
                Arc::new(cfg.patient(store))
            }
        })
    }

    /// The S3 bucket, if any (outputs are named `s3://<bucket>/<key>`).
    pub fn bucket(&self) -> Option<&str> {
        match self {
            StoreChoice::S3(cfg) => Some(&cfg.bucket),
            StoreChoice::Local { .. } => None,
        }
    }

    /// Where the store is, for logs and reports (no credentials).
    pub fn describe(&self) -> String {
        match self {
            StoreChoice::S3(cfg) => format!("{} bucket {}", cfg.endpoint, cfg.bucket),
            StoreChoice::Local { root } => root.display().to_string(),
        }
    }

    /// As told to a joining agent.
    pub fn to_spec(&self) -> StoreSpec {
        match self {
            StoreChoice::S3(cfg) => StoreSpec::S3 {
                endpoint: cfg.endpoint.clone(),
                region: cfg.region.clone(),
                bucket: cfg.bucket.clone(),
                access_key: cfg.access_key.clone(),
                secret_key: cfg.secret_key.clone(),
                outage_window_ms: cfg.outage_window_ms,
            },
            StoreChoice::Local { root } => StoreSpec::Local {
                root: root.display().to_string(),
            },
        }
    }

    /// What a joining agent was told (the tunables an agent keeps at their defaults).
    pub fn from_spec(spec: &StoreSpec) -> StoreChoice {
        match spec {
            StoreSpec::S3 {
                endpoint,
                region,
                bucket,
                access_key,
                secret_key,
                outage_window_ms,
            } => {
                let mut cfg = S3Config::new(endpoint, bucket, access_key, secret_key);
                cfg.region = region.clone();
                cfg.outage_window_ms = *outage_window_ms;
                StoreChoice::S3(cfg)
            }
            StoreSpec::Local { root } => StoreChoice::Local {
                root: PathBuf::from(root),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trip_and_yaml() {
        let mut cfg = S3Config::new("http://s:8333", "b", "ak", "sk");
        let s3 = StoreChoice::S3(cfg.clone());
        cfg.outage_window_ms = 5_000;
        let short = StoreChoice::S3(cfg);
        assert_eq!(
            StoreChoice::from_spec(&short.to_spec()),
            short,
            "the window travels too"
        );
        assert_eq!(s3.bucket(), Some("b"));
        assert!(!s3.describe().contains("sk"), "no secret in descriptions");
        let local = StoreChoice::Local {
            root: PathBuf::from("/x"),
        };
        assert_eq!(StoreChoice::from_spec(&local.to_spec()), local);
        let parsed: StoreChoice = serde_saphyr::from_str(
            "s3: { endpoint: 'http://s:8333', bucket: b, access_key: ak, secret_key: sk }\n",
        )
        .unwrap();
        assert_eq!(parsed, s3);
        assert!(serde_saphyr::from_str::<StoreChoice>("ftp: {}\n").is_err());
    }

    #[tokio::test]
    async fn a_store_that_never_answers_fails_after_the_window() {
        // Nothing listens on port 9 of loopback: every attempt is refused at once.
        let mut cfg = S3Config::new("http://127.0.0.1:9", "b", "ak", "sk");
        cfg.outage_window_ms = 300;
        cfg.max_attempts = 1;
        let err = StoreChoice::S3(cfg)
            .open(None)
            .await
            .expect_err("no store answers");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    }

    #[tokio::test]
    async fn a_store_that_starts_late_is_waited_for() {
        // A port that is free now; an S3-ish server starts on it after a moment: any HTTP
        // answer to the bucket check that is not a connection refusal ends the wait.
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let mut cfg = S3Config::new(format!("http://{addr}"), "b", "ak", "sk");
        cfg.outage_window_ms = 20_000;
        cfg.max_attempts = 1;
        let late = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(700)).await;
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            // Answer every request 200 with an empty body (HEAD bucket: it exists).
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 4096];
                    let _ = sock.read(&mut buf).await;
                    let _ = sock
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .await;
                });
            }
        });
        let opened = StoreChoice::S3(cfg).open(None).await;
        late.abort();
        assert!(opened.is_ok(), "waited for the store: {:?}", opened.err());
    }
}
