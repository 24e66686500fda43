//! Every entry point refuses bad input with a status and a message, and a
//! refused call changes nothing in the store.

use std::ptr;

mod common;

use common::{last_error, whole_plan};
use kvslice_capi::*;

struct Fixture {
    layout: KvsLayout,
    coord: KvsCoordinator,
    store: KvsStore,
    engine: KvsEngine,
    req: KvsRequest,
    keys: Vec<KvsKey>,
}

/// A store with one request holding two published blocks and one fill.
fn fixture() -> Fixture {
    let spec = KvsLayoutSpec {
        num_layers: 2,
        num_q_heads: 2,
        num_kv_heads: 1,
        head_dim: 4,
        block_tokens: 2,
        dtype: KVS_DTYPE_F16,
        layers_per_group: 1,
        ..Default::default()
    };
    let (mut layout, mut coord, mut store, mut engine, mut req) = (
        KvsLayout { id: 0 },
        KvsCoordinator { id: 0 },
        KvsStore { id: 0 },
        KvsEngine { id: 0 },
        KvsRequest { id: 0 },
    );
    let tokens = [1u32, 2, 3, 4, 5];
    let mut keys = vec![KvsKey::default(); 3];
    // SAFETY: every pointer is to a live local of the stated size.
    unsafe {
        assert_eq!(kvs_layout_new(&spec, &mut layout), KvsStatus::Ok);
        assert_eq!(
            kvs_coordinator_new(layout, &[3; 16], &mut coord),
            KvsStatus::Ok
        );
        assert_eq!(
            kvs_store_new(layout, 8, ptr::null(), KvsMemory { id: 0 }, &mut store),
            KvsStatus::Ok
        );
        assert_eq!(kvs_engine_new(1, &mut engine), KvsStatus::Ok);
        assert_eq!(kvs_request_begin(store, &mut req), KvsStatus::Ok);
        let plan = whole_plan(&tokens);
        let mut info = KvsPlanInfo::default();
        assert_eq!(
            kvs_plan(coord, &plan, keys.as_mut_ptr(), 3, &mut info),
            KvsStatus::Ok
        );
        assert_eq!((info.blocks, info.full_blocks), (3, 2));
        let mut first = 0;
        assert_eq!(kvs_allocate(req, 0, 0, 3, &mut first), KvsStatus::Ok);
        let kv = [0.25f32; 5 * 4];
        let w = KvsWrite {
            layer: 0,
            shard: 0,
            start: 0,
            k: kv.as_ptr(),
            k_len: 20,
            v: kv.as_ptr(),
            v_len: 20,
        };
        assert_eq!(kvs_write_kv(engine, req, &w), KvsStatus::Ok);
        let mut page = 0;
        for (slot, key) in keys.iter().enumerate().take(2) {
            assert_eq!(kvs_publish(req, slot, key, 2, &mut page), KvsStatus::Ok);
        }
    }
    Fixture {
        layout,
        coord,
        store,
        engine,
        req,
        keys,
    }
}

/// Decode of one query row of 8 for `seq` on layer 0, shard 0; the
/// pointers are to the caller's locals, which must outlive the call.
fn one_row(seq: &KvsSeq, q: &[f32; 8], out: &mut [f32; 8]) -> KvsAttend {
    KvsAttend {
        layer: 0,
        shard: 0,
        scale: 0.5,
        seqs: seq,
        n_seqs: 1,
        q: q.as_ptr(),
        q_len: 8,
        out: out.as_mut_ptr(),
        out_len: 8,
        window: 0,
    }
}

fn snapshot(f: &Fixture) -> (KvsStats, Vec<u32>) {
    let mut stats = KvsStats::default();
    let mut table = [0u32; 8];
    let mut len = 0;
    // SAFETY: live locals.
    unsafe {
        assert_eq!(kvs_store_stats(f.store, &mut stats), KvsStatus::Ok);
        assert_eq!(
            kvs_block_table(f.req, 0, 0, table.as_mut_ptr(), 8, &mut len),
            KvsStatus::Ok
        );
    }
    (stats, table[..len].to_vec())
}

