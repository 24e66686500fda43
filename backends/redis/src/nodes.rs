//! The tier's path to Redis: the cluster's slot map and one plain
//! connection per node, each with its timeouts set before its first
//! command, so that no call waits on a node longer than the configured
//! timeouts. Spills go out as packed `SET` pipelines, one per node;
//! fetches as `GET` pipelines whose replies are put back in key order.
//!
//! redis-rs's cluster connection was the first path: it copied each
//! 64 KiB value three times on the way out, answered a batch with one
//! error when any node failed (losing the other nodes' values), and a
//! new one sent each node a command before setting any timeout, so a
//! hung node held a lookup for as long as it hung. Here a value is copied
//! once, into a buffer that lives as long as its [`Nodes`]; a node that
//! fails costs only its own keys, and is left alone for a backoff that
//! every [`Nodes`] of the tier shares ([`Health`]). An error reply that
//! says the map moved (`MOVED`, `CLUSTERDOWN`, `TRYAGAIN`) or a failed
//! node reads the map again before the next batch.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, Value};

use crate::config::TierConfig;

/// Hash slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// The hash slot of `key`: CRC-16 (XMODEM) of the key, or of its hash tag
/// (the text between the first `{` and the next `}`, when not empty),
/// modulo 16,384, as Redis Cluster computes it.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    (crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) as usize % SLOTS) as u16
}

/// The wait after `failures` failures in a row: the configured minimum,
/// doubling, up to the maximum.
pub(crate) fn backoff(cfg: &TierConfig, failures: u32) -> Duration {
    cfg.min_backoff
        .saturating_mul(1 << failures.min(16))
        .min(cfg.max_backoff)
}

/// Which nodes are being left alone, and until when; shared by every
/// [`Nodes`] of a tier (the fetchers and the spill writers), so that one
/// that finds a node dead spares the others the wait.
#[derive(Default)]
pub(crate) struct Health {
    /// Per node address: the end of its backoff and its failures in a row.
    down: Mutex<HashMap<String, (Instant, u32)>>,
}

impl Health {
    fn is_down(&self, node: &str) -> bool {
        let down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        down.get(node)
            .is_some_and(|&(until, _)| Instant::now() < until)
    }

    /// Starts or lengthens `node`'s backoff; failures seen while it is
    /// already backing off (other fetchers' probes of the same node) do
    /// not lengthen it again.
    fn failed(&self, node: &str, cfg: &TierConfig) {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let entry = down.entry(node.to_string()).or_insert((now, 0));
        if entry.0 <= now {
            *entry = (now + backoff(cfg, entry.1), entry.1.saturating_add(1));
        }
    }

    /// Whether each of `nodes` is backing off now: one look at the table
    /// per batch, not one per key.
    fn down_now(&self, nodes: &[Node]) -> Vec<bool> {
        let down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        nodes
            .iter()
            .map(|n| down.get(&n.name).is_some_and(|&(until, _)| now < until))
            .collect()
    }

    fn answered(&self, node: &str) {
        let mut down = self.down.lock().unwrap_or_else(|e| e.into_inner());
        if !down.is_empty() {
            down.remove(node);
        }
    }
}

/// One node: its address, connection, and this batch's commands.
struct Node {
    info: redis::ConnectionInfo,
    /// `host:port`, its name in [`Health`].
    name: String,
    con: Option<redis::Connection>,
    /// Whether this batch went out on a connection an earlier batch used
    /// (which the server or the network may have closed while it idled).
    reused: bool,
    /// This batch's commands for the node, packed.
    buf: Vec<u8>,
    /// Which of the batch's items they are, in order.
    items: Vec<usize>,
}

/// What became of one spill of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Redis stored it.
    Stored,
    /// Redis answered with an error (`OOM` under `maxmemory`, a moved slot).
    Refused,
    /// No node owns its slot in the map read last: never sent.
    Unrouted,
    /// The connection failed, none could be made, or the node is in its
    /// backoff: unknown or not tried, counted lost.
    Failed,
}

/// What a `GET` came back as.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Got {
    /// The value.
    Data(Vec<u8>),
    /// No such key.
    Nil,
    /// The key's slot is elsewhere (`MOVED`, or `ASK` mid-migration): a
    /// miss here, not a fault of the key or the node.
    Elsewhere,
    /// An error reply, or a reply that is not a string.
    Refused,
    /// The node is in its backoff, or no node owns the slot: not asked.
    Skipped,
    /// The node's connection failed (or none could be made).
    Failed,
}

