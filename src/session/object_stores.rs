//! Object stores resolved from the URL in the query itself.
//!
//! `SELECT * FROM 's3://bucket/prefix/*.parquet'` must work without a prior
//! `CREATE EXTERNAL TABLE` or any registration step. [`LazyObjectStoreRegistry`]
//! builds the store for a URL the first time DataFusion asks for it, from the
//! URL's scheme and host plus the usual environment variables, and caches it per
//! `scheme://host[:port]` as DataFusion's default registry does.
//!
//! ```text
//!  'gs://bucket/x/*.parquet'
//!            │ get_store(url)
//!            ▼
//!  ┌──────────────────────────┐ miss ┌──────────────────────────────────┐
//!  │ LazyObjectStoreRegistry  │─────▶│ builder from env + timeouts,     │
//!  │  cache: scheme://host    │◀─────│ wrapped in CountingObjectStore   │
//!  └──────────────────────────┘      └──────────────────────────────────┘
//! ```
//!
//! # Credentials
//! Credentials come only from the environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`),
//! through each builder's `from_env`. Nothing here formats a builder or a store
//! with `Debug`, so secrets never reach a log line or an error message.
//!
//! # Bounded failure
//! Every network store gets a connect timeout, a request timeout and a bounded
//! retry budget ([`ObjectStoreLimits`]), so that an unreachable endpoint or a
//! wrong credential ends in an error within seconds instead of a hang.
//!
//! # Plain HTTP
//! `http://` URLs are refused, before any connection is made, with a Plan error
//! that names the URL and the switch, unless the session allows them
//! (`SessionBuilder::allow_http`, the CLI's `--allow-http`, or
//! [`ALLOW_HTTP_ENV`]`=1`): bytes read over plain HTTP can be altered on the
//! way. Allowing it also lets S3, GCS and Azure reach an `http://` endpoint
//! (a local MinIO or moto) without their own `AWS_ALLOW_HTTP`-style variable.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::common::plan_err;
use datafusion::common::{
    exec_datafusion_err, internal_datafusion_err, plan_datafusion_err, resources_err,
};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreRegistry;
use futures::stream::BoxStream;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::http::HttpBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientConfigKey, CopyOptions, GetOptions, GetResult, ListResult,
    MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions, PutOptions,
    PutPayload, PutResult, RetryConfig,
};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use url::Url;

/// The environment variable that allows plain `http://` object-store URLs
/// when the session does not say (`1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`).
pub const ALLOW_HTTP_ENV: &str = "SQLFEED_ALLOW_HTTP";

/// Whether [`ALLOW_HTTP_ENV`] allows plain HTTP; unset means no.
pub fn allow_http_from_env() -> Result<bool> {
    match std::env::var(ALLOW_HTTP_ENV) {
        Ok(value) => parse_allow_http(&value),
        Err(std::env::VarError::NotPresent) => Ok(false),
        Err(std::env::VarError::NotUnicode(value)) => plan_err!(
            "{ALLOW_HTTP_ENV}={value:?} is not valid UTF-8: set it to 1 to allow \
             plain-HTTP object-store URLs or 0 to refuse them"
        ),
    }
}

/// Parses a value of [`ALLOW_HTTP_ENV`].
fn parse_allow_http(value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "" | "0" | "false" | "no" | "off" => Ok(false),
        _ => plan_err!(
            "{ALLOW_HTTP_ENV}='{value}' is not a boolean: set it to 1 (or true) to \
             allow plain-HTTP object-store URLs, 0 (or false) to refuse them"
        ),
    }
}

/// The refusal of an `http://` URL in a session that does not allow it.
fn http_refused(url: &Url) -> DataFusionError {
    plan_datafusion_err!(
        "plain HTTP is refused for {url}: what is read over http:// can be altered \
         on the way. Use https://, or allow plain HTTP with --allow-http (CLI), \
         {ALLOW_HTTP_ENV}=1 (environment), sqlfeed.Session(allow_http=True) \
         (Python) or SessionBuilder::allow_http(true) (Rust)"
    )
}

/// Timeouts and retries applied to every network object store.
#[derive(Debug, Clone)]
pub struct ObjectStoreLimits {
    /// Time allowed to open a TCP/TLS connection.
    pub connect_timeout: Duration,
    /// Time allowed for one whole request.
    pub request_timeout: Duration,
    /// Retries of a failed request (transient errors only; 4xx is never retried).
    pub max_retries: usize,
    /// Upper bound on the total time spent retrying one request.
    pub retry_timeout: Duration,
}