#[test]
fn refused_calls_say_why_and_change_nothing() {
    let f = fixture();
    let before = snapshot(&f);
    let kv = [0.5f32; 64];
    let mut out = [0f32; 64];
    let mut n = 0usize;
    let mut page = 0u32;
    let seq = KvsSeq {
        request: f.req,
        kv_len: 5,
        q_len: 1,
    };
    let good_attend = KvsAttend {
        layer: 0,
        shard: 0,
        scale: 0.5,
        seqs: &seq,
        n_seqs: 1,
        q: kv.as_ptr(),
        q_len: 8,
        out: out.as_mut_ptr(),
        out_len: 8,
        window: 0,
    };
    let misaligned = kv.as_ptr().cast::<u8>().wrapping_add(1).cast::<f32>();
    let dead = KvsRequest {
        id: f.req.id ^ (1 << 40),
    };
    // SAFETY: every non-null pointer is to a live local of the stated
    // length; the misaligned one is refused before it is read.
    let cases: Vec<(&str, KvsStatus, KvsStatus)> = unsafe {
        vec![
            (
                "lookup, null keys",
                kvs_lookup_prefix(f.req, ptr::null(), 2, 4, &mut n),
                KvsStatus::NullPointer,
            ),
            (
                "lookup, null out",
                kvs_lookup_prefix(f.req, f.keys.as_ptr(), 2, 4, ptr::null_mut()),
                KvsStatus::NullPointer,
            ),
            (
                "lookup, huge length",
                kvs_lookup_prefix(f.req, f.keys.as_ptr(), usize::MAX / 8, 4, &mut n),
                KvsStatus::InvalidLength,
            ),
            (
                "lookup, foreign handle",
                kvs_lookup_prefix(dead, f.keys.as_ptr(), 2, 4, &mut n),
                KvsStatus::InvalidHandle,
            ),
            (
                "lookup, a store as a request",
                kvs_lookup_prefix(KvsRequest { id: f.store.id }, f.keys.as_ptr(), 2, 4, &mut n),
                KvsStatus::InvalidHandle,
            ),
            (
                "allocate, bad lane",
                kvs_allocate(f.req, 5, 0, 1, &mut n),
                KvsStatus::InvalidArgument,
            ),
            (
                "allocate, too many",
                kvs_allocate(f.req, 0, 0, 9, &mut n),
                KvsStatus::CapacityExhausted,
            ),
            (
                "allocate, more than memory holds",
                kvs_allocate(f.req, 0, 0, u32::MAX, &mut n),
                KvsStatus::CapacityExhausted,
            ),
            (
                "publish, a cached slot",
                kvs_publish(f.req, 0, &f.keys[0], 2, &mut page),
                KvsStatus::InvalidArgument,
            ),
            (
                "publish, zero valid tokens",
                kvs_publish(f.req, 2, &f.keys[2], 0, &mut page),
                KvsStatus::InvalidArgument,
            ),
            (
                "publish, past the table",
                kvs_publish(f.req, 7, &f.keys[2], 1, &mut page),
                KvsStatus::InvalidArgument,
            ),
            (
                "block table, too small",
                kvs_block_table(f.req, 0, 0, [0u32; 1].as_mut_ptr(), 1, &mut n),
                KvsStatus::BufferTooSmall,
            ),
            (
                "write, short v",
                kvs_write_kv(
                    f.engine,
                    f.req,
                    &KvsWrite {
                        layer: 0,
                        shard: 0,
                        start: 4,
                        k: kv.as_ptr(),
                        k_len: 4,
                        v: kv.as_ptr(),
                        v_len: 3,
                    },
                ),
                KvsStatus::InvalidLength,
            ),
            (
                "write, misaligned k",
                kvs_write_kv(
                    f.engine,
                    f.req,
                    &KvsWrite {
                        layer: 0,
                        shard: 0,
                        start: 4,
                        k: misaligned,
                        k_len: 4,
                        v: kv.as_ptr(),
                        v_len: 4,
                    },
                ),
                KvsStatus::Misaligned,
            ),
            (
                "write, into a cached page",
                kvs_write_kv(
                    f.engine,
                    f.req,
                    &KvsWrite {
                        layer: 0,
                        shard: 0,
                        start: 0,
                        k: kv.as_ptr(),
                        k_len: 4,
                        v: kv.as_ptr(),
                        v_len: 4,
                    },
                ),
                KvsStatus::InvalidArgument,
            ),
            (
                "write, NaN",
                kvs_write_kv(
                    f.engine,
                    f.req,
                    &KvsWrite {
                        layer: 0,
                        shard: 0,
                        start: 4,
                        k: [f32::NAN; 4].as_ptr(),
                        k_len: 4,
                        v: kv.as_ptr(),
                        v_len: 4,
                    },
                ),
                KvsStatus::InvalidArgument,
            ),
            (
                "write, layer out of range",
                kvs_write_kv(
                    f.engine,
                    f.req,
                    &KvsWrite {
                        layer: 9,
                        shard: 0,
                        start: 4,
                        k: kv.as_ptr(),
                        k_len: 4,
                        v: kv.as_ptr(),
                        v_len: 4,
                    },
                ),
                KvsStatus::InvalidArgument,
            ),
            (
                "attend, short out",
                kvs_attend(
                    f.engine,
                    &KvsAttend {
                        out_len: 7,
                        ..good_attend
                    },
                ),
                KvsStatus::InvalidLength,
            ),
            (
                "attend, context past the table",
                kvs_attend(
                    f.engine,
                    &KvsAttend {
                        seqs: &KvsSeq { kv_len: 9, ..seq },
                        ..good_attend
                    },
                ),
                KvsStatus::InvalidArgument,
            ),
            (
                "attend, request twice",
                kvs_attend(
                    f.engine,
                    &KvsAttend {
                        seqs: [seq, seq].as_ptr(),
                        n_seqs: 2,
                        q_len: 16,
                        out_len: 16,
                        ..good_attend
                    },
                ),
                KvsStatus::InvalidArgument,
            ),
            (
                "attend, null batch",
                kvs_attend(f.engine, ptr::null()),
                KvsStatus::NullPointer,
            ),
            (
                "attend, an engine handle that is a layout",
                kvs_attend(KvsEngine { id: f.layout.id }, &good_attend),
                KvsStatus::InvalidHandle,
            ),
            (
                "plan, null request",
                kvs_plan(
                    f.coord,
                    ptr::null(),
                    ptr::null_mut(),
                    0,
                    &mut KvsPlanInfo::default(),
                ),
                KvsStatus::NullPointer,
            ),
            (
                "store, unknown policy",
                kvs_store_new(
                    f.layout,
                    4,
                    c"fifo".as_ptr(),
                    KvsMemory { id: 0 },
                    &mut KvsStore { id: 0 },
                ),
                KvsStatus::InvalidArgument,
            ),
            (
                "layout, 3 q heads over 2 kv heads",
                kvs_layout_new(
                    &KvsLayoutSpec {
                        num_layers: 1,
                        num_q_heads: 3,
                        num_kv_heads: 2,
                        head_dim: 4,
                        block_tokens: 2,
                        ..Default::default()
                    },
                    &mut KvsLayout { id: 0 },
                ),
                KvsStatus::InvalidArgument,
            ),
            (
                "layout, unknown dtype",
                kvs_layout_new(
                    &KvsLayoutSpec {
                        num_layers: 1,
                        num_q_heads: 2,
                        num_kv_heads: 2,
                        head_dim: 4,
                        block_tokens: 2,
                        dtype: 9,
                        ..Default::default()
                    },
                    &mut KvsLayout { id: 0 },
                ),
                KvsStatus::InvalidArgument,
            ),
            (
                "memory, null",
                kvs_memory_wrap(ptr::null_mut(), 64, &mut KvsMemory { id: 0 }),
                KvsStatus::NullPointer,
            ),
            (
                "memory, too small for a page",
                {
                    let mut bytes = [0u64; 4];
                    let mut m = KvsMemory { id: 0 };
                    assert_eq!(
                        kvs_memory_wrap(bytes.as_mut_ptr().cast(), 32, &mut m),
                        KvsStatus::Ok
                    );
                    let s = kvs_store_new(f.layout, 0, ptr::null(), m, &mut KvsStore { id: 0 });
                    assert_eq!(kvs_memory_destroy(m), KvsStatus::Ok);
                    s
                },
                KvsStatus::InvalidLength,
            ),
        ]
    };
    for (what, got, want) in cases {
        assert_eq!(got, want, "{what}: {}", last_error());
        assert!(!last_error().is_empty(), "{what}: no message");
        assert_eq!(
            snapshot(&f),
            before,
            "{what} changed the store or the request"
        );
    }
    // The attention that was refused above works with good arguments.
    // SAFETY: live locals.
    assert_eq!(unsafe { kvs_attend(f.engine, &good_attend) }, KvsStatus::Ok);
    assert!(
        out[..8].iter().all(|x| (x - 0.25).abs() < 1e-3),
        "{:?}",
        &out[..8]
    );
}