/// A slot map and a connection per node; owned by one thread at a time
/// (a spill writer, or a fetch that took it from the tier's pool).
pub(crate) struct Nodes {
    cluster: bool,
    nodes: Vec<Node>,
    /// Node index per slot (cluster only); `u16::MAX` where no node serves it.
    owner: Vec<u16>,
    /// The slot map needs reading again before the next batch.
    stale: bool,
    /// A `MOVED` reply said the map is stale: read it before the next
    /// batch, whenever it was last read.
    moved: bool,
    /// When the map was last read: a stale map (a `CLUSTERDOWN`, a slot
    /// no node owns, a failed node) is read again at most once per
    /// `min_backoff`, not before every batch while the cluster is down.
    refreshed: Option<Instant>,
    key: String,
}

/// One value to write: its Redis key, header and page.
pub(crate) struct Item<'a> {
    pub key: &'a str,
    pub header: &'a [u8],
    pub page: &'a [u8],
}

/// The slot map could not be read from any URL.
#[derive(Debug)]
pub(crate) struct NoMap;

impl Nodes {
    pub(crate) fn new(cluster: bool) -> Self {
        Self {
            cluster,
            nodes: Vec::new(),
            owner: Vec::new(),
            stale: true,
            moved: false,
            refreshed: None,
            key: String::new(),
        }
    }

    /// The node serving `key`, if the map names one.
    fn route(&mut self, key: &str) -> Option<usize> {
        let node = if self.cluster {
            usize::from(self.owner[slot(key.as_bytes()) as usize])
        } else {
            0
        };
        if node >= self.nodes.len() {
            // A slot no node serves: Redis would answer CLUSTERDOWN.
            self.stale = true;
            return None;
        }
        Some(node)
    }