impl Default for ObjectStoreLimits {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(60),
            max_retries: 3,
            retry_timeout: Duration::from_secs(20),
        }
    }
}

impl ObjectStoreLimits {
    fn retry_config(&self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: self.max_retries,
            retry_timeout: self.retry_timeout,
        }
    }

    /// `humantime` strings as object_store's client config expects them.
    fn client_settings(&self) -> [(ClientConfigKey, String); 2] {
        [
            (
                ClientConfigKey::ConnectTimeout,
                format!("{}ms", self.connect_timeout.as_millis()),
            ),
            (
                ClientConfigKey::Timeout,
                format!("{}ms", self.request_timeout.as_millis()),
            ),
        ]
    }
}

/// Bytes and requests read through the session's object stores.
///
/// Shared by every store the registry hands out; the CLI's progress bar and the
/// examples read it to show what a query actually fetched.
#[derive(Debug, Default)]
pub struct IoCounters {
    /// Bytes returned by reads.
    bytes_read: AtomicU64,
    /// Read requests made.
    get_requests: AtomicU64,
    /// Distinct objects read since the last [`IoCounters::reset_files`].
    files: Mutex<HashSet<Path>>,
}

impl IoCounters {
    /// Bytes returned by `get` requests so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Number of `get` / ranged `get` requests so far.
    pub fn get_requests(&self) -> u64 {
        self.get_requests.load(Ordering::Relaxed)
    }

    /// Distinct objects read since the last [`IoCounters::reset_files`].
    pub fn files_read(&self) -> usize {
        self.files.lock().map(|f| f.len()).unwrap_or(0)
    }

    /// Starts a new count of distinct objects (e.g. when a query starts).
    pub fn reset_files(&self) {
        if let Ok(mut files) = self.files.lock() {
            files.clear();
        }
    }

    fn record(&self, location: &Path, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        self.get_requests.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut files) = self.files.lock()
            && !files.contains(location)
        {
            files.insert(location.clone());
        }
    }
}

/// The object-store registry of a sqlfeed session; see the module docs.
pub struct LazyObjectStoreRegistry {
    /// Stores by `scheme://host[:port]`.
    stores: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    /// Timeouts and retries for network stores.
    limits: ObjectStoreLimits,
    /// Whether `http://` URLs (and plain-HTTP endpoints of S3, GCS, Azure)
    /// are allowed; see the module docs.
    allow_http: bool,
    /// Counters shared by all stores of this registry.
    io: Arc<IoCounters>,
}

impl fmt::Debug for LazyObjectStoreRegistry {
    // Only the keys: a store's own Debug output may include its configuration.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = match self.stores.lock() {
            Ok(stores) => stores.keys().cloned().collect(),
            Err(_) => vec![],
        };
        f.debug_struct("LazyObjectStoreRegistry")
            .field("stores", &keys)
            .finish()
    }
}

impl LazyObjectStoreRegistry {
    /// A registry that builds stores with `limits` and counts their reads in `io`.
    pub fn new(limits: ObjectStoreLimits, io: Arc<IoCounters>) -> Self {
        Self {
            stores: Mutex::new(HashMap::new()),
            limits,
            allow_http: false,
            io,
        }
    }

    /// Allows (or refuses, the default) plain `http://` URLs; see the module docs.
    pub fn with_allow_http(mut self, allow: bool) -> Self {
        self.allow_http = allow;
        self
    }

    /// Client settings of every network store: the limits, and plain HTTP if
    /// allowed. Refusing adds nothing, so that a store's own variable
    /// (`AWS_ALLOW_HTTP`) still applies.
    fn client_settings(&self) -> Vec<(ClientConfigKey, String)> {
        let mut settings = Vec::from(self.limits.client_settings());
        if self.allow_http {
            settings.push((ClientConfigKey::AllowHttp, "true".to_string()));
        }
        settings
    }