#[test]
fn destroyed_handles_are_refused_and_pages_come_back() {
    let f = fixture();
    assert_eq!(kvs_request_end(f.req), KvsStatus::Ok);
    assert_eq!(kvs_request_end(f.req), KvsStatus::InvalidHandle);
    assert_eq!(
        kvs_request_truncate(f.req, 0, 0, 0),
        KvsStatus::InvalidHandle
    );
    let mut stats = KvsStats::default();
    // SAFETY: a live local.
    let status = unsafe { kvs_store_stats(f.store, &mut stats) };
    assert_eq!(status, KvsStatus::Ok);
    // Two published pages stay cached; the unpublished tail was freed.
    assert_eq!((stats.inserts, stats.free_pages), (2, 6));
    for status in [
        kvs_store_destroy(f.store),
        kvs_engine_destroy(f.engine),
        kvs_coordinator_destroy(f.coord),
        kvs_layout_destroy(f.layout),
    ] {
        assert_eq!(status, KvsStatus::Ok);
    }
    for status in [
        kvs_store_destroy(f.store),
        kvs_engine_destroy(f.engine),
        kvs_coordinator_destroy(f.coord),
        kvs_layout_destroy(f.layout),
        kvs_layout_destroy(KvsLayout { id: 0 }),
        kvs_store_destroy(KvsStore { id: u64::MAX }),
    ] {
        assert_eq!(status, KvsStatus::InvalidHandle, "{}", last_error());
    }
}