    /// Writes `items` with `SET` (and `PX ttl_ms` when given), one packed
    /// pipeline per node, and reports each item's outcome through `done`
    /// (in no particular order). Items for a node in its backoff are not
    /// sent. `Err` when the slot map could not be read (every item failed).
    pub(crate) fn write(
        &mut self,
        cfg: &TierConfig,
        health: &Health,
        items: &[Item<'_>],
        ttl_ms: Option<u64>,
        done: &mut dyn FnMut(usize, Outcome),
    ) -> Result<(), NoMap> {
        if self.ensure_map(cfg, health).is_err() {
            (0..items.len()).for_each(|i| done(i, Outcome::Failed));
            return Err(NoMap);
        }
        let down = health.down_now(&self.nodes);
        for (i, item) in items.iter().enumerate() {
            let Some(node) = self.route(item.key) else {
                done(i, Outcome::Unrouted);
                continue;
            };
            if down[node] {
                done(i, Outcome::Failed);
                continue;
            }
            let node = &mut self.nodes[node];
            pack_set(&mut node.buf, &mut self.key, item, ttl_ms);
            node.items.push(i);
        }
        self.exchange(cfg, health, &mut |i, reply| {
            done(
                i,
                match reply {
                    Ok(Value::ServerError(_)) => Outcome::Refused,
                    Ok(_) => Outcome::Stored,
                    Err(()) => Outcome::Failed,
                },
            );
        });
        Ok(())
    }

    /// Reads `keys` with `GET`, one pipeline per node, and returns each
    /// key's reply in key order. `Err` when the slot map could not be read.
    pub(crate) fn read(
        &mut self,
        cfg: &TierConfig,
        health: &Health,
        keys: &[String],
    ) -> Result<Vec<Got>, NoMap> {
        self.ensure_map(cfg, health)?;
        let mut got: Vec<Got> = keys.iter().map(|_| Got::Skipped).collect();
        let down = health.down_now(&self.nodes);
        for (i, key) in keys.iter().enumerate() {
            let Some(node) = self.route(key) else {
                continue;
            };
            if down[node] {
                continue;
            }
            let node = &mut self.nodes[node];
            pack(&mut node.buf, &mut self.key, &[b"GET", key.as_bytes()]);
            node.items.push(i);
        }
        self.exchange(cfg, health, &mut |i, reply| {
            got[i] = match reply {
                Ok(Value::BulkString(b)) => Got::Data(b),
                Ok(Value::Nil) => Got::Nil,
                Ok(Value::ServerError(e)) if matches!(e.code(), "MOVED" | "ASK") => Got::Elsewhere,
                Ok(_) => Got::Refused,
                Err(()) => Got::Failed,
            };
        });
        Ok(got)
    }

    /// Deletes `key` (a value that is not what it claims), best effort.
    pub(crate) fn delete(&mut self, cfg: &TierConfig, health: &Health, key: &str) {
        if self.ensure_map(cfg, health).is_err() {
            return;
        }
        let Some(node) = self.route(key) else { return };
        let node = &mut self.nodes[node];
        if health.is_down(&node.name) {
            return;
        }
        pack(&mut node.buf, &mut self.key, &[b"DEL", key.as_bytes()]);
        node.items.push(0);
        self.exchange(cfg, health, &mut |_, _| {});
    }

    /// Sends every node its packed commands, then reads each node's
    /// replies, handing each to `reply` with its item index (`Err`: the
    /// connection failed before it answered). Every node is sent its
    /// pipeline before any answer is read, so that the nodes work on
    /// theirs at the same time; a failed node is dropped, marked in
    /// `health` and the map read again before the next batch.
    fn exchange(
        &mut self,
        cfg: &TierConfig,
        health: &Health,
        reply: &mut dyn FnMut(usize, Result<Value, ()>),
    ) {
        let mut failed = false;
        for node in &mut self.nodes {
            if !node.items.is_empty() && node.send(cfg).is_err() {
                node.fail(health, cfg, reply);
                failed = true;
            }
        }
        for node in &mut self.nodes {
            let mut answered = false;
            let mut n = 0;
            while n < node.items.len() {
                let got = node.con.as_mut().map(|c| c.recv_response());
                // A reused connection closed while it idled fails at its
                // first reply: the batch goes again on a new one (GET, SET
                // and DEL may repeat). A timeout is the node's own fault.
                if n == 0 && node.reused && matches!(&got, Some(Err(e)) if !e.is_timeout()) {
                    // On a new connection: the failed one may still be
                    // open, with a reply owed that would answer the wrong
                    // command.
                    node.con = None;
                    if node.send(cfg).is_ok() {
                        node.reused = false;
                        continue;
                    }
                    node.fail(health, cfg, reply);
                    failed = true;
                    break;
                }
                match got {
                    Some(Ok(v)) => {
                        if let Value::ServerError(e) = &v {
                            match e.code() {
                                "MOVED" => {
                                    self.stale = true;
                                    self.moved = true;
                                }
                                "CLUSTERDOWN" | "TRYAGAIN" => self.stale = true,
                                _ => {}
                            }
                        }
                        answered = true;
                        reply(node.items[n], Ok(v));
                        n += 1;
                    }
                    // Failed while reading: what is left is unknown.
                    Some(Err(_)) => {
                        node.items.drain(..n);
                        node.fail(health, cfg, reply);
                        failed = true;
                        answered = false;
                        break;
                    }
                    // Failed while sending, and already counted.
                    None => break,
                }
            }
            if answered {
                health.answered(&node.name);
            }
            node.buf.clear();
            node.items.clear();
        }
        if failed {
            // The node may have failed over, or gone for good.
            self.stale = true;
        }
    }

    /// Reads the slot map again if it is stale and due (see `refreshed`);
    /// `Err` when there is none to use.
    fn ensure_map(&mut self, cfg: &TierConfig, health: &Health) -> Result<(), NoMap> {
        let due = self.nodes.is_empty()
            || self.moved
            || self
                .refreshed
                .is_none_or(|t| t.elapsed() >= cfg.min_backoff);
        if self.stale && due {
            self.refreshed = Some(Instant::now());
            self.moved = false;
            self.refresh(cfg, health).map_err(|_| NoMap)?;
        }
        if self.nodes.is_empty() {
            // A map that named no node (a cluster still forming): read it
            // again when due.
            self.stale = true;
            return Err(NoMap);
        }
        Ok(())
    }

    /// Reads the slot map (`CLUSTER SLOTS`) from the first URL that
    /// answers, those not backing off first, keeping the connections of
    /// nodes that stay.
    fn refresh(&mut self, cfg: &TierConfig, health: &Health) -> redis::RedisResult<()> {
        let mut last = None;
        // A URL that does not parse is skipped, not the end of every read.
        let mut seeds: Vec<redis::Client> = cfg
            .urls
            .iter()
            .filter_map(|url| match redis::Client::open(url.as_str()) {
                Ok(c) => Some(c),
                Err(e) => {
                    last = Some(e);
                    None
                }
            })
            .collect();
        let name = |c: &redis::Client| c.get_connection_info().addr().to_string();
        seeds.sort_by_key(|c| health.is_down(&name(c)));
        for client in seeds {
            if !self.cluster {
                self.nodes = vec![Node::new(client.get_connection_info().clone())];
                self.stale = false;
                return Ok(());
            }
            let answer = client
                .get_connection_with_timeout(cfg.connect_timeout)
                .and_then(|mut con| {
                    con.set_read_timeout(Some(cfg.io_timeout))?;
                    redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(&mut con)
                });
            match answer {
                Ok(map) => {
                    // Not `health.answered`: a node that answers this small
                    // read may still be failing its data (its backoff runs).
                    self.apply(client.get_connection_info(), &map);
                    self.stale = false;
                    return Ok(());
                }
                Err(e) => {
                    health.failed(&name(&client), cfg);
                    last = Some(e);
                }
            }
        }
        Err(last.unwrap_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Client, "no URL to read the slot map from"))
        }))
    }

    /// Takes a `CLUSTER SLOTS` answer: `[start, end, [host, port, ...],
    /// replicas...]` per range; the first address is the master, and a
    /// later range overrides an earlier one's slots. Nodes are made for
    /// the addresses that own a slot once every range is read, so there
    /// are at most as many as slots and their indices fit the owner map,
    /// whatever the answer holds.
    pub(crate) fn apply(&mut self, seed: &redis::ConnectionInfo, map: &Value) {
        // Each slot's address, as an index into `addrs` (u32::MAX: none).
        let mut by_slot = vec![u32::MAX; SLOTS];
        let mut addrs: Vec<(String, u16)> = Vec::new();
        let mut seen: HashMap<(String, u16), u32> = HashMap::new();
        let ranges = match map {
            Value::Array(ranges) => ranges.as_slice(),
            _ => &[],
        };
        for range in ranges {
            let Value::Array(r) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (r.first(), r.get(1), r.get(2))
            else {
                continue;
            };
            let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1)) else {
                continue;
            };
            // CLUSTER SLOTS: a NULL or empty endpoint is the host of the
            // node asked (the seed); "?" is a node whose endpoint is not
            // known, whose slots stay unowned (refused, not failed).
            let host = match host {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                Value::Nil => String::new(),
                _ => continue,
            };
            let host = match host.as_str() {
                "?" => continue,
                "" => match seed.addr() {
                    ConnectionAddr::Tcp(h, _) | ConnectionAddr::TcpTls { host: h, .. } => h.clone(),
                    _ => continue,
                },
                _ => host,
            };
            let (Ok(port), Ok(start), Ok(end)) = (
                u16::try_from(*port),
                usize::try_from(*start),
                usize::try_from(*end),
            ) else {
                continue;
            };
            if start > end || start >= SLOTS {
                continue;
            }
            let next = addrs.len() as u32;
            let index = *seen.entry((host, port)).or_insert_with_key(|a| {
                addrs.push(a.clone());
                next
            });
            by_slot[start..=end.min(SLOTS - 1)].fill(index);
        }
        // The nodes, in order of their first slot, keeping the open
        // connection of a node that stays.
        let mut old: HashMap<(String, u16), Node> = std::mem::take(&mut self.nodes)
            .into_iter()
            .filter_map(|n| match n.info.addr() {
                ConnectionAddr::Tcp(h, p) => Some(((h.clone(), *p), n)),
                _ => None,
            })
            .collect();
        let mut node_of = vec![u16::MAX; addrs.len()];
        let mut nodes: Vec<Node> = Vec::new();
        let owner = by_slot
            .iter()
            .map(|&a| {
                let Some(node) = node_of.get_mut(a as usize) else {
                    return u16::MAX;
                };
                if *node == u16::MAX {
                    // At most one node per slot: below u16::MAX.
                    *node = nodes.len() as u16;
                    let (host, port) = addrs[a as usize].clone();
                    nodes.push(old.remove(&(host.clone(), port)).unwrap_or_else(|| {
                        Node::new(seed.clone().set_addr(ConnectionAddr::Tcp(host, port)))
                    }));
                }
                *node
            })
            .collect();
        self.nodes = nodes;
        self.owner = owner;
    }
}