    fn build_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        let host = url.host_str().unwrap_or_default();
        let retry = self.limits.retry_config();
        let client = self.client_settings();
        // Every network store is built alike: its builder (from the
        // environment, with the bucket or URL), the retries, then the client
        // settings as the store's own keys.
        macro_rules! network_store {
            ($builder:expr, $client_key:path) => {{
                let builder = (client.into_iter())
                    .fold($builder.with_retry(retry), |builder, (key, value)| {
                        builder.with_config($client_key(key), value)
                    });
                Arc::new(builder.build().map_err(|e| store_error(url, e))?)
            }};
        }
        let store: Arc<dyn ObjectStore> = match url.scheme() {
            "file" => Arc::new(LocalFileSystem::new()),
            "s3" | "s3a" => network_store!(
                AmazonS3Builder::from_env().with_bucket_name(host),
                AmazonS3ConfigKey::Client
            ),
            "gs" | "gcs" => network_store!(
                GoogleCloudStorageBuilder::from_env().with_bucket_name(host),
                GoogleConfigKey::Client
            ),
            "az" | "azure" | "abfs" | "abfss" | "adl" => network_store!(
                MicrosoftAzureBuilder::from_env().with_url(url.as_str()),
                AzureConfigKey::Client
            ),
            // Before the builder, which would only say "builder error".
            "http" if !self.allow_http => return Err(http_refused(url)),
            "http" | "https" => network_store!(
                HttpBuilder::new().with_url(&url[..url::Position::BeforePath]),
                std::convert::identity
            ),
            other => {
                return plan_err!(
                    "unsupported URL scheme '{other}' in {url}: sqlfeed reads file paths, \
                     s3://, gs://, az:// (abfss://) and http(s):// URLs"
                );
            }
        };
        Ok(Arc::new(CountingObjectStore {
            inner: store,
            io: Arc::clone(&self.io),
        }))
    }
}

fn store_key(url: &Url) -> String {
    format!(
        "{}://{}",
        url.scheme(),
        &url[url::Position::BeforeHost..url::Position::AfterPort]
    )
}

fn store_error(url: &Url, e: object_store::Error) -> DataFusionError {
    plan_datafusion_err!(
        "cannot configure the object store for {}://{}: {e}. Check the environment \
         variables for this store (for S3: AWS_REGION, AWS_ENDPOINT_URL, \
         AWS_ACCESS_KEY_ID, ...)",
        url.scheme(),
        url.host_str().unwrap_or_default()
    )
}

impl ObjectStoreRegistry for LazyObjectStoreRegistry {
    fn register_store(
        &self,
        url: &Url,
        store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        let counted: Arc<dyn ObjectStore> = Arc::new(CountingObjectStore {
            inner: store,
            io: Arc::clone(&self.io),
        });
        match self.stores.lock() {
            Ok(mut stores) => stores.insert(store_key(url), counted),
            Err(poisoned) => poisoned.into_inner().insert(store_key(url), counted),
        }
    }

    fn deregister_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        stores
            .remove(&store_key(url))
            .ok_or_else(|| plan_datafusion_err!("no object store registered for {url}"))
    }

    fn get_store(&self, url: &Url) -> Result<Arc<dyn ObjectStore>> {
        let key = store_key(url);
        let mut stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(store) = stores.get(&key) {
            return Ok(Arc::clone(store));
        }
        let store = self.build_store(url)?;
        stores.insert(key, Arc::clone(&store));
        Ok(store)
    }
}

/// Largest asset (a `tokenizer.json`) read through [`ObjectStoreAssetReader`].
const MAX_ASSET_BYTES: u64 = 512 << 20;

/// Reads the files functions load at plan time (tokenizers) from this
/// session's object stores, so they use the same credentials, timeouts and
/// retries as the query's tables.
///
/// Functions plan synchronously, possibly on a worker of the caller's Tokio
/// runtime, where blocking on that runtime would deadlock: the read runs on a
/// short-lived thread with its own current-thread runtime. It happens once
/// per file and session (the functions cache what they load).
#[derive(Debug)]
pub struct ObjectStoreAssetReader {
    registry: Arc<LazyObjectStoreRegistry>,
}

impl ObjectStoreAssetReader {
    /// A reader over the stores of `registry`.
    pub fn new(registry: Arc<LazyObjectStoreRegistry>) -> Self {
        Self { registry }
    }

    async fn read_async(&self, url: &Url, location: &str) -> Result<Vec<u8>> {
        let store = self.registry.get_store(url)?;
        let path = Path::from_url_path(url.path()).map_err(|e| {
            plan_datafusion_err!("'{location}' is not a valid object path: {e}")
        })?;
        let fetched = store
            .get_opts(&path, GetOptions::default())
            .await
            .map_err(|e| exec_datafusion_err!("reading '{location}': {e}"))?;
        if fetched.meta.size > MAX_ASSET_BYTES {
            return resources_err!(
                "'{location}' is {} bytes; assets larger than {MAX_ASSET_BYTES} bytes \
                 are refused",
                fetched.meta.size
            );
        }
        let bytes = fetched
            .bytes()
            .await
            .map_err(|e| exec_datafusion_err!("reading '{location}': {e}"))?;
        Ok(bytes.to_vec())
    }
}

