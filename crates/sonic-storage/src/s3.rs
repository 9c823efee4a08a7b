//! An object store on any S3-compatible endpoint (AWS S3, MinIO, Ceph RGW, SeaweedFS).
//!
//! The SDK client is configured by hand from [`S3Config`]: static credentials, path-style addressing,
//! checksums only where an operation requires them (S3 clones differ in what they accept), and the
//! SDK's standard retries. No `aws-config`, so nothing ever probes instance metadata or profiles.
//! Large files go up as concurrent multipart parts and come down as concurrent ranged GETs into a
//! temporary file that is renamed into place.

use std::io::SeekFrom;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use async_speed_limit::Limiter;
use aws_sdk_s3::Client;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart, Delete, ObjectIdentifier};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt, BufWriter};

use crate::fsutil::{self, TempFile};
use crate::{ObjectInfo, ObjectStore, StoreError, Throttle, validate_key, validate_prefix};

/// The smallest part S3 accepts (except for the last part of an upload).
pub const MIN_PART_SIZE: u64 = 5 * 1024 * 1024;
/// The largest part S3 accepts.
pub const MAX_PART_SIZE: u64 = 5 * 1024 * 1024 * 1024;
/// S3 allows at most this many parts per upload; larger files get larger parts.
const MAX_PARTS: u64 = 10_000;
/// S3 deletes at most this many keys per DeleteObjects call.
const DELETE_BATCH: usize = 1000;

/// Where and how to reach the store; deserializable from the YAML config of the agent or control plane.
///
/// ```yaml
/// endpoint: http://127.0.0.1:8333
/// bucket: sonic
/// access_key: sonic
/// secret_key: sonicsecret
/// # optional: region (us-east-1), part_size (16 MiB, in bytes), concurrency (4), max_attempts (4),
/// # outage_window_ms (30000)
/// ```
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// `http://host:port` or `https://host`; for AWS, `https://s3.<region>.amazonaws.com`.
    pub endpoint: String,
    #[serde(default = "default_region")]
    pub region: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    /// Files larger than this are uploaded in parts of this size, and downloaded in ranges of it.
    #[serde(default = "default_part_size")]
    pub part_size: u64,
    /// Parts or ranges in flight at once, per transfer.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Attempts per request, including the first (the SDK's standard retry mode with backoff).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// How long an outage of the store is waited out (milliseconds) before an operation fails;
    /// see [`crate::patient::Patient`], which [`S3Config::patient`] uses.
    #[serde(default = "default_outage_window_ms")]
    pub outage_window_ms: u64,
}

fn default_region() -> String {
    "us-east-1".to_owned()
}
fn default_part_size() -> u64 {
    16 * 1024 * 1024
}
fn default_concurrency() -> usize {
    4
}
fn default_max_attempts() -> u32 {
    4
}
fn default_outage_window_ms() -> u64 {
    30_000
}

impl S3Config {
    /// A config with the defaults for everything but the endpoint, bucket and credentials.
    pub fn new(
        endpoint: impl Into<String>,
        bucket: impl Into<String>,
        access_key: impl Into<String>,
        secret_key: impl Into<String>,
    ) -> S3Config {
        S3Config {
            endpoint: endpoint.into(),
            region: default_region(),
            bucket: bucket.into(),
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            part_size: default_part_size(),
            concurrency: default_concurrency(),
            max_attempts: default_max_attempts(),
            outage_window_ms: default_outage_window_ms(),
        }
    }

    /// How a store of this config waits out outages.
    pub fn patience(&self) -> crate::patient::Patience {
        crate::patient::Patience {
            window: Duration::from_millis(self.outage_window_ms),
            ..crate::patient::Patience::default()
        }
    }

    /// `store` wrapped to ride out outages of this endpoint for `outage_window_ms`.
    pub fn patient(&self, store: S3Store) -> crate::patient::Patient<S3Store> {
        crate::patient::Patient::new(store, self.endpoint.clone(), self.patience())
    }
}

