//! How to reach the tier, and what goes wrong when it cannot be reached.

use core::fmt;
use std::time::Duration;

/// Where the tier is and how it behaves. Every field has a default that
/// suits a tier on the same network as the replicas.
///
/// ```
/// use std::time::Duration;
/// use kvslice_redis::TierConfig;
///
/// let cfg = TierConfig::new("redis://127.0.0.1:7000,redis://127.0.0.1:7001")
///     .namespace("prod-a")
///     .ttl(Some(Duration::from_secs(600)));
/// assert_eq!(cfg.urls.len(), 2);
/// ```
#[derive(Clone)]
pub struct TierConfig {
    /// `redis://` URLs: one server, or seed nodes of a cluster (the tier
    /// asks the first node it reaches which one it is). User and password
    /// go in the URL (`redis://user:pass@host:port`).
    pub urls: Vec<String>,
    /// Prefix of every key the tier writes, so that tiers of different
    /// deployments can share a cluster.
    pub namespace: String,
    /// How long a spilled block lives in Redis; `None`: until Redis evicts
    /// it under its own `maxmemory` policy.
    pub ttl: Option<Duration>,
    /// How long to wait for a TCP connection.
    pub connect_timeout: Duration,
    /// How long to wait for a reply, or for a write to go out.
    pub io_timeout: Duration,
    /// Blocks waiting to be spilled; past this, spills are dropped and
    /// counted, never waited for.
    pub spill_queue: usize,
    /// Threads writing spilled blocks out, each with its own connection to
    /// every node (2 by default: while one waits for replies, the other
    /// sends).
    pub spill_threads: usize,
    /// Keys asked per round trip when fetching a prefix's continuation.
    pub fetch_batch: usize,
    /// Spill each block when it is published, too, not only when evicted.
    pub write_through: bool,
    /// After a failure the tier is left alone for this long, doubling on
    /// each failure in a row up to `max_backoff`.
    pub min_backoff: Duration,
    /// The longest the tier is left alone after failures.
    pub max_backoff: Duration,
}

/// The most queued spills [`TierConfig::spill_queue`] takes (the queue's
/// slots are allocated when the tier opens).
pub const MAX_SPILL_QUEUE: usize = 1 << 20;
/// The most spill writer threads.
pub const MAX_SPILL_THREADS: usize = 64;
/// The most keys per fetch round trip.
pub const MAX_FETCH_BATCH: usize = 4096;
/// The longest [`TierConfig::max_backoff`]: an hour.
pub const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// The longest TTL: 100 years (Redis refuses expiry times that overflow).
pub const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 86_400);

/// `url` with its password (and user) replaced by `***`, for messages.
///
/// ```
/// use kvslice_redis::redact;
/// assert_eq!(redact("redis://app:s3cret@10.0.0.1:7000"), "redis://***@10.0.0.1:7000");
/// assert_eq!(redact("redis://10.0.0.1:7000"), "redis://10.0.0.1:7000");
/// assert_eq!(redact("redis://app:pa/ss@10.0.0.1"), "redis://***@10.0.0.1");
/// ```
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // The last `@`, wherever it is: a password may hold `/` or `@` (a
    // host never holds `@`), and one cut at the first `/` would show.
    match rest.rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_string(),
    }
}

/// The URLs of the cluster `.ci/redis-cluster.sh start` runs on loopback.
pub const LOOPBACK_CLUSTER: &str =
    "redis://127.0.0.1:7100,redis://127.0.0.1:7101,redis://127.0.0.1:7102";

/// The tier's URLs from `KVSLICE_REDIS_URLS`, else [`LOOPBACK_CLUSTER`]:
/// what the tests, benches and `kvslice tier` use unless told otherwise.
///
/// ```
/// assert!(kvslice_redis::default_urls().starts_with("redis://"));
/// ```
pub fn default_urls() -> String {
    std::env::var("KVSLICE_REDIS_URLS").unwrap_or_else(|_| LOOPBACK_CLUSTER.into())
}

impl fmt::Debug for TierConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TierConfig")
            .field(
                "urls",
                &self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>(),
            )
            .field("namespace", &self.namespace)
            .field("ttl", &self.ttl)
            .field("connect_timeout", &self.connect_timeout)
            .field("io_timeout", &self.io_timeout)
            .field("spill_queue", &self.spill_queue)
            .field("spill_threads", &self.spill_threads)
            .field("fetch_batch", &self.fetch_batch)
            .field("write_through", &self.write_through)
            .field("min_backoff", &self.min_backoff)
            .field("max_backoff", &self.max_backoff)
            .finish()
    }
}

