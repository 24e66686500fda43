//! The wire format: vLLM's `KVEventBatch`, as msgpack.
//!
//! A batch is the array `[ts, events, data_parallel_rank]`: `ts` a float of
//! seconds since the Unix epoch, `rank` nil. Each event is an array whose
//! first element names it, then vLLM's fields in the order of vLLM's
//! array-encoded structs (nil where kvslice has nothing to say), then
//! kvslice's own, which an array-like vLLM consumer ignores as extra
//! trailing fields:
//!
//! - `["BlockStored", block_hashes, parent_block_hash, token_ids,
//!   block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//!   kv_cache_spec_kind, kv_cache_spec_sliding_window, head_shard,
//!   first_block_index, num_tokens]`: a run of blocks of one sequence,
//!   each the parent of the next; hashes are 16-byte big-endian binaries
//!   (kvslice's 128-bit keys); `parent_block_hash` the block before the
//!   first, or nil; `token_ids` empty (the store keeps keys, not tokens);
//!   `group_idx` the pages' layer group; `num_tokens` the tokens each
//!   block holds; `lora_id`, `lora_name`, `extra_keys` and the two
//!   `kv_cache_spec` fields nil;
//! - `["BlockRemoved", block_hashes, medium, group_idx, head_shard]`,
//!   `group_idx` the layer group;
//! - `["AllBlocksCleared"]`.

use kvslice_core::events::{KvEvent, Medium};
use kvslice_core::{BlockHash, SliceKey};
use rmpv::Value;

/// One event as it travels: consecutive per-block events of one sequence
/// folded together, as vLLM sends them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireEvent {
    /// Blocks stored, each the parent of the next.
    Stored {
        /// Block hashes, in sequence order.
        hashes: Vec<BlockHash>,
        /// The block before the first, if any.
        parent: Option<BlockHash>,
        /// Tokens each block holds.
        tokens: Vec<u32>,
        /// Tokens per page.
        block_size: u32,
        /// Where the pages live.
        medium: String,
        /// Layer group of the pages.
        layer_group: u32,
        /// Head shard of the pages.
        head_shard: u32,
        /// Position of the first block in its sequence.
        first_block_index: u32,
    },
    /// Blocks removed.
    Removed {
        /// Their hashes.
        hashes: Vec<BlockHash>,
        /// Where they lived.
        medium: String,
        /// Layer group.
        layer_group: u32,
        /// Head shard.
        head_shard: u32,
    },
    /// Every block is gone.
    Cleared,
}

/// A decoded batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Seconds since the Unix epoch when it was sent.
    pub ts: f64,
    /// Its events, in order.
    pub events: Vec<WireEvent>,
    /// Names of events of kinds this decoder does not know, skipped (a
    /// newer publisher's additions do not cost a consumer the batch).
    pub skipped: Vec<String>,
}