// Hand-written so the secret never reaches a log.
impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("access_key", &self.access_key)
            .field("secret_key", &"<redacted>")
            .field("part_size", &self.part_size)
            .field("concurrency", &self.concurrency)
            .field("max_attempts", &self.max_attempts)
            .field("outage_window_ms", &self.outage_window_ms)
            .finish()
    }
}

/// An [`ObjectStore`] on one bucket of an S3-compatible service.
#[derive(Clone)]
pub struct S3Store {
    client: Client,
    endpoint: String,
    bucket: String,
    part_size: u64,
    concurrency: usize,
    throttle: Option<Throttle>,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Store")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("part_size", &self.part_size)
            .field("concurrency", &self.concurrency)
            .field("throttled", &self.throttle.is_some())
            .finish()
    }
}

impl S3Store {
    /// Builds the client; contacts nothing (see [`S3Store::ensure_bucket`]).
    pub fn new(cfg: S3Config) -> Result<S3Store, StoreError> {
        let invalid = |msg: String| Err(StoreError::Other(format!("invalid s3 config: {msg}")));
        if !(cfg.endpoint.starts_with("http://") || cfg.endpoint.starts_with("https://")) {
            return invalid(format!(
                "endpoint {:?} must start with http:// or https://",
                cfg.endpoint
            ));
        }
        if cfg.bucket.is_empty() {
            return invalid("bucket is empty".to_owned());
        }
        if !(MIN_PART_SIZE..=MAX_PART_SIZE).contains(&cfg.part_size) {
            return invalid(format!(
                "part_size {} is outside {MIN_PART_SIZE}..={MAX_PART_SIZE} bytes",
                cfg.part_size
            ));
        }
        if cfg.concurrency == 0 || cfg.max_attempts == 0 {
            return invalid("concurrency and max_attempts must be at least 1".to_owned());
        }
        let credentials = Credentials::new(
            cfg.access_key.clone(),
            cfg.secret_key.clone(),
            None,
            None,
            "sonic-static",
        );
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(cfg.endpoint.clone())
            .force_path_style(true)
            .credentials_provider(credentials)
            .region(Region::new(cfg.region.clone()))
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .retry_config(RetryConfig::standard().with_max_attempts(cfg.max_attempts))
            // Fail fast on a dead endpoint; no overall timeout, since a throttled multi-GiB
            // transfer legitimately takes minutes.
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .build(),
            )
            .build();
        Ok(S3Store {
            client: Client::from_conf(config),
            endpoint: cfg.endpoint,
            bucket: cfg.bucket,
            part_size: cfg.part_size,
            concurrency: cfg.concurrency,
            throttle: None,
        })
    }

    /// Sends uploads through `throttle.egress` and downloads through `throttle.ingress`.
    pub fn with_throttle(mut self, throttle: Throttle) -> S3Store {
        self.throttle = Some(throttle);
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn part_size(&self) -> u64 {
        self.part_size
    }

    /// Creates the bucket when it does not exist yet.
    pub async fn ensure_bucket(&self) -> Result<(), StoreError> {
        match self.client.head_bucket().bucket(&self.bucket).send().await {
            Ok(_) => return Ok(()),
            // HEAD has no body, so no error code to tell a missing bucket from anything else.
            Err(e) if e.raw_response().map(|r| r.status().as_u16()) == Some(404) => {}
            Err(e) => return Err(map_err(e, &self.bucket)),
        }
        match self
            .client
            .create_bucket()
            .bucket(&self.bucket)
            .send()
            .await
        {
            Ok(_) => {
                tracing::info!(bucket = %self.bucket, endpoint = %self.endpoint, "created bucket");
                Ok(())
            }
            // Someone else (another agent) created it in between.
            Err(e) if matches!(e.code(), Some("BucketAlreadyOwnedByYou")) => Ok(()),
            Err(e) => Err(map_err(e, &self.bucket)),
        }
    }

    /// Deletes every object of the bucket, then the bucket (for tests and teardown).
    pub async fn delete_bucket(&self) -> Result<(), StoreError> {
        self.delete_prefix("").await?;
        self.client
            .delete_bucket()
            .bucket(&self.bucket)
            .send()
            .await
            .map_err(|e| map_err(e, &self.bucket))?;
        Ok(())
    }

    fn egress(&self) -> Option<&Limiter> {
        self.throttle.as_ref().map(|t| &t.egress)
    }

    fn ingress(&self) -> Option<&Limiter> {
        self.throttle.as_ref().map(|t| &t.ingress)
    }

    /// Size and ETag of an object, `None` when it does not exist.
    async fn stat(&self, key: &str) -> Result<Option<(u64, Option<String>)>, StoreError> {
        match self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => {
                let size = non_negative(out.content_length(), key)?;
                Ok(Some((size, out.e_tag().map(str::to_owned))))
            }
            Err(e) => match map_err(e, key) {
                StoreError::NotFound(_) => Ok(None),
                other => Err(other),
            },
        }
    }

    async fn put_object(&self, key: &str, body: Bytes) -> Result<(), StoreError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| map_err(e, key))?;
        Ok(())
    }

    async fn put_multipart(&self, key: &str, path: &Path, size: u64) -> Result<(), StoreError> {
        // Keep within S3's part count for very large files.
        let part_size = self.part_size.max(size.div_ceil(MAX_PARTS));
        let created = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_err(e, key))?;
        let upload_id = created
            .upload_id()
            .ok_or_else(|| StoreError::Other(format!("no upload id for {key}")))?
            .to_owned();
        let mut guard = AbortOnDrop {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: key.to_owned(),
            upload_id: upload_id.clone(),
            armed: true,
        };
        let parts = size.div_ceil(part_size);
        tracing::debug!(key, size, part_size, parts, "multipart upload");
        let result = self
            .upload_parts(key, path, &upload_id, size, part_size)
            .await;
        let result = match result {
            Ok(parts) => self.complete_multipart(key, &upload_id, parts).await,
            Err(e) => Err(e),
        };
        guard.armed = false;
        if let Err(e) = &result {
            tracing::warn!(key, error = %e, "multipart upload failed; aborting it");
            abort_upload(&self.client, &self.bucket, key, &upload_id).await;
        }
        result
    }

    async fn upload_parts(
        &self,
        key: &str,
        path: &Path,
        upload_id: &str,
        size: u64,
        part_size: u64,
    ) -> Result<Vec<CompletedPart>, StoreError> {
        let ranges = (0..size.div_ceil(part_size)).map(|i| {
            let offset = i * part_size;
            // Part numbers start at 1; at most MAX_PARTS, so the cast cannot truncate.
            (i as i32 + 1, offset, part_size.min(size - offset))
        });
        let mut parts: Vec<CompletedPart> = futures::stream::iter(ranges)
            .map(|(number, offset, len)| {
                self.upload_part(key, path, upload_id, number, offset, len)
            })
            .buffer_unordered(self.concurrency)
            .try_collect()
            .await?;
        parts.sort_by_key(|p| p.part_number());
        Ok(parts)
    }

    async fn upload_part(
        &self,
        key: &str,
        path: &Path,
        upload_id: &str,
        number: i32,
        offset: u64,
        len: u64,
    ) -> Result<CompletedPart, StoreError> {
        let body = read_range(path, offset, len, self.egress()).await?;
        let out = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .part_number(number)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| map_err(e, key))?;
        Ok(CompletedPart::builder()
            .part_number(number)
            .set_e_tag(out.e_tag().map(str::to_owned))
            .build())
    }

    async fn complete_multipart(
        &self,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletedPart>,
    ) -> Result<(), StoreError> {
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(key)
            .upload_id(upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(parts))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| map_err(e, key))?;
        Ok(())
    }

    /// Downloads the whole object into `temp`; returns its size.
    async fn download_whole(&self, key: &str, temp: &Path) -> Result<u64, StoreError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_err(e, key))?;
        let expected = out.content_length();
        let file = tokio::fs::OpenOptions::new().write(true).open(temp).await?;
        let mut writer = BufWriter::with_capacity(WRITE_BUFFER, file);
        let got = copy_body(out.body, self.ingress(), &mut writer, key).await?;
        writer.flush().await?;
        if let Some(expected) = expected
            && u64::try_from(expected).ok() != Some(got)
        {
            return Err(StoreError::Unavailable(format!(
                "short read of {key}: {got} of {expected} bytes"
            )));
        }
        Ok(got)
    }

    /// Downloads `len` bytes at `offset` into the same place of `temp`.
    async fn download_range(
        &self,
        key: &str,
        etag: Option<&str>,
        temp: &Path,
        offset: u64,
        len: u64,
    ) -> Result<(), StoreError> {
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .range(format!("bytes={}-{}", offset, offset + len - 1))
            // Every range must come from the same version of the object: an overwrite during the
            // download fails it (412) instead of mixing two versions.
            .set_if_match(etag.map(str::to_owned))
            .send()
            .await
            .map_err(|e| map_err(e, key))?;
        let mut file = tokio::fs::OpenOptions::new().write(true).open(temp).await?;
        file.seek(SeekFrom::Start(offset)).await?;
        let mut writer = BufWriter::with_capacity(WRITE_BUFFER, file);
        let got = copy_body(out.body, self.ingress(), &mut writer, key).await?;
        writer.flush().await?;
        if got != len {
            return Err(StoreError::Unavailable(format!(
                "short read of {key}: {got} of {len} bytes at offset {offset}"
            )));
        }
        Ok(())
    }

    async fn download(
        &self,
        key: &str,
        size: u64,
        etag: Option<&str>,
        temp: &Path,
    ) -> Result<u64, StoreError> {
        if size <= self.part_size {
            return self.download_whole(key, temp).await;
        }
        let ranges = size.div_ceil(self.part_size);
        tracing::debug!(key, size, ranges, "ranged download");
        // Ranges land in any order; sized up front so every write is inside the file. (Only
        // here: a whole-object GET may bring a newer version of another size.)
        tokio::fs::OpenOptions::new()
            .write(true)
            .open(temp)
            .await?
            .set_len(size)
            .await?;
        futures::stream::iter(0..ranges)
            .map(|i| {
                let offset = i * self.part_size;
                let len = self.part_size.min(size - offset);
                self.download_range(key, etag, temp, offset, len)
            })
            .buffer_unordered(self.concurrency)
            .try_collect::<()>()
            .await?;
        Ok(size)
    }
}

