//! What the tier checks when it opens: that a URL answers, with which
//! credentials, and whether it is a healthy cluster.

use redis::{ErrorKind, RedisError};

use crate::config::{TierConfig, TierError, redact};

/// Checks `cfg`, reaches the first URL that answers and asks it whether
/// it is a cluster (and if so, whether the cluster is ok). Returns
/// whether it is one. Connections for the work itself are made per node
/// later (see [`crate::nodes`]).
pub(crate) fn open(cfg: &TierConfig) -> Result<bool, TierError> {
    cfg.check()?;
    let mut last = String::new();
    for url in &cfg.urls {
        let shown = redact(url);
        let client = redis::Client::open(url.as_str())
            .map_err(|e| TierError::Url(format!("{shown}: {e}")))?;
        let mut con = match client.get_connection_with_timeout(cfg.connect_timeout) {
            Ok(c) => c,
            Err(e) if is_auth(&e) => return Err(TierError::Auth(format!("{shown}: {e}"))),
            Err(e) => {
                last = format!("{shown}: {e}");
                continue;
            }
        };
        let timeouts = con
            .set_read_timeout(Some(cfg.io_timeout))
            .and_then(|()| con.set_write_timeout(Some(cfg.io_timeout)));
        timeouts.map_err(|e| TierError::Connect(format!("{shown}: {e}")))?;
        let info: String = redis::cmd("INFO")
            .arg("cluster")
            .query(&mut con)
            .map_err(|e| classify(&shown, e))?;
        if !info.contains("cluster_enabled:1") {
            if cfg.urls.len() > 1 {
                return Err(TierError::NotACluster(shown));
            }
            return Ok(false);
        }
        let state: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut con)
            .map_err(|e| classify(&shown, e))?;
        if !state.lines().any(|l| l.trim() == "cluster_state:ok") {
            let line = state
                .lines()
                .find(|l| l.starts_with("cluster_state"))
                .unwrap_or("no cluster_state line");
            return Err(TierError::ClusterNotOk(format!("{shown}: {}", line.trim())));
        }
        return Ok(true);
    }
    Err(TierError::Connect(last))
}

fn is_auth(e: &RedisError) -> bool {
    e.kind() == ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
}

/// A failure of `url` after it was reached: refused credentials, a server
/// that answered with an error (`LOADING`, a disabled command), or a
/// connection that broke.
fn classify(url: &str, e: RedisError) -> TierError {
    if is_auth(&e) {
        TierError::Auth(format!("{url}: {e}"))
    } else if e.kind() == ErrorKind::Io {
        TierError::Connect(format!("{url}: {e}"))
    } else {
        TierError::Server(format!("{url}: {e}"))
    }
}