/// Folds per-block events into wire events: a stored block whose parent is
/// the previous stored block of the same layer group and shard, and whose
/// index follows it, joins its run; consecutive removals of one group and shard share an event.
///
/// ```
/// use kvslice_core::events::{KvEvent, Medium};
/// use kvslice_core::{BlockHash, SliceKey};
/// use kvslice_events::wire::{WireEvent, fold};
///
/// let key = |b, i| SliceKey { block: BlockHash(b), block_index: i, layer_group: 0, head_shard: 0 };
/// let events = [
///     KvEvent::Stored { key: key(10, 0), parent: None, tokens: 16 },
///     KvEvent::Stored { key: key(11, 1), parent: Some(BlockHash(10)), tokens: 4 },
///     KvEvent::Removed { key: key(10, 0) },
/// ];
/// let wire = fold(&events, 16, Medium::Gpu);
/// assert_eq!(wire.len(), 2);
/// assert!(matches!(&wire[0], WireEvent::Stored { hashes, tokens, .. } if hashes.len() == 2 && tokens[..] == [16, 4]));
/// ```
pub fn fold(events: &[KvEvent], block_size: u32, medium: Medium) -> Vec<WireEvent> {
    let medium = medium.as_str().to_string();
    let mut out: Vec<WireEvent> = Vec::new();
    for e in events {
        match *e {
            KvEvent::Stored {
                key,
                parent,
                tokens,
            } => {
                if let Some(WireEvent::Stored {
                    hashes,
                    tokens: ts,
                    layer_group,
                    head_shard,
                    first_block_index,
                    ..
                }) = out.last_mut()
                    && (*layer_group, *head_shard) == (key.layer_group, key.head_shard)
                    && first_block_index.checked_add(hashes.len() as u32) == Some(key.block_index)
                    && parent.is_some()
                    && hashes.last().copied() == parent
                {
                    hashes.push(key.block);
                    ts.push(tokens);
                    continue;
                }
                out.push(WireEvent::Stored {
                    hashes: vec![key.block],
                    parent,
                    tokens: vec![tokens],
                    block_size,
                    medium: medium.clone(),
                    layer_group: key.layer_group,
                    head_shard: key.head_shard,
                    first_block_index: key.block_index,
                });
            }
            KvEvent::Removed { key } => {
                if let Some(WireEvent::Removed {
                    hashes,
                    layer_group,
                    head_shard,
                    ..
                }) = out.last_mut()
                    && (*layer_group, *head_shard) == (key.layer_group, key.head_shard)
                {
                    hashes.push(key.block);
                    continue;
                }
                out.push(WireEvent::Removed {
                    hashes: vec![key.block],
                    medium: medium.clone(),
                    layer_group: key.layer_group,
                    head_shard: key.head_shard,
                });
            }
            KvEvent::Cleared => out.push(WireEvent::Cleared),
        }
    }
    out
}

/// The keys a wire event names, as a consumer's index holds them.
pub fn keys(event: &WireEvent) -> Vec<SliceKey> {
    match event {
        WireEvent::Stored {
            hashes,
            layer_group,
            head_shard,
            first_block_index,
            ..
        } => hashes
            .iter()
            .enumerate()
            .map(|(i, &block)| SliceKey {
                block,
                block_index: first_block_index + i as u32,
                layer_group: *layer_group,
                head_shard: *head_shard,
            })
            .collect(),
        WireEvent::Removed { .. } | WireEvent::Cleared => Vec::new(),
    }
}

fn hash_value(h: BlockHash) -> Value {
    Value::Binary(h.0.to_be_bytes().to_vec())
}

fn hashes_value(hs: &[BlockHash]) -> Value {
    Value::Array(hs.iter().map(|&h| hash_value(h)).collect())
}

/// `BlockStored`'s field positions past vLLM's own: the layer group sits
/// in vLLM's `group_idx`, and kvslice's fields follow vLLM's last.
const STORED_GROUP_IDX: usize = 9;
const STORED_HEAD_SHARD: usize = 12;
const STORED_FIRST_BLOCK_INDEX: usize = 13;
const STORED_NUM_TOKENS: usize = 14;

/// Encodes a batch.
pub fn encode(ts: f64, events: &[WireEvent]) -> Vec<u8> {
    let events = events
        .iter()
        .map(|e| match e {
            WireEvent::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                medium,
                layer_group,
                head_shard,
                first_block_index,
            } => Value::Array(vec![
                Value::from("BlockStored"),
                hashes_value(hashes),
                parent.map_or(Value::Nil, hash_value),
                Value::Array(Vec::new()),
                Value::from(*block_size),
                Value::Nil,
                Value::from(medium.as_str()),
                // vLLM's lora_name, extra_keys, group_idx (the layer
                // group), kv_cache_spec_kind, kv_cache_spec_sliding_window.
                Value::Nil,
                Value::Nil,
                Value::from(*layer_group),
                Value::Nil,
                Value::Nil,
                Value::from(*head_shard),
                Value::from(*first_block_index),
                Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
            ]),
            WireEvent::Removed {
                hashes,
                medium,
                layer_group,
                head_shard,
            } => Value::Array(vec![
                Value::from("BlockRemoved"),
                hashes_value(hashes),
                Value::from(medium.as_str()),
                Value::from(*layer_group),
                Value::from(*head_shard),
            ]),
            WireEvent::Cleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
        })
        .collect();
    let batch = Value::Array(vec![Value::F64(ts), Value::Array(events), Value::Nil]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).expect("writing to a Vec cannot fail");
    out
}

