//! Connections to one Redis server or to a cluster, behind one pipelined
//! call.

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use crate::config::{TierConfig, TierError};

/// Opens connections of the kind the first reachable URL turned out to be.
pub(crate) enum Connector {
    Single(redis::Client),
    Cluster(ClusterClient),
}

/// One connection; not shared between threads (the tier pools them).
pub(crate) enum Conn {
    Single(redis::Connection),
    Cluster(Box<ClusterConnection>),
}

impl Connector {
    /// Checks `cfg`, reaches the first URL that answers and asks it whether
    /// it is a cluster (and if so, whether the cluster is ok). Returns the
    /// connector and a first connection.
    pub(crate) fn open(cfg: &TierConfig) -> Result<(Self, Conn), TierError> {
        cfg.check()?;
        let mut last = String::new();
        for url in &cfg.urls {
            let client = redis::Client::open(url.as_str())
                .map_err(|e| TierError::Url(format!("{url}: {e}")))?;
            let mut con = match client.get_connection_with_timeout(cfg.connect_timeout) {
                Ok(c) => c,
                Err(e) if is_auth(&e) => return Err(TierError::Auth(format!("{url}: {e}"))),
                Err(e) => {
                    last = format!("{url}: {e}");
                    continue;
                }
            };
            set_timeouts(&con, cfg).map_err(|e| TierError::Connect(format!("{url}: {e}")))?;
            let info: String = redis::cmd("INFO")
                .arg("cluster")
                .query(&mut con)
                .map_err(|e| classify(url, e))?;
            if !info.contains("cluster_enabled:1") {
                if cfg.urls.len() > 1 {
                    return Err(TierError::NotACluster(url.clone()));
                }
                return Ok((Self::Single(client), Conn::Single(con)));
            }
            let state: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut con)
                .map_err(|e| classify(url, e))?;
            if !state.lines().any(|l| l.trim() == "cluster_state:ok") {
                let line = state
                    .lines()
                    .find(|l| l.starts_with("cluster_state"))
                    .unwrap_or("no cluster_state line");
                return Err(TierError::ClusterNotOk(format!("{url}: {}", line.trim())));
            }
            let cluster = ClusterClient::builder(cfg.urls.iter().map(String::as_str))
                .connection_timeout(cfg.connect_timeout)
                .response_timeout(cfg.io_timeout)
                // The tier never waits out a failing node: the local cache
                // carries on and the tier backs off (see `RedisTier`).
                .retries(0)
                .build()
                .map_err(|e| TierError::Url(e.to_string()))?;
            let con = cluster.get_connection().map_err(|e| classify(url, e))?;
            return Ok((Self::Cluster(cluster), Conn::Cluster(Box::new(con))));
        }
        Err(TierError::Connect(last))
    }

    /// A fresh connection of the same kind.
    pub(crate) fn connect(&self, cfg: &TierConfig) -> RedisResult<Conn> {
        match self {
            Self::Single(client) => {
                let con = client.get_connection_with_timeout(cfg.connect_timeout)?;
                set_timeouts(&con, cfg)?;
                Ok(Conn::Single(con))
            }
            Self::Cluster(client) => client.get_connection().map(|c| Conn::Cluster(Box::new(c))),
        }
    }

    /// Whether connections go to a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

/// One command's answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A string value.
    Data(Vec<u8>),
    /// No such key.
    Nil,
    /// An error reply (a wrong type, `OOM` under `maxmemory`).
    Refused,
    /// Anything else (`OK`, a count).
    Done,
}

impl From<Value> for Reply {
    fn from(v: Value) -> Self {
        match v {
            Value::BulkString(b) => Reply::Data(b),
            Value::Nil => Reply::Nil,
            Value::ServerError(_) => Reply::Refused,
            _ => Reply::Done,
        }
    }
}

impl Conn {
    /// Runs `cmds` as one pipeline (per node, on a cluster) and returns one
    /// reply per command, error replies included. An `Err` is a failure of
    /// the connection itself.
    pub(crate) fn run(&mut self, cmds: Vec<Cmd>) -> RedisResult<Vec<Reply>> {
        match self {
            Self::Single(con) => {
                let mut pipe = redis::pipe();
                for c in cmds {
                    pipe.add_command(c);
                }
                let values: Vec<Value> = pipe.ignore_errors().query(con)?;
                Ok(values.into_iter().map(Reply::from).collect())
            }
            Self::Cluster(con) => {
                let mut pipe = redis::cluster::cluster_pipe();
                for c in cmds {
                    pipe.add_command(c);
                }
                match pipe.query::<Vec<Value>>(con) {
                    Ok(values) => Ok(values.into_iter().map(Reply::from).collect()),
                    // A cluster pipeline fails whole on any error reply:
                    // ask again one command at a time to learn which
                    // (rare: error replies are faults).
                    // A redirect (MOVED, ASK) is not a fault of the key:
                    // the connection's slot map is stale, and only a new
                    // connection reads it again (retries are off).
                    Err(e) if is_reply(&e) && !is_redirect(&e) => pipe
                        .cmd_iter()
                        .map(|c| match c.query::<Value>(con) {
                            Ok(v) => Ok(Reply::from(v)),
                            Err(e) if is_reply(&e) && !is_redirect(&e) => Ok(Reply::Refused),
                            Err(e) => Err(e),
                        })
                        .collect(),
                    Err(e) => Err(e),
                }
            }
        }
    }
}

/// Whether `e` is a redirect (MOVED or ASK): the cluster moved the key's
/// slot since the connection read its map.
pub(crate) fn is_redirect(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
    )
}

/// Whether `e` is an error reply from the server rather than a failure of
/// the connection.
fn is_reply(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
}

fn set_timeouts(con: &redis::Connection, cfg: &TierConfig) -> RedisResult<()> {
    con.set_read_timeout(Some(cfg.io_timeout))?;
    con.set_write_timeout(Some(cfg.io_timeout))
}

fn is_auth(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
}

fn classify(url: &str, e: RedisError) -> TierError {
    if is_auth(&e) {
        TierError::Auth(format!("{url}: {e}"))
    } else {
        TierError::Connect(format!("{url}: {e}"))
    }
}