/// What the last slot map was read as (tests and fuzzing).
#[cfg(any(test, feature = "fuzzing"))]
impl Nodes {
    /// The address of the node that owns `slot`, if any.
    pub(crate) fn owner_of(&self, slot: usize) -> Option<&ConnectionAddr> {
        let node = *self.owner.get(slot)?;
        self.nodes.get(usize::from(node)).map(|n| n.info.addr())
    }

    /// The node index `slot` maps to (`u16::MAX`: none), as stored.
    pub(crate) fn owner_index(&self, slot: usize) -> u16 {
        self.owner.get(slot).copied().unwrap_or(u16::MAX)
    }

    /// Every node's address, in index order.
    pub(crate) fn node_addrs(&self) -> Vec<&ConnectionAddr> {
        self.nodes.iter().map(|n| n.info.addr()).collect()
    }
}

impl Node {
    fn new(info: redis::ConnectionInfo) -> Self {
        Self {
            name: info.addr().to_string(),
            info,
            con: None,
            reused: false,
            buf: Vec::new(),
            items: Vec::new(),
        }
    }

    /// Sends the packed batch, connecting first if need be; the answers
    /// are read later. A connection an earlier batch used that fails to
    /// send is replaced once.
    fn send(&mut self, cfg: &TierConfig) -> redis::RedisResult<()> {
        self.reused = self.con.is_some();
        if self.reused {
            match self.con.as_mut().map(|c| c.send_packed_command(&self.buf)) {
                Some(Ok(())) => return Ok(()),
                // A node too slow to take the batch is no closed
                // connection: the wait is not paid twice.
                Some(Err(e)) if e.is_timeout() => return Err(e),
                _ => {}
            }
            self.reused = false;
        }
        self.con = None;
        let client = redis::Client::open(self.info.clone())?;
        let con = client.get_connection_with_timeout(cfg.connect_timeout)?;
        con.set_read_timeout(Some(cfg.io_timeout))?;
        con.set_write_timeout(Some(cfg.io_timeout))?;
        self.con.insert(con).send_packed_command(&self.buf)
    }