impl sqlfeed_udfs::AssetReader for ObjectStoreAssetReader {
    fn read(&self, location: &str) -> Result<Vec<u8>> {
        let url = Url::parse(location)
            .map_err(|e| plan_datafusion_err!("'{location}' is not a valid URL: {e}"))?;
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| {
                        exec_datafusion_err!(
                            "cannot start a runtime to read '{location}': {e}"
                        )
                    })?;
                runtime.block_on(self.read_async(&url, location))
            });
            reader
                .join()
                .map_err(|_| internal_datafusion_err!("reading '{location}' panicked"))?
        })
    }
}

/// Forwards to `inner`, counting the bytes that reads return.
#[derive(Debug)]
struct CountingObjectStore {
    inner: Arc<dyn ObjectStore>,
    io: Arc<IoCounters>,
}

impl fmt::Display for CountingObjectStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for CountingObjectStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let head = options.head;
        let result = self.inner.get_opts(location, options).await?;
        if !head {
            self.io
                .record(location, result.range.end - result.range.start);
        }
        Ok(result)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<bytes::Bytes>> {
        let parts = self.inner.get_ranges(location, ranges).await?;
        let bytes: u64 = parts.iter().map(|b| b.len() as u64).sum();
        self.io.record(location, bytes);
        Ok(parts)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list_with_offset(prefix, offset)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&Path>,
    ) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry with the default limits and counters of its own.
    fn registry() -> LazyObjectStoreRegistry {
        LazyObjectStoreRegistry::new(ObjectStoreLimits::default(), Arc::default())
    }

    #[test]
    fn store_key_ignores_path_and_keeps_port() -> Result<()> {
        let url = Url::parse("http://127.0.0.1:9000/bucket/a/b.parquet")
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        assert_eq!(store_key(&url), "http://127.0.0.1:9000");
        Ok(())
    }

    #[test]
    fn unknown_scheme_is_a_plan_error_naming_it() {
        let registry = registry();
        let url = Url::parse("ftp://host/x.parquet").expect("static URL parses");
        let err = registry.get_store(&url).expect_err("ftp is not supported");
        assert!(err.to_string().contains("'ftp'"), "{err}");
    }

    #[test]
    fn http_is_refused_by_default_naming_the_url_and_the_switches() {
        let registry = registry();
        let url = Url::parse("http://127.0.0.1:8765/").expect("static URL parses");
        let err = registry.get_store(&url).expect_err("plain HTTP is refused");
        assert!(matches!(err, DataFusionError::Plan(_)), "{err:?}");
        let message = err.to_string();
        for part in [
            "http://127.0.0.1:8765/",
            "plain HTTP is refused",
            "--allow-http",
            "SQLFEED_ALLOW_HTTP=1",
            "allow_http=True",
            "SessionBuilder::allow_http(true)",
        ] {
            assert!(message.contains(part), "{part:?} missing from: {message}");
        }
    }

    #[test]
    fn http_and_https_build_when_allowed() -> Result<()> {
        let allowing = registry().with_allow_http(true);
        for url in ["http://127.0.0.1:8765/", "https://example.com/"] {
            allowing.get_store(&Url::parse(url).expect("static URL parses"))?;
        }
        // https needs no switch.
        let refusing = registry();
        refusing.get_store(&Url::parse("https://example.com/").expect("static URL"))?;
        Ok(())
    }

    #[test]
    fn allow_http_values_parse_and_bad_ones_are_named() -> Result<()> {
        for yes in ["1", "true", "TRUE", " yes ", "on"] {
            assert!(parse_allow_http(yes)?, "{yes}");
        }
        for no in ["", "0", "false", "No", "off"] {
            assert!(!parse_allow_http(no)?, "{no}");
        }
        let err = parse_allow_http("maybe").expect_err("not a boolean");
        assert!(
            err.to_string().contains("SQLFEED_ALLOW_HTTP='maybe'"),
            "{err}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn local_reads_are_counted() -> Result<()> {
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("f.bin"), b"0123456789")?;
        let io = Arc::new(IoCounters::default());
        let registry =
            LazyObjectStoreRegistry::new(ObjectStoreLimits::default(), Arc::clone(&io));
        let store = registry.get_store(&Url::parse("file:///").expect("static URL"))?;
        let path = Path::from_filesystem_path(dir.path().join("f.bin"))
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let parts = store
            .get_ranges(&path, &[0..4, 6..8])
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        assert_eq!(parts.len(), 2);
        assert_eq!(io.bytes_read(), 6);
        assert_eq!(io.get_requests(), 1);
        assert_eq!(io.files_read(), 1);
        Ok(())
    }
}
