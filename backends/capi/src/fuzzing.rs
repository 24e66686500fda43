//! Arbitrary sequences of ABI calls with arbitrary arguments: made-up,
//! destroyed and wrong-kind handles, null and short buffers, wrong
//! lengths, double destroys. Checked after every call: no panic reached
//! the boundary, bad pointers got their status, and drained events are
//! numbered on from the last drain. Checked at the end:
//! once every request has ended, every page of every store is free or
//! cached (nothing leaked), and caller memory is released.

use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr;

use arbitrary::Unstructured;

use crate::*;

fn small(u: &mut Unstructured<'_>, lo: u32, hi: u32) -> u32 {
    u.int_in_range(lo..=hi).unwrap_or(lo)
}

fn pick<T: Copy>(u: &mut Unstructured<'_>, from: &[T], made_up: impl FnOnce(u64) -> T) -> T {
    match (from.is_empty(), small(u, 0, 15)) {
        (false, 1..) => from[small(u, 0, from.len() as u32 - 1) as usize],
        _ => made_up(u64::from(small(u, 0, 1 << 20))),
    }
}

fn ok(status: KvsStatus) -> bool {
    assert_ne!(status, KvsStatus::Panic, "{}", last_error());
    status == KvsStatus::Ok
}

fn last_error() -> String {
    // SAFETY: kvs_last_error returns a NUL-terminated string that lives
    // until the next failing call on this thread.
    unsafe { CStr::from_ptr(kvs_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[derive(Default)]
struct World {
    layouts: Vec<KvsLayout>,
    coords: Vec<KvsCoordinator>,
    memories: Vec<KvsMemory>,
    stores: Vec<KvsStore>,
    requests: Vec<KvsRequest>,
    engines: Vec<KvsEngine>,
    keys: Vec<KvsKey>,
    /// Shapes of the layouts made, by layout id, then by store id.
    layout_shape: HashMap<u64, Shape>,
    store_shape: HashMap<u64, Shape>,
    request_store: HashMap<u64, u64>,
    /// The number the next drained event of a store must have.
    event_numbers: HashMap<u64, u64>,
    /// Every handle destroyed (or request ended) so far.
    destroyed: std::collections::HashSet<u64>,
}

/// What a well-formed call needs to know of a layout.
#[derive(Clone, Copy)]
struct Shape {
    info: KvsLayoutInfo,
    block_tokens: usize,
}

impl World {
    fn shape(&self, request: KvsRequest) -> Option<Shape> {
        let store = self.request_store.get(&request.id)?;
        self.store_shape.get(store).copied()
    }
}

/// Tokens the lane (0, 0) of `request` holds pages for.
fn table_tokens(request: KvsRequest, shape: Shape) -> usize {
    let mut len = 0usize;
    // SAFETY: a null table with capacity 0 only asks for the length.
    let s = unsafe { kvs_block_table(request, 0, 0, ptr::null_mut(), 0, &mut len) };
    if matches!(s, KvsStatus::Ok | KvsStatus::BufferTooSmall) {
        len * shape.block_tokens
    } else {
        0
    }
}

/// Calls that succeeded in a run, by operation (see `step`'s match), so
/// that a replay can show it reaches deep paths and not only refusals.
pub type Reached = [u32; 16];

/// Runs one sequence of calls.
pub fn calls(data: &[u8]) -> Reached {
    let mut u = Unstructured::new(data);
    let mut w = World::default();
    // Caller memory outlives every store: freed after the final checks.
    let mut arenas: Vec<Vec<u64>> = Vec::new();
    let mut reached = Reached::default();
    let mut steps = 0;
    while !u.is_empty() && steps < 200 {
        steps += 1;
        let op = small(&mut u, 0, 15);
        if step(op, &mut u, &mut w, &mut arenas) {
            reached[op as usize] += 1;
        }
    }
    finish(&w);
    drop(arenas);
    reached
}

/// Runs operation `op`; whether its call succeeded.
fn step(op: u32, u: &mut Unstructured<'_>, w: &mut World, arenas: &mut Vec<Vec<u64>>) -> bool {
    match op {
        0 => {
            let q = [1, 2, 4][small(u, 0, 2) as usize];
            let sane = KvsLayoutSpec {
                num_layers: small(u, 1, 2),
                num_q_heads: q,
                num_kv_heads: q >> small(u, 0, q.trailing_zeros()),
                head_dim: small(u, 1, 8),
                block_tokens: small(u, 1, 4),
                dtype: small(u, 0, 2),
                layers_per_group: small(u, 0, 1),
                head_shards: 1,
                key_order: small(u, 0, 1),
            };
            let wild = KvsLayoutSpec {
                num_layers: small(u, 0, 3),
                num_q_heads: small(u, 0, 4),
                num_kv_heads: small(u, 0, 2),
                head_dim: small(u, 0, 8),
                block_tokens: small(u, 0, 4),
                dtype: small(u, 0, 3),
                layers_per_group: small(u, 0, 2),
                head_shards: small(u, 0, 2),
                key_order: small(u, 0, 2),
            };
            let spec = if small(u, 0, 7) == 0 { wild } else { sane };
            let mut out = KvsLayout { id: 0 };
            // SAFETY: live locals.
            let done = ok(unsafe { kvs_layout_new(&spec, &mut out) });
            if done {
                w.layouts.push(out);
                let mut info = KvsLayoutInfo::default();
                // SAFETY: a live local.
                assert!(ok(unsafe { kvs_layout_info(out, &mut info) }));
                // The shards partition the heads, shard 0 first and
                // largest; one past the last is refused.
                let (mut kv, mut q) = (0, 0);
                for shard in 0..=info.head_shards {
                    let mut s = KvsShardInfo::default();
                    // SAFETY: a live local.
                    let status = unsafe { kvs_layout_shard_info(out, shard, &mut s) };
                    if shard == info.head_shards {
                        assert_eq!(status, KvsStatus::InvalidArgument);
                        continue;
                    }
                    assert_eq!(status, KvsStatus::Ok);
                    assert_eq!((s.first_kv_head, s.first_q_head), (kv, q));
                    assert!(s.kv_row <= info.kv_row && s.q_row <= info.q_row);
                    (kv, q) = (kv + s.kv_heads, q + s.q_heads);
                }
                assert_eq!((kv, q), (spec.num_kv_heads, spec.num_q_heads));
                let block_tokens = spec.block_tokens as usize;
                w.layout_shape.insert(out.id, Shape { info, block_tokens });
            }
            done
        }
        1 => {
            let layout = pick(u, &w.layouts, |id| KvsLayout { id });
            let secret = [small(u, 0, 255) as u8; 16];
            let mut out = KvsCoordinator { id: 0 };
            // SAFETY: live locals.
            let done = ok(unsafe { kvs_coordinator_new(layout, &secret, &mut out) });
            if done {
                w.coords.push(out);
            }
            done
        }
        2 => {
            let words = small(u, 1, 512) as usize;
            let mut arena = vec![0u64; words];
            let mut out = KvsMemory { id: 0 };
            // SAFETY: the arena lives until `calls` returns, after every
            // store on it is destroyed.
            let done =
                ok(unsafe { kvs_memory_wrap(arena.as_mut_ptr().cast(), words * 8, &mut out) });
            if done {
                w.memories.push(out);
            }
            arenas.push(arena);
            done
        }
        3 => {
            let layout = pick(u, &w.layouts, |id| KvsLayout { id });
            let policies = [c"default", c"lru", c"clock", c"tinylfu", c"chain", c"fifo"];
            let policy = policies[small(u, 0, 5) as usize].as_ptr();
            let memory = match small(u, 0, 2) {
                0 => pick(u, &w.memories, |id| KvsMemory { id }),
                _ => KvsMemory { id: 0 },
            };
            let mut out = KvsStore { id: 0 };
            let capacity = small(u, 0, 12);
            // SAFETY: live locals and a static string.
            let done = ok(unsafe {
                match small(u, 0, 2) {
                    // With an event ring, its size and medium sometimes bad.
                    0 => {
                        let slots =
                            [0, 1, 2, 5, 64, KVS_EVENT_RING_MAX + 1][small(u, 0, 5) as usize];
                        let medium = small(u, 0, 4);
                        kvs_store_new_with_events(
                            layout, capacity, policy, memory, slots, medium, &mut out,
                        )
                    }
                    _ => kvs_store_new(layout, capacity, policy, memory, &mut out),
                }
            });
            if done {
                w.stores.push(out);
                if let Some(&shape) = w.layout_shape.get(&layout.id) {
                    w.store_shape.insert(out.id, shape);
                }
            }
            done
        }
        4 => {
            let store = pick(u, &w.stores, |id| KvsStore { id });
            let mut out = KvsRequest { id: 0 };
            // SAFETY: a live local.
            let done = ok(unsafe { kvs_request_begin(store, &mut out) });
            if done {
                w.requests.push(out);
                w.request_store.insert(out.id, store.id);
            }
            done
        }
        5 => plan(u, w),
        6 => {
            let req = pick(u, &w.requests, |id| KvsRequest { id });
            let n = small(u, 0, w.keys.len() as u32) as usize;
            let mut hits = 0usize;
            let keys = if small(u, 0, 7) == 0 {
                ptr::null()
            } else {
                w.keys.as_ptr()
            };
            // SAFETY: `keys` has at least `n` entries, or is null.
            let s = unsafe { kvs_lookup_prefix(req, keys, n, small(u, 0, 64) as usize, &mut hits) };
            if keys.is_null() && n > 0 {
                assert_eq!(s, KvsStatus::NullPointer);
            }
            if n == 0 && s == KvsStatus::Ok {
                assert_eq!(hits, 0);
            }
            ok(s)
        }
        7 => {
            let req = pick(u, &w.requests, |id| KvsRequest { id });
            let mut first = 0usize;
            // SAFETY: a live local.
            ok(unsafe {
                kvs_allocate(
                    req,
                    small(u, 0, 2),
                    small(u, 0, 1),
                    small(u, 0, 6),
                    &mut first,
                )
            })
        }
        8 => {
            let req = pick(u, &w.requests, |id| KvsRequest { id });
            let (slot, key, valid) = match w.shape(req) {
                // Mostly well-formed: a position of the lane's table with
                // the plan's key for that block, a full block.
                Some(shape) if small(u, 0, 3) > 0 && !w.keys.is_empty() => {
                    let pages = table_tokens(req, shape) / shape.block_tokens;
                    let slot = small(u, 0, pages.saturating_sub(1) as u32) as usize;
                    let key = w.keys[slot.min(w.keys.len() - 1)];
                    (slot, key, shape.block_tokens as u32)
                }
                _ => (
                    small(u, 0, 6) as usize,
                    pick(u, &w.keys, |id| KvsKey {
                        block_lo: id,
                        ..Default::default()
                    }),
                    small(u, 0, 5),
                ),
            };
            let mut page = 0u32;
            // SAFETY: live locals.
            ok(unsafe { kvs_publish(req, slot, &key, valid, &mut page) })
        }
        9 => {
            let req = pick(u, &w.requests, |id| KvsRequest { id });
            if small(u, 0, 1) == 0 {
                let mut released = usize::MAX;
                // SAFETY: a live local.
                let s = unsafe {
                    kvs_request_slide_window(
                        req,
                        small(u, 0, 9),
                        small(u, 0, 24) as usize,
                        &mut released,
                    )
                };
                return ok(s);
            }
            ok(kvs_request_truncate(
                req,
                small(u, 0, 2),
                small(u, 0, 1),
                small(u, 0, 6) as usize,
            ))
        }
        10 => {
            let req = pick(u, &w.requests, |id| KvsRequest { id });
            let cap = small(u, 0, 8) as usize;
            let mut pages = vec![0u32; cap];
            let mut len = 0usize;
            // SAFETY: `pages` has `cap` entries.
            ok(unsafe { kvs_block_table(req, 0, 0, pages.as_mut_ptr(), cap, &mut len) })
        }
        11 => {
            let mut out = KvsEngine { id: 0 };
            // SAFETY: a live local.
            let done = ok(unsafe { kvs_engine_new(small(u, 0, 2), &mut out) });
            if done {
                w.engines.push(out);
            }
            done
        }
        12 => write(u, w),
        13 => attend(u, w),
        14 => destroy(u, w),
        _ => {
            let store = pick(u, &w.stores, |id| KvsStore { id });
            match small(u, 0, 3) {
                0 => events(u, w, store),
                _ => {
                    let mut stats = KvsStats::default();
                    // SAFETY: a live local.
                    let done = ok(unsafe { kvs_store_stats(store, &mut stats) });
                    if done {
                        assert!(stats.free_pages <= stats.capacity);
                    }
                    done
                }
            }
        }
    }
}

/// Drains, snapshots or counts `store`'s events: drained events are
/// well formed and numbered on from the last drain of the store.
fn events(u: &mut Unstructured<'_>, w: &mut World, store: KvsStore) -> bool {
    let cap = small(u, 0, 6) as usize;
    let mut buf = vec![KvsEvent::default(); cap];
    // A null buffer, sometimes with room claimed.
    let at = if small(u, 0, 7) == 0 {
        ptr::null_mut()
    } else {
        buf.as_mut_ptr()
    };
    let mut n = usize::MAX;
    match small(u, 0, 2) {
        0 => {
            // SAFETY: `at` is null or has `cap` entries; `n` a live local.
            let done = ok(unsafe { kvs_events_drain(store, at, cap, &mut n) });
            if done {
                assert!(n <= cap);
                let next = w.event_numbers.entry(store.id).or_insert(0);
                for e in &buf[..n] {
                    assert!(matches!(
                        e.kind,
                        KVS_EVENT_STORED | KVS_EVENT_REMOVED | KVS_EVENT_CLEARED
                    ));
                    assert_eq!(e.number, *next, "event numbers rise by one");
                    *next += 1;
                }
            } else {
                assert_eq!(n, usize::MAX, "a refused drain wrote its count");
            }
            done
        }
        1 => {
            // SAFETY: as above.
            let s = unsafe { kvs_events_snapshot(store, at, cap, &mut n) };
            if s == KvsStatus::Ok {
                assert!(buf[..n].iter().all(|e| e.kind == KVS_EVENT_STORED));
            }
            ok(s)
        }
        _ => {
            let mut stats = KvsEventStats::default();
            // SAFETY: a live local.
            let done = ok(unsafe { kvs_events_stats(store, &mut stats) });
            if done {
                assert!(stats.dropped <= stats.emitted && stats.capacity.is_power_of_two());
            }
            done
        }
    }
}

fn plan(u: &mut Unstructured<'_>, w: &mut World) -> bool {
    let coord = pick(u, &w.coords, |id| KvsCoordinator { id });
    let tokens: Vec<u32> = (0..small(u, 0, 24)).map(|_| small(u, 0, 3)).collect();
    let salt = [small(u, 0, 1) as u8];
    let request = KvsPlanRequest {
        tokens: tokens.as_ptr(),
        n_tokens: tokens.len(),
        salt: salt.as_ptr(),
        salt_len: small(u, 0, 1) as usize,
        range_start: small(u, 0, 8) as usize,
        range_end: small(u, 0, 26) as usize,
        // Mostly lane (0, 0), the lane the other operations use.
        layer_group: small(u, 0, 7).saturating_sub(5),
        head_shard: small(u, 0, 7).saturating_sub(6),
    };
    let cap = small(u, 0, 12) as usize;
    let mut keys = vec![KvsKey::default(); cap];
    let mut info = KvsPlanInfo::default();
    // SAFETY: every pointer names a live local of the stated length.
    let s = unsafe { kvs_plan(coord, &request, keys.as_mut_ptr(), cap, &mut info) };
    let done = ok(s);
    if done {
        assert!(info.blocks <= cap && info.full_blocks <= info.blocks);
        w.keys = keys[..info.blocks].to_vec();
    } else if s == KvsStatus::BufferTooSmall {
        assert!(info.blocks > cap);
    }
    done
}

fn write(u: &mut Unstructured<'_>, w: &mut World) -> bool {
    let engine = pick(u, &w.engines, |id| KvsEngine { id });
    let req = pick(u, &w.requests, |id| KvsRequest { id });
    let value = [0.5f32, -1.0, f32::NAN, 1e30][small(u, 0, 3) as usize];
    let (start, len) = match w.shape(req) {
        // Mostly well-formed: whole rows inside the block table.
        Some(shape) if small(u, 0, 3) > 0 => {
            let tokens = table_tokens(req, shape);
            let start = small(u, 0, tokens as u32) as usize;
            let n = small(u, 0, (tokens - start) as u32) as usize;
            (start, n * shape.info.kv_row as usize)
        }
        _ => (small(u, 0, 12) as usize, small(u, 0, 64) as usize),
    };
    let kv = vec![value; len];
    let k_len = len.saturating_sub(small(u, 0, 2).saturating_sub(1) as usize);
    let write = KvsWrite {
        layer: small(u, 0, 1),
        shard: 0,
        start,
        k: kv.as_ptr(),
        k_len,
        v: if small(u, 0, 9) == 0 {
            ptr::null()
        } else {
            kv.as_ptr()
        },
        v_len: len,
    };
    // SAFETY: `k` and `v` name `len` floats (or `v` is null).
    let s = unsafe { kvs_write_kv(engine, req, &write) };
    if write.v.is_null() && len > 0 {
        assert_eq!(s, KvsStatus::NullPointer);
    }
    ok(s)
}

fn attend(u: &mut Unstructured<'_>, w: &mut World) -> bool {
    let engine = pick(u, &w.engines, |id| KvsEngine { id });
    let mut q_rows = 0usize;
    let mut q_row = small(u, 1, 8) as usize;
    let n_seqs = if small(u, 0, 3) > 0 {
        1
    } else {
        small(u, 0, 3)
    };
    let seqs: Vec<KvsSeq> = (0..n_seqs)
        .map(|_| {
            let request = pick(u, &w.requests, |id| KvsRequest { id });
            let (kv_len, q_len) = match w.shape(request) {
                // Mostly well-formed: a context the table covers.
                Some(shape) if small(u, 0, 3) > 0 => {
                    q_row = shape.info.q_row as usize;
                    let tokens = table_tokens(request, shape).max(1) as u32;
                    let kv_len = small(u, 1, tokens);
                    (kv_len as usize, small(u, 1, kv_len.min(3)) as usize)
                }
                _ => (small(u, 0, 16) as usize, small(u, 0, 3) as usize),
            };
            q_rows += q_len;
            KvsSeq {
                request,
                kv_len,
                q_len,
            }
        })
        .collect();
    let exact = q_rows * q_row;
    let q_len = if small(u, 0, 5) > 0 {
        exact
    } else {
        small(u, 0, 96) as usize
    };
    let q = vec![0.25f32; q_len];
    let mut out = vec![
        0f32;
        if small(u, 0, 5) > 0 {
            exact
        } else {
            small(u, 0, 96) as usize
        }
    ];
    let attend = KvsAttend {
        layer: small(u, 0, 1),
        shard: 0,
        scale: [0.5, 0.5, 0.5, 0.0, f32::INFINITY][small(u, 0, 4) as usize],
        seqs: seqs.as_ptr(),
        n_seqs: seqs.len(),
        q: q.as_ptr(),
        q_len: q.len(),
        out: out.as_mut_ptr(),
        out_len: out.len(),
        window: small(u, 0, 40),
    };
    // SAFETY: every pointer names a live local of the stated length.
    let done = ok(unsafe { kvs_attend(engine, &attend) });
    if done {
        assert!(
            out.iter().all(|x| x.is_finite()),
            "non-finite attention output"
        );
    }
    done
}

fn destroy(u: &mut Unstructured<'_>, w: &mut World) -> bool {
    // Handles stay in the lists after destroy, so later calls (and second
    // destroys) use them: each must be refused as invalid.
    let (id, status) = match small(u, 0, 5) {
        0 => {
            let h = pick(u, &w.layouts, |id| KvsLayout { id });
            (h.id, kvs_layout_destroy(h))
        }
        1 => {
            let h = pick(u, &w.coords, |id| KvsCoordinator { id });
            (h.id, kvs_coordinator_destroy(h))
        }
        2 => {
            let h = pick(u, &w.memories, |id| KvsMemory { id });
            (h.id, kvs_memory_destroy(h))
        }
        3 => {
            let h = pick(u, &w.stores, |id| KvsStore { id });
            (h.id, kvs_store_destroy(h))
        }
        4 => {
            let h = pick(u, &w.requests, |id| KvsRequest { id });
            (h.id, kvs_request_end(h))
        }
        _ => {
            let h = pick(u, &w.engines, |id| KvsEngine { id });
            (h.id, kvs_engine_destroy(h))
        }
    };
    // A handle destroyed before names nothing now, whatever it was.
    if w.destroyed.contains(&id) {
        assert_eq!(
            status,
            KvsStatus::InvalidHandle,
            "a destroyed handle was taken"
        );
    }
    let done = ok(status);
    if done {
        w.destroyed.insert(id);
    }
    done
}

/// Ends every request, checks that each live store has no page that is
/// neither free nor cached, then destroys everything; caller memory must
/// then be released.
fn finish(w: &World) {
    for &r in &w.requests {
        let s = kvs_request_end(r);
        assert!(
            matches!(s, KvsStatus::Ok | KvsStatus::InvalidHandle),
            "{s:?}"
        );
    }
    for &store in &w.stores {
        let mut stats = KvsStats::default();
        // SAFETY: a live local.
        if unsafe { kvs_store_stats(store, &mut stats) } == KvsStatus::Ok {
            let cached = stats.inserts - stats.evictions;
            assert_eq!(
                u64::from(stats.free_pages) + cached,
                u64::from(stats.capacity),
                "pages neither free nor cached after every request ended: {stats:?}"
            );
        }
        kvs_store_destroy(store);
    }
    for &m in &w.memories {
        let s = kvs_memory_destroy(m);
        assert!(
            matches!(s, KvsStatus::Ok | KvsStatus::InvalidHandle),
            "memory still claimed after its stores were destroyed: {s:?} {}",
            last_error()
        );
    }
    for &l in &w.layouts {
        kvs_layout_destroy(l);
    }
    for &c in &w.coords {
        kvs_coordinator_destroy(c);
    }
    for &e in &w.engines {
        kvs_engine_destroy(e);
    }
}