    /// Drops the connection, whose state is unknown, reports the node's
    /// unanswered items as failed and starts (or lengthens) its backoff.
    fn fail(
        &mut self,
        health: &Health,
        cfg: &TierConfig,
        reply: &mut dyn FnMut(usize, Result<Value, ()>),
    ) {
        self.con = None;
        health.failed(&self.name, cfg);
        self.items.drain(..).for_each(|i| reply(i, Err(())));
    }
}

/// Appends the command `args` to `buf` in RESP.
fn pack(buf: &mut Vec<u8>, scratch: &mut String, args: &[&[u8]]) {
    scratch.clear();
    let _ = write!(scratch, "*{}\r\n", args.len());
    buf.extend_from_slice(scratch.as_bytes());
    for a in args {
        scratch.clear();
        let _ = write!(scratch, "${}\r\n", a.len());
        buf.extend_from_slice(scratch.as_bytes());
        buf.extend_from_slice(a);
        buf.extend_from_slice(b"\r\n");
    }
}

/// Appends `SET key value [PX ms]` to `buf` in RESP, the value being the
/// header followed by the page.
fn pack_set(buf: &mut Vec<u8>, scratch: &mut String, item: &Item<'_>, ttl_ms: Option<u64>) {
    scratch.clear();
    let value_len = item.header.len() + item.page.len();
    let _ = write!(
        scratch,
        "*{}\r\n$3\r\nSET\r\n${}\r\n{}\r\n${}\r\n",
        if ttl_ms.is_some() { 5 } else { 3 },
        item.key.len(),
        item.key,
        value_len
    );
    buf.reserve(scratch.len() + value_len + 64);
    buf.extend_from_slice(scratch.as_bytes());
    buf.extend_from_slice(item.header);
    buf.extend_from_slice(item.page);
    buf.extend_from_slice(b"\r\n");
    if let Some(ms) = ttl_ms {
        scratch.clear();
        let digits = ms.to_string();
        let _ = write!(scratch, "$2\r\nPX\r\n${}\r\n{}\r\n", digits.len(), digits);
        buf.extend_from_slice(scratch.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node a slot map is read from, in the tests below.
    fn seed() -> redis::ConnectionInfo {
        redis::Client::open("redis://127.0.0.1:7000/")
            .unwrap()
            .get_connection_info()
            .clone()
    }

    /// One `CLUSTER SLOTS` range whose master is `host`:`port`.
    fn range(start: i64, end: i64, host: Value, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![host, Value::Int(port)]),
        ])
    }

    /// A host name as a reply carries it.
    fn name(host: &str) -> Value {
        Value::BulkString(host.as_bytes().to_vec())
    }

    #[test]
    fn slots_match_redis_cluster_spec() {
        // The spec's CRC-16 check value, and keys whose slots Redis prints.
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31c3
        );
        assert_eq!(slot(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        // Hash tags: the text inside the first non-empty braces.
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // Empty braces are no tag: the whole key is hashed.
        assert_eq!(
            slot(b"foo{}{bar}"),
            crc16::State::<crc16::XMODEM>::calculate(b"foo{}{bar}") % 16384
        );
        assert_eq!(slot(b"foo{}{bar}"), 8363);
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
    }

    /// A CLUSTER SLOTS answer whose endpoints are NULL or empty names the
    /// seed's host; one whose endpoint is "?" leaves its slots unowned.
    #[test]
    fn slot_maps_resolve_unnamed_endpoints_to_the_seed() {
        let map = Value::Array(vec![
            range(0, 99, Value::Nil, 7000),
            range(100, 199, Value::BulkString(Vec::new()), 7001),
            range(200, 299, name("?"), 7002),
        ]);
        let mut w = Nodes::new(true);
        w.apply(&seed(), &map);
        let addr = |slot: usize| w.nodes[w.owner[slot] as usize].info.addr().clone();
        assert_eq!(addr(0), ConnectionAddr::Tcp("127.0.0.1".into(), 7000));
        assert_eq!(addr(150), ConnectionAddr::Tcp("127.0.0.1".into(), 7001));
        assert_eq!(w.owner[250], u16::MAX, "an unknown endpoint owns nothing");
    }

    /// An answer naming more nodes than a slot index holds, in ranges that
    /// own no slot (start after end, or past the last slot): they add no
    /// node, so a real range after them is still owned by its own node
    /// (with a node each, its index wrapped to another node's).
    #[test]
    fn ranges_that_own_no_slot_add_no_node() {
        let mut ranges: Vec<Value> = (0..70_000)
            .map(|i| {
                let (start, end) = if i % 2 == 0 { (5, 4) } else { (20_000, 20_001) };
                range(start, end, name(&format!("empty{i}")), 7000)
            })
            .collect();
        ranges.push(range(0, 16383, name("owner"), 7000));
        let mut w = Nodes::new(true);
        w.apply(&seed(), &Value::Array(ranges));
        assert_eq!(w.node_addrs().len(), 1);
        assert_eq!(
            w.owner_of(0),
            Some(&ConnectionAddr::Tcp("owner".into(), 7000))
        );
    }

    /// The same, with ranges that each own slot 0 when read and lose it to
    /// the next: only the last range's node is made, with the last index.
    #[test]
    fn ranges_overridden_later_add_no_node() {
        let ranges: Vec<Value> = (0..70_000)
            .map(|i| range(0, 0, name(&format!("h{i}")), 7000))
            .collect();
        let mut w = Nodes::new(true);
        w.apply(&seed(), &Value::Array(ranges));
        assert_eq!(w.node_addrs().len(), 1);
        assert_eq!(
            w.owner_of(0),
            Some(&ConnectionAddr::Tcp("h69999".into(), 7000))
        );
        assert_eq!(w.owner_of(1), None);
    }

    #[test]
    fn commands_pack_as_resp() {
        let (mut buf, mut scratch) = (Vec::new(), String::new());
        pack(&mut buf, &mut scratch, &[b"GET", b"ns:k"]);
        assert_eq!(buf, b"*2\r\n$3\r\nGET\r\n$4\r\nns:k\r\n");
    }

    #[test]
    fn set_packs_as_resp() {
        let (mut buf, mut scratch) = (Vec::new(), String::new());
        let item = Item {
            key: "ns:k",
            header: b"HD",
            page: b"page",
        };
        pack_set(&mut buf, &mut scratch, &item, None);
        assert_eq!(buf, b"*3\r\n$3\r\nSET\r\n$4\r\nns:k\r\n$6\r\nHDpage\r\n");
        buf.clear();
        pack_set(&mut buf, &mut scratch, &item, Some(1500));
        assert_eq!(
            buf,
            b"*5\r\n$3\r\nSET\r\n$4\r\nns:k\r\n$6\r\nHDpage\r\n$2\r\nPX\r\n$4\r\n1500\r\n"
        );
    }
}