const WRITE_BUFFER: usize = 1 << 20;

/// Aborts a multipart upload whose `put_file` future was dropped midway, so its parts do not linger
/// (and cost money) on the server. The normal error path aborts explicitly and disarms this.
struct AbortOnDrop {
    client: Client,
    bucket: String,
    key: String,
    upload_id: String,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let (client, bucket, key, upload_id) = (
                self.client.clone(),
                std::mem::take(&mut self.bucket),
                std::mem::take(&mut self.key),
                std::mem::take(&mut self.upload_id),
            );
            handle.spawn(async move { abort_upload(&client, &bucket, &key, &upload_id).await });
        }
    }
}

async fn abort_upload(client: &Client, bucket: &str, key: &str, upload_id: &str) {
    if let Err(e) = client
        .abort_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(upload_id)
        .send()
        .await
    {
        tracing::warn!(key, upload_id, error = %DisplayErrorContext(&e), "could not abort multipart upload");
    }
}

/// Reads `len` bytes at `offset` of a file, through the limiter when there is one.
async fn read_range(
    path: &Path,
    offset: u64,
    len: u64,
    limiter: Option<&Limiter>,
) -> Result<Bytes, StoreError> {
    let mut file = tokio::fs::File::open(path).await?;
    file.seek(SeekFrom::Start(offset)).await?;
    let reader = file.take(len);
    let mut reader: Pin<Box<dyn AsyncRead + Send>> = match limiter {
        Some(limiter) => Box::pin(limiter.clone().limit(reader)),
        None => Box::pin(reader),
    };
    let capacity = usize::try_from(len)
        .map_err(|_| StoreError::Other(format!("part of {len} bytes does not fit in memory")))?;
    let mut buf = Vec::with_capacity(capacity);
    reader.read_to_end(&mut buf).await?;
    if buf.len() as u64 != len {
        return Err(StoreError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "{} shrank while uploading: {} of {len} bytes at offset {offset}",
                path.display(),
                buf.len()
            ),
        )));
    }
    Ok(Bytes::from(buf))
}

