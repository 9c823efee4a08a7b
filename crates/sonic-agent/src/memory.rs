//! The in-memory tier `memory` edges pass through (Redis, `sonic_storage::redis`): connected
//! on first use, and again after a failed connection, so that an agent starts whether or not
//! the tier is up. Transfers are charged to the agent's emulated NIC (its throttle) as the
//! store's are, so that `ofctl up`'s one-process cluster passes them at the VM's rate.

use std::path::Path;
use std::sync::Arc;

use sonic_storage::redis::{NAMESPACE, RedisStore};
use sonic_storage::{ObjectStore, StoreError, Throttle};

/// The agent's memory tier, if it has one.
#[derive(Debug)]
pub struct MemoryTier {
    url: Option<String>,
    store: tokio::sync::OnceCell<Arc<RedisStore>>,
    throttle: Throttle,
}

impl MemoryTier {
    /// The tier at `url` (none: `memory` files go to the store), charged to `throttle`.
    pub fn new(url: Option<String>, throttle: Throttle) -> MemoryTier {
        MemoryTier {
            url,
            store: tokio::sync::OnceCell::new(),
            throttle,
        }
    }

    /// Whether the agent was given a tier.
    pub fn configured(&self) -> bool {
        self.url.is_some()
    }

    async fn store(&self) -> Result<&Arc<RedisStore>, StoreError> {
        let Some(url) = &self.url else {
            return Err(StoreError::Unavailable(
                "this agent has no memory tier (memory_tier, SONIC_AGENT_MEMORY_TIER)".into(),
            ));
        };
        self.store
            .get_or_try_init(|| async { RedisStore::connect(url, NAMESPACE).await.map(Arc::new) })
            .await
    }

    /// Puts the file at `local` as `key`; its size.
    pub async fn put_file(&self, key: &str, local: &Path) -> Result<u64, StoreError> {
        let bytes = self
            .again(|store| async move { store.put_file(key, local).await })
            .await?;
        charge(&self.throttle.egress, bytes).await;
        Ok(bytes)
    }

    /// Gets `key` into `dest` (atomically); its size.
    pub async fn get_file(&self, key: &str, dest: &Path) -> Result<u64, StoreError> {
        let bytes = self
            .again(|store| async move { store.get_file(key, dest).await })
            .await?;
        charge(&self.throttle.ingress, bytes).await;
        Ok(bytes)
    }

    /// Runs `op`, again up to [`ATTEMPTS`] times while the tier is unavailable: the call that
    /// finds a connection broken (a tier restarted since) fails while the connection is made
    /// again, and the next one goes through. A tier that stays down fails within about
    /// [`ATTEMPTS`] × [`PAUSE`] beyond its own timeouts.
    async fn again<'a, T, F, Fut>(&'a self, op: F) -> Result<T, StoreError>
    where
        F: Fn(&'a RedisStore) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let mut attempt = 1;
        loop {
            let result = match self.store().await {
                Ok(store) => op(store).await,
                Err(e) => Err(e),
            };
            match result {
                Err(StoreError::Unavailable(_)) if attempt < ATTEMPTS && self.configured() => {
                    attempt += 1;
                    tokio::time::sleep(PAUSE).await;
                }
                other => return other,
            }
        }
    }
}

/// Tries of one transfer while the tier is unavailable.
const ATTEMPTS: u32 = 3;
/// The pause between them.
const PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Charges `bytes` to one direction of the emulated NIC (nothing when it is not limited).
async fn charge(limiter: &async_speed_limit::Limiter, bytes: u64) {
    if limiter.speed_limit().is_infinite() {
        return;
    }
    const CHUNK: u64 = 1 << 20;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK);
        limiter.consume(n as usize).await;
        left -= n;
    }
}
