//! An object store held in memory, for unit tests of the crates that use [`ObjectStore`].

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;

use crate::{ObjectInfo, ObjectStore, StoreError, fsutil, validate_key, validate_prefix};

/// Objects in a `BTreeMap`, so listings come out in key order for free.
#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, Bytes>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every key, in order; handy for assertions in tests.
    pub fn keys(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Bytes>> {
        // A panic while holding the lock cannot leave the map half-updated (every update is one
        // insert or remove), so a poisoned lock is still safe to use.
        self.objects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn get(&self, key: &str) -> Result<Bytes, StoreError> {
        validate_key(key)?;
        self.lock()
            .get(key)
            .cloned()
            .ok_or_else(|| StoreError::NotFound(key.to_owned()))
    }
}

#[async_trait::async_trait]
impl ObjectStore for MemoryStore {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        validate_key(key)?;
        let data = Bytes::from(tokio::fs::read(path).await?);
        let size = data.len() as u64;
        self.lock().insert(key.to_owned(), data);
        Ok(size)
    }

    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        let data = self.get(key)?;
        let path = path.to_owned();
        fsutil::blocking(move || {
            fsutil::write_atomic(&path, &data, false)?;
            Ok(data.len() as u64)
        })
        .await
    }

    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        validate_key(key)?;
        self.lock().insert(key.to_owned(), data);
        Ok(())
    }

    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
        self.get(key)
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        validate_key(key)?;
        Ok(self.lock().get(key).map(|data| data.len() as u64))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        validate_prefix(prefix)?;
        Ok(self
            .lock()
            .range(prefix.to_owned()..)
            .take_while(|(key, _)| key.starts_with(prefix))
            .map(|(key, data)| ObjectInfo {
                key: key.clone(),
                size: data.len() as u64,
            })
            .collect())
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        validate_key(key)?;
        self.lock().remove(key);
        Ok(())
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        validate_prefix(prefix)?;
        let mut objects = self.lock();
        let before = objects.len();
        objects.retain(|key, _| !key.starts_with(prefix));
        Ok(before - objects.len())
    }
}
