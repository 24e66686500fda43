//! The CPU engine: K/V writes and paged attention over requests' pages.

use std::collections::HashSet;
use std::sync::Arc;

use kvslice_core::{AttentionBatch, AttentionEngine, KvWrite, SeqAttention};
use kvslice_cpu::CpuEngine;

use crate::handles::{self, Entry, Object};
use crate::request::{self, Lanes};
use crate::status::{Failure, KvsStatus, Outcome, call};
use crate::{KvsAttend, KvsEngine, KvsRequest, KvsWrite, args};

fn engine_entry(e: KvsEngine) -> Outcome<Entry> {
    handles::entry(e.id, "engine", |o| matches!(o, Object::Engine(_)))
}

fn cpu(entry: &Entry) -> &CpuEngine {
    let Object::Engine(e) = &**entry else {
        unreachable!("checked by `engine_entry`")
    };
    e
}

/// Makes a CPU engine that splits a call over up to `threads` threads of
/// its shared worker pool (0: one per core).
/// It picks the widest SIMD kernels this CPU has.
///
/// # Safety
///
/// `out` points to writable memory for a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_engine_new(threads: u32, out: *mut KvsEngine) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        let mut e = CpuEngine::new();
        if threads > 0 {
            e = e.with_threads(threads as usize);
        }
        let id = handles::insert(Object::Engine(e))?;
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, KvsEngine { id }, "out") }
    })
}

/// Destroys an engine handle (calls in flight on other threads finish
/// first).
#[unsafe(no_mangle)]
pub extern "C" fn kvs_engine_destroy(engine: KvsEngine) -> KvsStatus {
    call(|| handles::remove(engine.id, "engine", |o| Ok(matches!(o, Object::Engine(_)))))
}

/// Writes new K/V tokens of one layer and shard into the request's pages
/// for that layer's group: positions `start..` of its block table, which
/// must be pages being filled (cached pages are immutable). Values are
/// converted to the layout's dtype; nothing is written on error.
///
/// # Safety
///
/// `write` points to a `KvsWrite` whose `k` and `v` point to `k_len` and
/// `v_len` floats. All are only read during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_write_kv(
    engine: KvsEngine,
    request: KvsRequest,
    write: *const KvsWrite,
) -> KvsStatus {
    call(|| {
        // SAFETY: the caller's promise on `write` and what it points to.
        let w = unsafe { args::read_in(write, "write") }?;
        // SAFETY: as above.
        let k = unsafe { args::slice_in(w.k, w.k_len, "write.k") }?;
        // SAFETY: as above.
        let v = unsafe { args::slice_in(w.v, w.v_len, "write.v") }?;
        let engine = engine_entry(engine)?;
        let entry = request::entry(request)?;
        let mut r = handles::lock_request(&entry)?;
        let store = Arc::clone(&r.store);
        let layout = store.store.layout();
        let group = layout.layer_group(w.layer)?.0;
        let lane = r.lane_index(group, w.shard)?;
        let table = r.table(lane)?;
        let pool = store.store.pool();
        let mut lanes = [&mut r.lanes[lane]];
        let mut guards = Lanes::take(pool, &mut lanes)?;
        let result = {
            let mut view = guards.view(pool);
            cpu(&engine).write_kv(
                &mut view,
                &KvWrite {
                    layer: w.layer,
                    shard: w.shard,
                    block_table: &table,
                    start: w.start,
                    k,
                    v,
                },
            )
        };
        guards.put_back(&mut lanes);
        Ok(result?)
    })
}

/// One layer's attention for a batch of sequences, each the pages of one
/// request (decode: `q_len` 1; causal prefill: more), into `out`. All
/// requests are of one store, each at most once in the batch. `out` is
/// untouched when the input is refused.
///
/// # Safety
///
/// `attend` points to a `KvsAttend` whose `seqs`, `q` and `out` point to
/// `n_seqs` sequences, `q_len` readable floats and `out_len` writable
/// floats (`out` not overlapping `q`). All are only used during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_attend(engine: KvsEngine, attend: *const KvsAttend) -> KvsStatus {
    call(|| {
        // SAFETY: the caller's promise on `attend` and what it points to.
        let a = unsafe { args::read_in(attend, "attend") }?;
        // SAFETY: as above.
        let seqs = unsafe { args::slice_in(a.seqs, a.n_seqs, "attend.seqs") }?;
        // SAFETY: as above.
        let q = unsafe { args::slice_in(a.q, a.q_len, "attend.q") }?;
        // SAFETY: as above.
        let out = unsafe { args::slice_out(a.out, a.out_len, "attend.out") }?;
        let engine = engine_entry(engine)?;
        let mut seen = HashSet::with_capacity(seqs.len());
        if let Some(s) = seqs.iter().find(|s| !seen.insert(s.request.id)) {
            return Err(Failure::invalid(format!(
                "request {} appears twice in the batch",
                s.request.id
            )));
        }
        let entries = seqs
            .iter()
            .map(|s| request::entry(s.request))
            .collect::<Outcome<Vec<_>>>()?;
        let mut locked = entries
            .iter()
            .map(handles::lock_request)
            .collect::<Outcome<Vec<_>>>()?;
        let Some(first) = locked.first() else {
            return Err(Failure::new(KvsStatus::InvalidLength, "no sequences"));
        };
        let store = Arc::clone(&first.store);
        if locked.iter().any(|r| !Arc::ptr_eq(&r.store, &store)) {
            return Err(Failure::invalid(
                "the batch's requests are on different stores",
            ));
        }
        let group = store.store.layout().layer_group(a.layer)?.0;
        let lane = first.lane_index(group, a.shard)?;
        let tables = locked
            .iter()
            .map(|r| r.table(lane))
            .collect::<Outcome<Vec<_>>>()?;
        let batch_seqs: Vec<SeqAttention<'_>> = seqs
            .iter()
            .zip(&tables)
            .map(|(s, t)| SeqAttention {
                block_table: t,
                kv_len: s.kv_len,
                q_len: s.q_len,
            })
            .collect();
        let pool = store.store.pool();
        let mut lanes: Vec<_> = locked.iter_mut().map(|r| &mut r.lanes[lane]).collect();
        let mut guards = Lanes::take(pool, &mut lanes)?;
        let result = {
            let view = guards.view(pool);
            let mut batch =
                AttentionBatch::for_layer(a.layer, &batch_seqs, q, a.scale).shard(a.shard);
            batch.window = (a.window > 0).then_some(a.window);
            cpu(&engine).attend(&view, &batch, out)
        };
        guards.put_back(&mut lanes);
        Ok(result?)
    })
}