/// Copies a response body into `out`, through the limiter when there is one; returns the byte
/// count. Errors of the body are the network's (`Unavailable`), errors of `out` are local (`Io`).
async fn copy_body<W: AsyncWrite + Unpin>(
    body: ByteStream,
    limiter: Option<&Limiter>,
    out: &mut W,
    key: &str,
) -> Result<u64, StoreError> {
    let reader = body.into_async_read();
    let mut reader: Pin<Box<dyn AsyncRead + Send>> = match limiter {
        Some(limiter) => Box::pin(limiter.clone().limit(reader)),
        None => Box::pin(reader),
    };
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(|e| StoreError::Unavailable(format!("reading {key}: {e}")))?;
        if n == 0 {
            return Ok(total);
        }
        out.write_all(&buf[..n]).await?;
        total += n as u64;
    }
}

fn non_negative(size: Option<i64>, key: &str) -> Result<u64, StoreError> {
    size.and_then(|s| u64::try_from(s).ok())
        .ok_or_else(|| StoreError::Other(format!("no valid size for {key}")))
}

/// Maps an SDK error: a missing object is `NotFound`; what a retry may fix (no connection,
/// timeouts, 5xx, throttling, an object replaced mid-download) is `Unavailable`; the rest `Other`.
fn map_err<E>(err: SdkError<E>, key: &str) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let status = err.raw_response().map(|r| r.status().as_u16());
    let code = err.code().map(str::to_owned);
    let message = DisplayErrorContext(&err).to_string();
    match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            StoreError::Unavailable(message)
        }
        SdkError::ServiceError(_) => match (code.as_deref(), status) {
            // A 404 about the bucket or an upload is a configuration or logic error, not a
            // missing object.
            (Some("NoSuchBucket" | "NoSuchUpload"), _) => StoreError::Other(message),
            (Some("NoSuchKey" | "NotFound"), _) | (_, Some(404)) => {
                StoreError::NotFound(key.to_owned())
            }
            (Some("PreconditionFailed"), _) | (_, Some(412)) => StoreError::Unavailable(format!(
                "{key} changed during the download, retry: {message}"
            )),
            (Some("SlowDown" | "RequestTimeout" | "InternalError" | "ServiceUnavailable"), _) => {
                StoreError::Unavailable(message)
            }
            (_, Some(status)) if status >= 500 || status == 429 => StoreError::Unavailable(message),
            _ => StoreError::Other(message),
        },
        _ => StoreError::Other(message),
    }
}

