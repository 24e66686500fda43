//! Sliding windows through the C ABI: `kvs_attend`'s window limits what it
//! reads, and `kvs_request_slide_window` gives up the pages no later token
//! attends to, attention under the same window still reads what it needs,
//! and a released page cannot be read or written through the request.

mod common;

use std::ptr;

use common::{last_error, plan_keys, tiny_layout};
use kvslice_capi::*;

struct Fixture {
    layout: KvsLayout,
    store: KvsStore,
    engine: KvsEngine,
    keys: Vec<KvsKey>,
}

/// The tiny layout, a store of 8 pages, an engine and the keys of a
/// 6-token sequence.
fn fixture() -> Fixture {
    let layout = tiny_layout();
    let (mut store, mut engine) = (KvsStore { id: 0 }, KvsEngine { id: 0 });
    // SAFETY: every pointer is to a live local of the stated size.
    unsafe {
        assert_eq!(
            kvs_store_new(layout, 8, ptr::null(), KvsMemory { id: 0 }, &mut store),
            KvsStatus::Ok
        );
        assert_eq!(kvs_engine_new(1, &mut engine), KvsStatus::Ok);
    }
    let keys = plan_keys(layout, 1, &[1, 2, 3, 4, 5, 6], 3);
    Fixture {
        layout,
        store,
        engine,
        keys,
    }
}

/// Token `t`'s value row is `t` everywhere; keys are zero, so attention
/// is the mean of the values in the window.
fn write(f: &Fixture, req: KvsRequest, start: u32, n: u32) -> KvsStatus {
    let v: Vec<f32> = (start..start + n).flat_map(|t| [t as f32; 4]).collect();
    let k = vec![0f32; v.len()];
    let w = KvsWrite {
        layer: 0,
        shard: 0,
        start: start as usize,
        k: k.as_ptr(),
        k_len: k.len(),
        v: v.as_ptr(),
        v_len: v.len(),
    };
    // SAFETY: `w` points to live buffers of the stated lengths.
    unsafe { kvs_write_kv(f.engine, req, &w) }
}

/// Decode attention of the query at position `kv_len - 1` under `window`.
fn attend(f: &Fixture, req: KvsRequest, kv_len: usize, window: u32) -> (KvsStatus, [f32; 8]) {
    let seq = KvsSeq {
        request: req,
        kv_len,
        q_len: 1,
    };
    let q = [0f32; 8];
    let mut out = [-7f32; 8];
    let a = KvsAttend {
        layer: 0,
        shard: 0,
        scale: 0.5,
        seqs: &seq,
        n_seqs: 1,
        q: q.as_ptr(),
        q_len: 8,
        out: out.as_mut_ptr(),
        out_len: 8,
        window,
    };
    // SAFETY: `a` points to live buffers of the stated lengths.
    let status = unsafe { kvs_attend(f.engine, &a) };
    (status, out)
}

/// A request on the fixture's store holding `n` fresh pages.
fn begin_with_pages(f: &Fixture, n: u32) -> KvsRequest {
    let mut req = KvsRequest { id: 0 };
    let mut first = 0;
    // SAFETY: live locals.
    unsafe {
        assert_eq!(kvs_request_begin(f.store, &mut req), KvsStatus::Ok);
        assert_eq!(kvs_allocate(req, 0, 0, n, &mut first), KvsStatus::Ok);
    }
    req
}

fn table(req: KvsRequest) -> Vec<u32> {
    let mut pages = [0u32; 8];
    let mut len = 0;
    // SAFETY: `pages` holds 8 ids.
    let s = unsafe { kvs_block_table(req, 0, 0, pages.as_mut_ptr(), 8, &mut len) };
    assert_eq!(s, KvsStatus::Ok);
    pages[..len].to_vec()
}

fn free_pages(store: KvsStore) -> u32 {
    let mut stats = KvsStats::default();
    // SAFETY: a live local.
    assert_eq!(unsafe { kvs_store_stats(store, &mut stats) }, KvsStatus::Ok);
    stats.free_pages
}

fn slide(req: KvsRequest, window: u32, kv_len: usize) -> (KvsStatus, usize) {
    let mut released = usize::MAX;
    // SAFETY: a live local.
    let s = unsafe { kvs_request_slide_window(req, window, kv_len, &mut released) };
    (s, released)
}

/// `window` reaches the engine: a query at position 4 with a window of 2
/// sees tokens 3 and 4 only (equal scores: the mean of their values).
#[test]
fn a_window_limits_what_attend_reads() {
    let f = fixture();
    let req = begin_with_pages(&f, 3);
    assert_eq!(write(&f, req, 0, 5), KvsStatus::Ok);
    for (window, want) in [(0, 2.0f32), (2, 3.5), (1, 4.0), (100, 2.0)] {
        let (s, out) = attend(&f, req, 5, window);
        assert_eq!(s, KvsStatus::Ok, "{}", last_error());
        assert!(
            out.iter().all(|x| (x - want).abs() < 1e-3),
            "window {window}: {out:?}"
        );
    }
    assert_eq!(kvs_request_end(req), KvsStatus::Ok);
}