#[test]
fn a_store_outlives_its_handle_while_requests_use_it() {
    let f = fixture();
    assert_eq!(kvs_store_destroy(f.store), KvsStatus::Ok);
    // The request still reads its pages: the store lives until it ends.
    let q = [0.5f32; 8];
    let mut out = [0f32; 8];
    let seq = KvsSeq {
        request: f.req,
        kv_len: 4,
        q_len: 1,
    };
    let attend = one_row(&seq, &q, &mut out);
    // SAFETY: live locals.
    assert_eq!(unsafe { kvs_attend(f.engine, &attend) }, KvsStatus::Ok);
    assert_eq!(kvs_request_end(f.req), KvsStatus::Ok);
}

#[test]
fn a_request_used_by_two_threads_at_once_is_busy_not_racy() {
    let f = fixture();
    let q = [0.5f32; 8];
    let seq = KvsSeq {
        request: f.req,
        kv_len: 5,
        q_len: 1,
    };
    let (mut ok, mut busy) = (0, 0);
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    (0..2000)
                        .map(|_| {
                            let mut out = [f32::NAN; 8];
                            let attend = one_row(&seq, &q, &mut out);
                            // SAFETY: live locals.
                            let status = unsafe { kvs_attend(f.engine, &attend) };
                            if status == KvsStatus::Ok {
                                // Every value row is 0.25: so is their mean.
                                assert!(out.iter().all(|x| (x - 0.25).abs() < 1e-3), "{out:?}");
                            }
                            status
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for r in runs {
            for status in r.join().unwrap() {
                match status {
                    KvsStatus::Ok => ok += 1,
                    KvsStatus::Busy => busy += 1,
                    other => panic!("{other:?}: {}", last_error()),
                }
            }
        }
    });
    // Every call either ran or was told the request is busy; the pages are
    // all still there afterwards.
    assert_eq!(ok + busy, 4000);
    assert!(ok > 0);
    assert_eq!(snapshot(&f).1.len(), 3);
}

/// The 8-bit dtypes are layouts like any other: their pages hold the codes
/// and a 4-byte scale per row, as core's layout says.
#[test]
fn eight_bit_layouts_size_their_pages_as_core_does() {
    for (dtype, core_dtype) in [
        (KVS_DTYPE_I8, kvslice_core::KvDtype::I8),
        (KVS_DTYPE_F8E4M3, kvslice_core::KvDtype::F8E4M3),
    ] {
        let spec = KvsLayoutSpec {
            num_layers: 2,
            num_q_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            block_tokens: 4,
            dtype,
            layers_per_group: 1,
            ..Default::default()
        };
        let mut layout = KvsLayout { id: 0 };
        let mut info = KvsLayoutInfo::default();
        // SAFETY: live locals of the stated types.
        unsafe {
            assert_eq!(kvs_layout_new(&spec, &mut layout), KvsStatus::Ok);
            assert_eq!(kvs_layout_info(layout, &mut info), KvsStatus::Ok);
        }
        let core = kvslice_core::KvLayout::new(
            kvslice_core::LayoutSpec::new(2, 4, 2, 16, 4, core_dtype)
                .with_grouping(kvslice_core::LayerGrouping::PerLayer),
        )
        .unwrap();
        // K and V of 2 heads × 4 tokens: 16 codes and a 4-byte scale each.
        assert_eq!(info.page_bytes, 2 * 2 * 4 * (16 + 4));
        assert_eq!(info.page_bytes, core.page_bytes());
    }
}