#[async_trait::async_trait]
impl ObjectStore for S3Store {
    async fn put_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        validate_key(key)?;
        let meta = tokio::fs::metadata(path).await?;
        if !meta.is_file() {
            return Err(StoreError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a regular file", path.display()),
            )));
        }
        let size = meta.len();
        if size > self.part_size {
            self.put_multipart(key, path, size).await?;
        } else {
            let body = read_range(path, 0, size, self.egress()).await?;
            self.put_object(key, body).await?;
        }
        tracing::debug!(key, size, "s3 put_file");
        Ok(size)
    }

    async fn get_file(&self, key: &str, path: &Path) -> Result<u64, StoreError> {
        validate_key(key)?;
        // Ask first, so a missing object creates nothing at the destination.
        let Some((size, etag)) = self.stat(key).await? else {
            return Err(StoreError::NotFound(key.to_owned()));
        };
        let dest = path.to_owned();
        let (temp, temp_path) = fsutil::blocking(move || {
            fsutil::create_parent(&dest)?;
            let (temp, _file) = TempFile::create(&dest)?;
            let temp_path: PathBuf = temp.path().to_owned();
            Ok((temp, temp_path))
        })
        .await?;
        let got = self
            .download(key, size, etag.as_deref(), &temp_path)
            .await?;
        let dest = path.to_owned();
        fsutil::blocking(move || Ok(temp.persist(&dest, false)?)).await?;
        tracing::debug!(key, size = got, "s3 get_file");
        Ok(got)
    }

    async fn put_bytes(&self, key: &str, data: Bytes) -> Result<(), StoreError> {
        validate_key(key)?;
        if let Some(limiter) = self.egress() {
            // Pace in chunks like a limited stream would, so concurrent streams interleave.
            let mut left = data.len();
            while left > 0 {
                let chunk = left.min(256 * 1024);
                limiter.consume(chunk).await;
                left -= chunk;
            }
        }
        self.put_object(key, data).await
    }

    async fn get_bytes(&self, key: &str) -> Result<Bytes, StoreError> {
        validate_key(key)?;
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_err(e, key))?;
        let capacity = out
            .content_length()
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(0);
        let mut buf = Vec::with_capacity(capacity);
        copy_body(out.body, self.ingress(), &mut buf, key).await?;
        Ok(Bytes::from(buf))
    }

    async fn get_stream(&self, key: &str) -> Result<crate::ByteStream, StoreError> {
        validate_key(key)?;
        let out = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
            .map_err(|e| map_err(e, key))?;
        let reader = out.body.into_async_read();
        let reader: Pin<Box<dyn AsyncRead + Send>> = match self.ingress() {
            Some(limiter) => Box::pin(limiter.clone().limit(reader)),
            None => Box::pin(reader),
        };
        let key = key.to_owned();
        Ok(Box::pin(
            tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024)
                .map_err(move |e| StoreError::Unavailable(format!("reading {key}: {e}"))),
        ))
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StoreError> {
        validate_key(key)?;
        Ok(self.stat(key).await?.map(|(size, _)| size))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, StoreError> {
        validate_prefix(prefix)?;
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .set_prefix((!prefix.is_empty()).then(|| prefix.to_owned()))
            .into_paginator()
            .send();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| map_err(e, prefix))?;
            for object in page.contents() {
                let Some(key) = object.key() else { continue };
                out.push(ObjectInfo {
                    key: key.to_owned(),
                    size: non_negative(object.size(), key)?,
                });
            }
        }
        // S3 promises UTF-8 binary order; not every clone keeps promises.
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn delete(&self, key: &str) -> Result<(), StoreError> {
        validate_key(key)?;
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(key)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => match map_err(e, key) {
                StoreError::NotFound(_) => Ok(()),
                other => Err(other),
            },
        }
    }

    async fn delete_prefix(&self, prefix: &str) -> Result<usize, StoreError> {
        let objects = self.list(prefix).await?;
        for batch in objects.chunks(DELETE_BATCH) {
            let ids = batch
                .iter()
                .map(|o| ObjectIdentifier::builder().key(&o.key).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| StoreError::Other(e.to_string()))?;
            let delete = Delete::builder()
                .set_objects(Some(ids))
                .quiet(true)
                .build()
                .map_err(|e| StoreError::Other(e.to_string()))?;
            let out = match self
                .client
                .delete_objects()
                .bucket(&self.bucket)
                .delete(delete)
                .send()
                .await
                .map_err(|e| map_err(e, prefix))
            {
                Ok(out) => out,
                Err(StoreError::Other(reason)) => {
                    // Some S3 clones refuse DeleteObjects as the SDK sends it (they want
                    // Content-MD5, the SDK sends a CRC32): fall back to one DELETE per key.
                    tracing::warn!(prefix, %reason, "batch delete refused; deleting one by one");
                    for object in batch {
                        self.delete(&object.key).await?;
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(failed) = out.errors().first() {
                return Err(StoreError::Other(format!(
                    "deleting {} of {} objects under {prefix:?} failed, first {:?}: {}",
                    out.errors().len(),
                    batch.len(),
                    failed.key().unwrap_or_default(),
                    failed.message().unwrap_or_default()
                )));
            }
        }
        tracing::debug!(prefix, count = objects.len(), "s3 delete_prefix");
        Ok(objects.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_yaml_with_defaults() {
        let cfg: S3Config = serde_saphyr::from_str(
            "endpoint: http://127.0.0.1:8333\nbucket: sonic\naccess_key: a\nsecret_key: s\n",
        )
        .unwrap();
        assert_eq!(
            cfg,
            S3Config::new("http://127.0.0.1:8333", "sonic", "a", "s")
        );
        assert_eq!(cfg.part_size, 16 * 1024 * 1024);
        assert_eq!(cfg.region, "us-east-1");

        let cfg: S3Config = serde_saphyr::from_str(
            "endpoint: https://s3.eu-west-1.amazonaws.com\nregion: eu-west-1\nbucket: b\n\
             access_key: a\nsecret_key: s\npart_size: 8388608\nconcurrency: 8\nmax_attempts: 2\n",
        )
        .unwrap();
        assert_eq!(
            (cfg.part_size, cfg.concurrency, cfg.max_attempts),
            (8 << 20, 8, 2)
        );

        let typo = serde_saphyr::from_str::<S3Config>(
            "endpoint: http://x\nbucket: b\naccess_key: a\nsecret_key: s\npartsize: 1\n",
        );
        assert!(typo.is_err(), "unknown fields are refused");
    }

    #[test]
    fn debug_hides_the_secret() {
        let cfg = S3Config::new("http://127.0.0.1:8333", "b", "key", "very-secret");
        assert!(!format!("{cfg:?}").contains("very-secret"));
        let store = S3Store::new(cfg).unwrap();
        assert!(!format!("{store:?}").contains("very-secret"));
    }

    #[test]
    fn bad_configs_are_refused() {
        let ok = S3Config::new("http://127.0.0.1:8333", "b", "a", "s");
        type Change = fn(&mut S3Config);
        let cases: [(&str, Change); 6] = [
            ("endpoint", |c| c.endpoint = "127.0.0.1:8333".into()),
            ("bucket", |c| c.bucket.clear()),
            ("small part", |c| c.part_size = MIN_PART_SIZE - 1),
            ("huge part", |c| c.part_size = MAX_PART_SIZE + 1),
            ("concurrency", |c| c.concurrency = 0),
            ("attempts", |c| c.max_attempts = 0),
        ];
        for (name, change) in cases {
            let mut cfg = ok.clone();
            change(&mut cfg);
            assert!(
                matches!(S3Store::new(cfg), Err(StoreError::Other(_))),
                "{name} should be refused"
            );
        }
    }

    #[tokio::test]
    async fn dead_endpoint_is_unavailable_and_creates_nothing() {
        // A port that was just free: bind, note it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = S3Config::new(format!("http://127.0.0.1:{port}"), "b", "a", "s");
        cfg.max_attempts = 1;
        let store = S3Store::new(cfg).unwrap();
        let err = store.head("k").await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(err.is_retryable());

        let dir = tempfile::tempdir().unwrap();
        let err = store
            .get_file("k", &dir.path().join("out"))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