impl TierConfig {
    /// Defaults for `urls` (comma-separated): namespace `kvslice`, TTL one
    /// hour, connect timeout 250 ms, reply timeout 500 ms, 4096 queued
    /// spills written by 2 threads, fetches of 16 keys, spill on evict
    /// only, backoff 50 ms to 2 s.
    pub fn new(urls: &str) -> Self {
        Self {
            urls: urls
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(String::from)
                .collect(),
            namespace: "kvslice".into(),
            ttl: Some(Duration::from_secs(3600)),
            connect_timeout: Duration::from_millis(250),
            io_timeout: Duration::from_millis(500),
            spill_queue: 4096,
            spill_threads: 2,
            fetch_batch: 16,
            write_through: false,
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }

    /// This config with keys under `namespace`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// This config with spilled blocks living `ttl`.
    pub fn ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }

    /// This config with blocks spilled on publish as well as on evict.
    pub fn write_through(mut self, on: bool) -> Self {
        self.write_through = on;
        self
    }

    /// This config with `n` queued spills at most.
    pub fn spill_queue(mut self, n: usize) -> Self {
        self.spill_queue = n;
        self
    }

    /// This config with `n` spill writer threads.
    pub fn spill_threads(mut self, n: usize) -> Self {
        self.spill_threads = n;
        self
    }

    /// This config with both timeouts set.
    pub fn timeouts(mut self, connect: Duration, io: Duration) -> Self {
        self.connect_timeout = connect;
        self.io_timeout = io;
        self
    }

    /// The first problem with this config that no connection could fix.
    pub(crate) fn check(&self) -> Result<(), TierError> {
        if self.urls.is_empty() {
            return Err(TierError::Url("no URL given".into()));
        }
        for url in &self.urls {
            let shown = redact(url);
            if url.starts_with("rediss://") {
                return Err(TierError::Url(format!(
                    "{shown}: TLS (rediss://) is not built into this tier; use redis:// on a trusted network"
                )));
            }
            if !url.starts_with("redis://") {
                return Err(TierError::Url(format!(
                    "{shown}: the scheme must be redis://"
                )));
            }
            // Every URL, not only the first that answers: a later one is a
            // seed the slot map may be read from.
            if let Err(e) = redis::Client::open(url.as_str()) {
                return Err(TierError::Url(format!("{shown}: {e}")));
            }
        }
        let within = |what: &str, n: usize, max: usize| {
            if (1..=max).contains(&n) {
                Ok(())
            } else {
                Err(TierError::Url(format!(
                    "{what} must be 1 to {max}, not {n}"
                )))
            }
        };
        within("spill_queue", self.spill_queue, MAX_SPILL_QUEUE)?;
        within("spill_threads", self.spill_threads, MAX_SPILL_THREADS)?;
        within("fetch_batch", self.fetch_batch, MAX_FETCH_BATCH)?;
        if self.connect_timeout.is_zero() || self.io_timeout.is_zero() {
            return Err(TierError::Url("timeouts must be above zero".into()));
        }
        if self
            .ttl
            .is_some_and(|t| t < Duration::from_millis(1) || t > MAX_TTL)
        {
            return Err(TierError::Url(format!(
                "ttl must be 1 ms to {} days (None: until Redis evicts the block)",
                MAX_TTL.as_secs() / 86_400
            )));
        }
        if self.min_backoff.is_zero()
            || self.min_backoff > self.max_backoff
            || self.max_backoff > MAX_BACKOFF
        {
            return Err(TierError::Url(
                "min_backoff must be above zero and at most max_backoff, which is at most an hour"
                    .into(),
            ));
        }
        if self.namespace.is_empty() || self.namespace.contains(char::is_whitespace) {
            return Err(TierError::Url(
                "the namespace must be non-empty, without spaces".into(),
            ));
        }
        Ok(())
    }
}

/// Why the tier could not be set up. At run time nothing is an error:
/// failures are counted and the local cache carries on.
#[derive(Debug)]
pub enum TierError {
    /// A URL or setting that cannot work.
    Url(String),
    /// No server answered at any URL (or the answer was not Redis).
    Connect(String),
    /// A server answered the checks with an error (`LOADING`, a command
    /// renamed or disabled).
    Server(String),
    /// The process could not set the tier up (a thread did not start).
    Resources(String),
    /// The server refused the credentials.
    Auth(String),
    /// A cluster whose `cluster_state` is not `ok`.
    ClusterNotOk(String),
    /// Several URLs, but the server is not in cluster mode.
    NotACluster(String),
    /// A store whose pages are not of the tier's layout.
    LayoutMismatch(String),
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Url(m) => write!(f, "tier configuration: {m}"),
            Self::Connect(m) => write!(f, "cannot reach the tier: {m}"),
            Self::Server(m) => write!(f, "the tier answered with an error: {m}"),
            Self::Resources(m) => write!(f, "cannot set the tier up: {m}"),
            Self::Auth(m) => write!(f, "the tier refused the credentials: {m}"),
            Self::ClusterNotOk(m) => write!(f, "the Redis cluster is not ok: {m}"),
            Self::NotACluster(m) => write!(f, "several URLs, but {m} is not in cluster mode"),
            Self::LayoutMismatch(m) => write!(f, "store and tier layouts differ: {m}"),
        }
    }
}

impl std::error::Error for TierError {}