/// A handle's slot is reused by later objects of the same thread; the
/// stale handle must stay refused long after the slab's default 8,192
/// generations would have come round to it again.
#[test]
fn a_stale_handle_stays_refused_after_its_slot_is_reused() {
    let f = fixture();
    let (mut old, mut r) = (KvsRequest { id: 0 }, KvsRequest { id: 0 });
    // SAFETY: a live local.
    let status = unsafe { kvs_request_begin(f.store, &mut old) };
    assert_eq!(status, KvsStatus::Ok);
    assert_eq!(kvs_request_end(old), KvsStatus::Ok);
    let mut reused = 0;
    for _ in 0..20_000 {
        // SAFETY: a live local.
        let status = unsafe { kvs_request_begin(f.store, &mut r) };
        assert_eq!(status, KvsStatus::Ok);
        reused += usize::from(r.id & 0xFFFF_FFFF == old.id & 0xFFFF_FFFF);
        assert_ne!(r.id, old.id, "a stale handle named a live request");
        assert_eq!(kvs_request_truncate(old, 0, 0, 0), KvsStatus::InvalidHandle);
        assert_eq!(kvs_request_end(r), KvsStatus::Ok);
    }
    assert!(reused > 10_000, "the slot was reused {reused} times");
    assert_eq!(kvs_request_end(old), KvsStatus::InvalidHandle);
}

/// A prompt shorter than one block plans no full block: its lookup of no
/// keys (null allowed) is 0 hits, counted as a lookup that missed its
/// tokens, and changes the request's block tables not at all.
#[test]
fn a_lookup_of_no_keys_finds_nothing() {
    let f = fixture();
    let mut req = KvsRequest { id: 0 };
    let tokens = [9u32];
    let plan = whole_plan(&tokens);
    let mut keys = [KvsKey::default(); 1];
    let mut info = KvsPlanInfo::default();
    let (mut before, mut after) = (KvsStats::default(), KvsStats::default());
    let mut hits = 7usize;
    let mut table = [0u32; 4];
    let mut len = 0usize;
    // SAFETY: every pointer is to a live local of the stated size.
    unsafe {
        assert_eq!(kvs_request_begin(f.store, &mut req), KvsStatus::Ok);
        assert_eq!(
            kvs_plan(f.coord, &plan, keys.as_mut_ptr(), 1, &mut info),
            KvsStatus::Ok
        );
        assert_eq!((info.blocks, info.full_blocks), (1, 0));
        assert_eq!(kvs_store_stats(f.store, &mut before), KvsStatus::Ok);
        for keys in [ptr::null(), keys.as_ptr()] {
            hits = 7;
            assert_eq!(
                kvs_lookup_prefix(req, keys, info.full_blocks, 1, &mut hits),
                KvsStatus::Ok,
                "{}",
                last_error()
            );
            assert_eq!(hits, 0);
        }
        assert_eq!(kvs_store_stats(f.store, &mut after), KvsStatus::Ok);
        assert_eq!(
            kvs_block_table(req, 0, 0, table.as_mut_ptr(), table.len(), &mut len),
            KvsStatus::Ok
        );
    }
    assert_eq!(hits, 0);
    assert_eq!(after.lookups, before.lookups + 2);
    assert_eq!(after.miss_tokens, before.miss_tokens + 2);
    assert_eq!(after.hit_blocks, before.hit_blocks);
    assert_eq!(len, 0, "no page appended");
}

/// `kvs_memory_wrap` zeroes the caller's bytes when it takes them (C's
/// `malloc` leaves them uninitialised, which no Rust slice may cover).
#[test]
fn wrapped_memory_is_zeroed() {
    let mut bytes = vec![0xabu8; 4096];
    let mut m = KvsMemory { id: 0 };
    // SAFETY: `bytes` outlives the handle, destroyed before it is read.
    unsafe {
        assert_eq!(
            kvs_memory_wrap(bytes.as_mut_ptr().cast(), bytes.len(), &mut m),
            KvsStatus::Ok
        );
    }
    assert_eq!(kvs_memory_destroy(m), KvsStatus::Ok);
    assert!(bytes.iter().all(|&b| b == 0));
}

