//! The tier's reading of `CLUSTER SLOTS`, the one answer from the
//! network it interprets itself: arbitrary RESP bytes through redis-rs's
//! parser, and answers built from arbitrary ranges (well formed or not)
//! against a model of what each range means.

use arbitrary::Unstructured;
use redis::{ConnectionAddr, IntoConnectionInfo, Value};

use crate::nodes::{Nodes, SLOTS};

/// A range's endpoint, as `CLUSTER SLOTS` may name it.
#[derive(Clone, Copy)]
enum Host {
    /// NULL: the node asked (the seed).
    Nil,
    /// "": the node asked.
    Empty,
    /// "?": not known; its slots stay as they were.
    Unknown,
    /// A host name, one of a few.
    Name(u8),
    /// Not a string at all: the range is skipped.
    Int,
}

/// How the range is written.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// `[start, end, [host, port]]`
    Plain,
    /// With the node id, a metadata map and two replicas after it.
    Full,
    /// `[start, end]`: no master, skipped.
    NoMaster,
    /// `[start, end, [host]]`: no port, skipped.
    NoPort,
    /// The start as a string: skipped.
    TextStart,
    /// Not an array: skipped.
    NotArray,
}

struct Range {
    start: i64,
    end: i64,
    host: Host,
    port: i64,
    shape: Shape,
}

/// Applies `data` as slot maps to a [`Nodes`]. With an odd first byte the rest
/// is RESP, parsed as redis-rs parses a reply: whatever it holds, every
/// slot ends owned by a known node or by none, and every node owns a
/// slot. Otherwise the bytes build two maps of up to eight
/// ranges each, applied one after the other (a refresh): after each, every
/// slot is owned as the last range naming it says.
pub fn slot_map(data: &[u8]) {
    let seed = "redis://seed:7000/"
        .into_connection_info()
        .expect("a valid URL");
    let mut w = Nodes::new(true);
    let (&mode, rest) = data.split_first().unwrap_or((&0, &[]));
    if mode & 1 == 1 {
        if let Ok(answer) = redis::parse_redis_value(rest) {
            w.apply(&seed, &answer);
            check_nodes(&w);
        }
        return;
    }
    let mut u = Unstructured::new(rest);
    for _ in 0..2 {
        let n = u.int_in_range(0..=8).unwrap_or(0);
        let ranges: Vec<Range> = (0..n).map(|_| range(&mut u)).collect();
        w.apply(&seed, &Value::Array(ranges.iter().map(encode).collect()));
        check_nodes(&w);
        let want = model(&ranges);
        for (slot, want) in want.iter().enumerate() {
            assert_eq!(w.owner_of(slot), want.as_ref(), "slot {slot}");
        }
    }
}

/// Every slot is owned by an index of one of its nodes, or by
/// none; nodes are distinct, each owns a slot, and there are no more of
/// them than slots.
fn check_nodes(w: &Nodes) {
    let nodes = w.node_addrs();
    assert!(nodes.len() <= SLOTS, "{} nodes", nodes.len());
    for (i, a) in nodes.iter().enumerate() {
        assert!(!nodes[..i].contains(a), "{a:?} twice");
    }
    let mut owns = vec![false; nodes.len()];
    for slot in 0..SLOTS {
        let i = w.owner_index(slot);
        if i != u16::MAX {
            assert!(usize::from(i) < nodes.len(), "slot {slot}: node {i}");
            owns[usize::from(i)] = true;
        }
    }
    assert!(owns.iter().all(|&o| o), "a node that owns no slot");
}

fn range(u: &mut Unstructured<'_>) -> Range {
    let bound = |u: &mut Unstructured<'_>| match u.int_in_range(0..=7).unwrap_or(0) {
        0 => -1,
        1 => SLOTS as i64 - 1,
        2 => SLOTS as i64,
        3 => i64::MAX,
        _ => i64::from(u.int_in_range(0..=16383u16).unwrap_or(0)),
    };
    let (start, end) = (bound(u), bound(u));
    let host = match u.int_in_range(0..=7).unwrap_or(0) {
        0 => Host::Nil,
        1 => Host::Empty,
        2 => Host::Unknown,
        3 => Host::Int,
        _ => Host::Name(u.int_in_range(0..=3).unwrap_or(0)),
    };
    let port = match u.int_in_range(0..=7).unwrap_or(0) {
        0 => -1,
        1 => 65536,
        _ => i64::from(7000 + u.int_in_range(0..=3u16).unwrap_or(0)),
    };
    let shape = match u.int_in_range(0..=9).unwrap_or(0) {
        0 => Shape::NoMaster,
        1 => Shape::NoPort,
        2 => Shape::TextStart,
        3 => Shape::NotArray,
        4 | 5 => Shape::Full,
        _ => Shape::Plain,
    };
    Range {
        start,
        end,
        host,
        port,
        shape,
    }
}

fn encode(r: &Range) -> Value {
    let host = match r.host {
        Host::Nil => Value::Nil,
        Host::Empty => Value::BulkString(Vec::new()),
        Host::Unknown => Value::BulkString(b"?".to_vec()),
        Host::Name(n) => Value::BulkString(format!("node{n}").into_bytes()),
        Host::Int => Value::Int(1),
    };
    let mut master = vec![host, Value::Int(r.port)];
    if r.shape == Shape::Full {
        master.push(Value::BulkString(b"07c37dfeb235213a".to_vec()));
        master.push(Value::Map(vec![(
            Value::BulkString(b"hostname".to_vec()),
            Value::BulkString(b"elsewhere".to_vec()),
        )]));
    }
    if r.shape == Shape::NoPort {
        master.truncate(1);
    }
    let start = if r.shape == Shape::TextStart {
        Value::BulkString(r.start.to_string().into_bytes())
    } else {
        Value::Int(r.start)
    };
    let mut v = vec![start, Value::Int(r.end), Value::Array(master)];
    match r.shape {
        Shape::NoMaster => v.truncate(2),
        Shape::Full => {
            for port in [8000, 8001] {
                v.push(Value::Array(vec![
                    Value::BulkString(b"replica".to_vec()),
                    Value::Int(port),
                ]));
            }
        }
        _ => {}
    }
    if r.shape == Shape::NotArray {
        Value::Int(r.start)
    } else {
        Value::Array(v)
    }
}

/// Each slot's owner by the meaning of the ranges, applied in order.
fn model(ranges: &[Range]) -> Vec<Option<ConnectionAddr>> {
    let mut owner = vec![None; SLOTS];
    for r in ranges {
        if !matches!(r.shape, Shape::Plain | Shape::Full) {
            continue;
        }
        let host = match r.host {
            Host::Nil | Host::Empty => "seed".to_string(),
            Host::Name(n) => format!("node{n}"),
            Host::Unknown | Host::Int => continue,
        };
        let (Ok(port), Ok(start), Ok(end)) = (
            u16::try_from(r.port),
            usize::try_from(r.start),
            usize::try_from(r.end),
        ) else {
            continue;
        };
        for o in owner.iter_mut().take(end.saturating_add(1)).skip(start) {
            *o = Some(ConnectionAddr::Tcp(host.clone(), port));
        }
    }
    owner
}