/// Why a payload is not a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Not msgpack, or trailing bytes after the value.
    Msgpack,
    /// msgpack, but not a `KVEventBatch`; says what was wrong.
    Shape(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Msgpack => write!(f, "not a msgpack value"),
            DecodeError::Shape(what) => write!(f, "not a KVEventBatch: {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Nesting this decoder accepts (a batch is three deep); deeper input is a
/// shape error before it can exhaust the stack.
const MAX_DEPTH: usize = 16;

/// Decodes a batch. Never panics: anything that is not a batch in the
/// format above is an error, except events of unknown kinds, which are
/// skipped and named in [`Batch::skipped`].
pub fn decode(payload: &[u8]) -> Result<Batch, DecodeError> {
    let mut rd = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|_| DecodeError::Msgpack)?;
    if !rd.is_empty() {
        return Err(DecodeError::Msgpack);
    }
    let top = value
        .as_array()
        .ok_or(DecodeError::Shape("batch is not an array"))?;
    let ts = match top.first() {
        Some(Value::F64(t)) => *t,
        Some(Value::F32(t)) => f64::from(*t),
        Some(v) if v.as_u64().is_some() => v.as_u64().unwrap_or(0) as f64,
        _ => return Err(DecodeError::Shape("ts is not a number")),
    };
    let events = top
        .get(1)
        .and_then(Value::as_array)
        .ok_or(DecodeError::Shape("events is not an array"))?;
    let mut batch = Batch {
        ts,
        events: Vec::with_capacity(events.len()),
        skipped: Vec::new(),
    };
    for e in events {
        match event(e)? {
            Ok(e) => batch.events.push(e),
            Err(name) => batch.skipped.push(name),
        }
    }
    Ok(batch)
}

/// An event, or the name of a kind this decoder does not know.
fn event(v: &Value) -> Result<Result<WireEvent, String>, DecodeError> {
    let a = v
        .as_array()
        .ok_or(DecodeError::Shape("event is not an array"))?;
    let name = a
        .first()
        .and_then(Value::as_str)
        .ok_or(DecodeError::Shape("event has no name"))?;
    let field = |i: usize| a.get(i).ok_or(DecodeError::Shape("event too short"));
    let u32_at = |i: usize| -> Result<u32, DecodeError> {
        field(i)?
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or(DecodeError::Shape("field is not a u32"))
    };
    let str_at = |i: usize| -> Result<String, DecodeError> {
        Ok(field(i)?
            .as_str()
            .ok_or(DecodeError::Shape("field is not a string"))?
            .to_string())
    };
    match name {
        "BlockStored" => Ok(Ok({
            let hashes = hashes(field(1)?)?;
            let parent = match field(2)? {
                Value::Nil => None,
                v => Some(hash(v)?),
            };
            let tokens = field(STORED_NUM_TOKENS)?
                .as_array()
                .ok_or(DecodeError::Shape("num_tokens is not an array"))?
                .iter()
                .map(|t| {
                    t.as_u64()
                        .and_then(|x| u32::try_from(x).ok())
                        .ok_or(DecodeError::Shape("a token count is not a u32"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if tokens.len() != hashes.len() {
                return Err(DecodeError::Shape(
                    "num_tokens and block_hashes differ in length",
                ));
            }
            let first_block_index = u32_at(STORED_FIRST_BLOCK_INDEX)?;
            let last = u32::try_from(hashes.len().saturating_sub(1)).ok();
            if last
                .and_then(|l| first_block_index.checked_add(l))
                .is_none()
            {
                return Err(DecodeError::Shape("block indices overflow"));
            }
            WireEvent::Stored {
                hashes,
                parent,
                tokens,
                block_size: u32_at(4)?,
                medium: str_at(6)?,
                layer_group: u32_at(STORED_GROUP_IDX)?,
                head_shard: u32_at(STORED_HEAD_SHARD)?,
                first_block_index,
            }
        })),
        "BlockRemoved" => Ok(Ok(WireEvent::Removed {
            hashes: hashes(field(1)?)?,
            medium: str_at(2)?,
            layer_group: u32_at(3)?,
            head_shard: u32_at(4)?,
        })),
        "AllBlocksCleared" => Ok(Ok(WireEvent::Cleared)),
        other => Ok(Err(other.to_string())),
    }
}

fn hash(v: &Value) -> Result<BlockHash, DecodeError> {
    let b = match v {
        Value::Binary(b) => b,
        _ => return Err(DecodeError::Shape("a block hash is not binary")),
    };
    let bytes: [u8; 16] = b
        .as_slice()
        .try_into()
        .map_err(|_| DecodeError::Shape("a block hash is not 16 bytes"))?;
    Ok(BlockHash(u128::from_be_bytes(bytes)))
}

fn hashes(v: &Value) -> Result<Vec<BlockHash>, DecodeError> {
    v.as_array()
        .ok_or(DecodeError::Shape("block_hashes is not an array"))?
        .iter()
        .map(hash)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u128, i: u32, g: u32) -> SliceKey {
        SliceKey {
            block: BlockHash(b),
            block_index: i,
            layer_group: g,
            head_shard: 1,
        }
    }

    #[test]
    fn batches_round_trip() {
        let events = [
            KvEvent::Stored {
                key: key(u128::MAX, 0, 0),
                parent: None,
                tokens: 16,
            },
            KvEvent::Stored {
                key: key(5, 1, 0),
                parent: Some(BlockHash(u128::MAX)),
                tokens: 16,
            },
            // Another layer group: a run of its own.
            KvEvent::Stored {
                key: key(5, 1, 1),
                parent: Some(BlockHash(u128::MAX)),
                tokens: 3,
            },
            KvEvent::Removed { key: key(5, 1, 0) },
            KvEvent::Removed { key: key(6, 2, 0) },
            KvEvent::Cleared,
        ];
        let wire = fold(&events, 16, Medium::Gpu);
        assert_eq!(wire.len(), 4);
        let bytes = encode(1.5, &wire);
        let batch = decode(&bytes).unwrap();
        assert_eq!(
            batch,
            Batch {
                ts: 1.5,
                events: wire.clone(),
                skipped: Vec::new()
            }
        );
        assert_eq!(keys(&wire[0]), [key(u128::MAX, 0, 0), key(5, 1, 0)]);
    }

    #[test]
    fn malformed_payloads_are_errors() {
        // An array of two that ends before its first element.
        assert_eq!(decode(&[0x92, 0xcb]), Err(DecodeError::Msgpack));
        let mut extra = encode(0.0, &[]);
        extra.push(0);
        assert_eq!(decode(&extra), Err(DecodeError::Msgpack));
        let v = |value: Value| {
            let mut out = Vec::new();
            rmpv::encode::write_value(&mut out, &value).unwrap();
            decode(&out)
        };
        assert!(matches!(v(Value::from(3)), Err(DecodeError::Shape(_))));
        let odd = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![
                Value::Array(vec![Value::from("BlockMoved")]),
                Value::Array(vec![Value::from("AllBlocksCleared")]),
            ]),
        ]);
        let odd = v(odd).unwrap();
        assert_eq!(
            (odd.events, odd.skipped),
            (vec![WireEvent::Cleared], vec!["BlockMoved".to_string()])
        );
        let short_hash = Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![Value::Array(vec![
                Value::from("BlockRemoved"),
                Value::Array(vec![Value::Binary(vec![1, 2])]),
                Value::from("GPU"),
                Value::from(0),
                Value::from(0),
            ])]),
        ]);
        assert!(matches!(v(short_hash), Err(DecodeError::Shape(_))));
        // Deep nesting is refused, not recursed into.
        let mut deep = Value::Nil;
        for _ in 0..100 {
            deep = Value::Array(vec![deep]);
        }
        assert_eq!(v(deep), Err(DecodeError::Msgpack));
    }
}