/// Three kv heads over two shards: shard 0 has two, shard 1 one, and
/// `kvs_layout_shard_info` gives each shard's rows, which is what
/// `kvs_write_kv` takes for it (two tokens of shard 0's rows read as four
/// of shard 1's, past its page).
#[test]
fn uneven_shards_report_their_own_rows() {
    let spec = KvsLayoutSpec {
        num_layers: 1,
        num_q_heads: 6,
        num_kv_heads: 3,
        head_dim: 4,
        block_tokens: 2,
        dtype: KVS_DTYPE_F32,
        layers_per_group: 1,
        head_shards: 2,
        ..Default::default()
    };
    let (mut layout, mut store, mut engine, mut req) = (
        KvsLayout { id: 0 },
        KvsStore { id: 0 },
        KvsEngine { id: 0 },
        KvsRequest { id: 0 },
    );
    let (mut info, mut s0, mut s1) = (
        KvsLayoutInfo::default(),
        KvsShardInfo::default(),
        KvsShardInfo::default(),
    );
    // SAFETY: every pointer is to a live local of the stated size.
    unsafe {
        assert_eq!(kvs_layout_new(&spec, &mut layout), KvsStatus::Ok);
        assert_eq!(kvs_layout_info(layout, &mut info), KvsStatus::Ok);
        assert_eq!(kvs_layout_shard_info(layout, 0, &mut s0), KvsStatus::Ok);
        assert_eq!(kvs_layout_shard_info(layout, 1, &mut s1), KvsStatus::Ok);
        let mut s2 = KvsShardInfo::default();
        assert_eq!(
            kvs_layout_shard_info(layout, 2, &mut s2),
            KvsStatus::InvalidArgument
        );
        assert_eq!(s2, KvsShardInfo::default(), "nothing written");
        assert_eq!(
            kvs_layout_shard_info(layout, 0, ptr::null_mut()),
            KvsStatus::NullPointer
        );
    }
    assert_eq!((info.kv_row, info.q_row), (8, 16));
    let want0 = KvsShardInfo {
        first_kv_head: 0,
        kv_heads: 2,
        first_q_head: 0,
        q_heads: 4,
        kv_row: 8,
        q_row: 16,
    };
    let want1 = KvsShardInfo {
        first_kv_head: 2,
        kv_heads: 1,
        first_q_head: 4,
        q_heads: 2,
        kv_row: 4,
        q_row: 8,
    };
    assert_eq!((s0, s1), (want0, want1));
    // SAFETY: every pointer is to a live local of the stated size.
    unsafe {
        assert_eq!(
            kvs_store_new(layout, 4, ptr::null(), KvsMemory { id: 0 }, &mut store),
            KvsStatus::Ok
        );
        assert_eq!(kvs_engine_new(1, &mut engine), KvsStatus::Ok);
        assert_eq!(kvs_request_begin(store, &mut req), KvsStatus::Ok);
        let mut first = 0;
        assert_eq!(kvs_allocate(req, 0, 1, 1, &mut first), KvsStatus::Ok);
        let rows = |row: u32| vec![0.5f32; 2 * row as usize];
        // Two tokens, the page's room: shard 0's rows would be four.
        for (row, fits) in [(s0.kv_row, false), (s1.kv_row, true)] {
            let (k, v) = (rows(row), rows(row));
            let w = KvsWrite {
                layer: 0,
                shard: 1,
                start: 0,
                k: k.as_ptr(),
                k_len: k.len(),
                v: v.as_ptr(),
                v_len: v.len(),
            };
            let status = kvs_write_kv(engine, req, &w);
            assert_eq!(
                status == KvsStatus::Ok,
                fits,
                "{status:?}: {}",
                last_error()
            );
        }
        assert_eq!(kvs_request_end(req), KvsStatus::Ok);
        assert_eq!(kvs_engine_destroy(engine), KvsStatus::Ok);
        assert_eq!(kvs_store_destroy(store), KvsStatus::Ok);
        assert_eq!(kvs_layout_destroy(layout), KvsStatus::Ok);
    }
}