#[test]
fn a_slid_window_releases_what_no_later_token_reads() {
    let f = fixture();
    let req = begin_with_pages(&f, 3);
    assert_eq!(write(&f, req, 0, 5), KvsStatus::Ok);
    // Block 0 published (cached for others), block 1 still being filled.
    let mut page = 0;
    // SAFETY: live locals.
    unsafe { assert_eq!(kvs_publish(req, 0, &f.keys[0], 2, &mut page), KvsStatus::Ok) };
    let before = table(req);
    assert_eq!(free_pages(f.store), 5);
    // The query at position 4 under a window of 2 reads tokens 3 and 4.
    let (s, out) = attend(&f, req, 5, 2);
    assert_eq!(s, KvsStatus::Ok, "{}", last_error());
    assert!(out.iter().all(|x| (x - 3.5).abs() < 1e-5), "{out:?}");
    // The next token, position 5, sees 4 and 5: blocks 0 and 1 go.
    assert_eq!(slide(req, 2, 5), (KvsStatus::Ok, 2));
    assert_eq!(
        table(req),
        [KVS_PAGE_RELEASED, KVS_PAGE_RELEASED, before[2]]
    );
    // The unpublished page is free again; the published one stays cached.
    assert_eq!(free_pages(f.store), 6);
    let mut hits = 0;
    let mut other = KvsRequest { id: 0 };
    // SAFETY: live locals.
    unsafe {
        assert_eq!(kvs_request_begin(f.store, &mut other), KvsStatus::Ok);
        assert_eq!(
            kvs_lookup_prefix(other, f.keys.as_ptr(), 1, 2, &mut hits),
            KvsStatus::Ok
        );
    }
    assert_eq!(hits, 1, "block 0 is still cached for other requests");
    assert_eq!(kvs_request_end(other), KvsStatus::Ok);
    // Sliding again releases nothing more.
    assert_eq!(slide(req, 2, 5), (KvsStatus::Ok, 0));
    // Token 5, then its attention: the mean of tokens 4 and 5.
    assert_eq!(write(&f, req, 5, 1), KvsStatus::Ok, "{}", last_error());
    let (s, out) = attend(&f, req, 6, 2);
    assert_eq!(s, KvsStatus::Ok, "{}", last_error());
    assert!(out.iter().all(|x| (x - 4.5).abs() < 1e-5), "{out:?}");
    // A wider window would read a released page: refused, `out` untouched.
    let (s, out) = attend(&f, req, 6, 3);
    assert_eq!(s, KvsStatus::InvalidArgument);
    assert!(last_error().contains("was released"), "{}", last_error());
    assert_eq!(out, [-7.0; 8]);
    let (s, _) = attend(&f, req, 6, 0);
    assert_eq!(s, KvsStatus::InvalidArgument, "no window reads every page");
    // Writing into a released block is refused, and says why.
    assert_eq!(write(&f, req, 1, 1), KvsStatus::InvalidArgument);
    assert!(last_error().contains("released"), "{}", last_error());
    // Block 2 publishes without its released parent.
    // SAFETY: live locals.
    unsafe {
        assert_eq!(
            kvs_publish(req, 2, &f.keys[2], 2, &mut page),
            KvsStatus::Ok,
            "{}",
            last_error()
        );
    }
    assert_eq!(kvs_request_end(req), KvsStatus::Ok);
    assert_eq!(free_pages(f.store), 6, "two cached pages, six free");
    assert_eq!(kvs_engine_destroy(f.engine), KvsStatus::Ok);
    assert_eq!(kvs_store_destroy(f.store), KvsStatus::Ok);
    assert_eq!(kvs_layout_destroy(f.layout), KvsStatus::Ok);
}

#[test]
fn bad_slides_are_refused_and_release_nothing() {
    let f = fixture();
    let req = begin_with_pages(&f, 3);
    let before = table(req);
    assert_eq!(slide(req, 0, 5), (KvsStatus::InvalidArgument, usize::MAX));
    assert!(last_error().contains("window"), "{}", last_error());
    // SAFETY: a null `released` is refused before anything is read.
    let s = unsafe { kvs_request_slide_window(req, 2, 5, ptr::null_mut()) };
    assert_eq!(s, KvsStatus::NullPointer);
    assert_eq!(
        slide(KvsRequest { id: 999 }, 2, 5).0,
        KvsStatus::InvalidHandle
    );
    assert_eq!(table(req), before, "nothing released");
    // A window longer than the sequence releases nothing.
    assert_eq!(slide(req, 100, 5), (KvsStatus::Ok, 0));
    assert_eq!(kvs_request_end(req), KvsStatus::Ok);
    assert_eq!(slide(req, 2, 5).0, KvsStatus::InvalidHandle);
    assert_eq!(kvs_engine_destroy(f.engine), KvsStatus::Ok);
    assert_eq!(kvs_store_destroy(f.store), KvsStatus::Ok);
    assert_eq!(kvs_layout_destroy(f.layout), KvsStatus::Ok);
}
