//! Requests: a ticket and the pages a request holds, per (layer group,
//! head shard) lane, in block-table order.
//!
//! Pages are kept as tokens (a [`RefToken`] for a cached page, a
//! [`FillToken`] for one being filled), since a C caller's request outlives
//! any Rust borrow; each call turns the lanes it needs back into guards
//! and the guards back into tokens before it returns.

use std::sync::Arc;

use kvslice_core::{
    FillToken, PageId, PageMut, PagePool, PageRef, PageView, RefToken, RequestTicket, SliceKey,
    first_kept_block,
};

use crate::handles::{self, Entry, Object};
use crate::status::{Failure, KvsStatus, Outcome, call};
use crate::store::StoreObj;
use crate::{KvsKey, KvsRequest, KvsStore, args};

/// The block-table entry (`kvs_block_table`) of a position whose page
/// `kvs_request_slide_window` released.
pub const KVS_PAGE_RELEASED: u32 = 0xFFFF_FFFF;
const _: () = assert!(KVS_PAGE_RELEASED == PageId::PLACEHOLDER.0);

/// One block-table position of a lane.
#[derive(Debug)]
pub(crate) enum Slot {
    /// A cached page, with one reference.
    Held(RefToken),
    /// A page being filled, not yet published.
    Fill(FillToken),
    /// A page a failed publish gave back; truncate the lane before it.
    Lost,
    /// A page released because no later token attends to it
    /// (`kvs_request_slide_window`); its block-table entry is
    /// `KVS_PAGE_RELEASED`.
    Released,
}

/// The same position while a call uses it.
enum Guard<'s> {
    Held(PageRef<'s, 'static>),
    Fill(PageMut<'s, 'static>),
    Lost,
    Released,
}

pub(crate) struct RequestObj {
    pub(crate) store: Arc<StoreObj>,
    ticket: Option<RequestTicket>,
    /// Layer group major, then head shard.
    pub(crate) lanes: Vec<Vec<Slot>>,
    head_shards: u32,
    /// Keys of the last lookup, converted: reused so that the hit path
    /// allocates nothing for them.
    scratch: Vec<SliceKey>,
}

impl RequestObj {
    pub(crate) fn ticket(&self) -> Outcome<&RequestTicket> {
        live(&self.ticket)
    }

    pub(crate) fn lane_index(&self, layer_group: u32, head_shard: u32) -> Outcome<usize> {
        let layout = self.store.store.layout();
        if layer_group >= layout.num_layer_groups() || head_shard >= self.head_shards {
            return Err(Failure::invalid(format!(
                "lane (layer group {layer_group}, head shard {head_shard}) is outside the layout's {} groups × {} shards",
                layout.num_layer_groups(),
                self.head_shards
            )));
        }
        Ok((layer_group * self.head_shards + head_shard) as usize)
    }

    /// Releases every page of `lane` from position `keep` on.
    fn truncate(&mut self, lane: usize, keep: usize) {
        let pool = self.store.store.pool();
        if keep < self.lanes[lane].len() {
            for slot in self.lanes[lane].drain(keep..) {
                release(pool, slot);
            }
        }
    }

    /// Releases every page of every lane before block `block`, leaving
    /// [`Slot::Released`] in their places; how many pages it released.
    fn release_before(&mut self, block: usize) -> usize {
        let pool = self.store.store.pool();
        let mut n = 0;
        for lane in &mut self.lanes {
            let upto = block.min(lane.len());
            for slot in &mut lane[..upto] {
                match std::mem::replace(slot, Slot::Released) {
                    Slot::Released | Slot::Lost => {}
                    page => {
                        release(pool, page);
                        n += 1;
                    }
                }
            }
        }
        n
    }

    /// Releases every page and ends the ticket.
    fn end(&mut self) -> Outcome {
        for lane in 0..self.lanes.len() {
            self.truncate(lane, 0);
        }
        match self.ticket.take() {
            Some(t) => Ok(self.store.store.end_request(t)?),
            None => Ok(()),
        }
    }

    /// The page ids of `lane`, in order; a lost page is an error.
    pub(crate) fn table(&self, lane: usize) -> Outcome<Vec<PageId>> {
        self.lanes[lane]
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                Slot::Held(t) => Ok(t.handle().id()),
                Slot::Fill(t) => Ok(t.handle().id()),
                Slot::Released => Ok(PageId::PLACEHOLDER),
                Slot::Lost => Err(Failure::invalid(format!(
                    "position {i} lost its page to a failed publish: truncate the lane there and allocate again"
                ))),
            })
            .collect()
    }
}

/// The ticket of a request that has not ended.
fn live(ticket: &Option<RequestTicket>) -> Outcome<&RequestTicket> {
    ticket
        .as_ref()
        .ok_or_else(|| Failure::new(KvsStatus::InvalidHandle, "the request has ended"))
}

impl Drop for RequestObj {
    fn drop(&mut self) {
        // Ended explicitly in `kvs_request_end`; this covers a request
        // whose handle went another way (a panic caught mid-call).
        let _ = self.end();
    }
}

fn release(pool: &PagePool<'static>, slot: Slot) {
    // Tokens made from this pool redeem into it; nothing else can fail.
    match slot {
        Slot::Held(t) => drop(pool.release(t)),
        Slot::Fill(t) => drop(pool.redeem_fill(t)),
        Slot::Lost | Slot::Released => {}
    }
}

/// A lane's pages as guards, for one call.
pub(crate) struct Lanes<'s> {
    guards: Vec<Vec<Guard<'s>>>,
}

impl<'s> Lanes<'s> {
    /// Takes `lanes`' tokens as guards on `pool`. If the call panics before
    /// [`put_back`](Self::put_back), the guards release their pages (the
    /// lanes stay empty): nothing leaks and nothing is released twice.
    pub(crate) fn take(pool: &'s PagePool<'static>, lanes: &mut [&mut Vec<Slot>]) -> Outcome<Self> {
        let mut guards = Vec::with_capacity(lanes.len());
        for lane in lanes.iter_mut() {
            let mut g = Vec::with_capacity(lane.len());
            for slot in lane.drain(..) {
                g.push(match slot {
                    Slot::Held(t) => Guard::Held(pool.redeem(t)?),
                    Slot::Fill(t) => Guard::Fill(pool.redeem_fill(t)?),
                    Slot::Lost => Guard::Lost,
                    Slot::Released => Guard::Released,
                });
            }
            guards.push(g);
        }
        Ok(Self { guards })
    }

    /// A view over every page taken.
    pub(crate) fn view(&mut self, pool: &PagePool<'static>) -> PageView<'_> {
        let mut view = PageView::new(pool);
        for g in self.guards.iter_mut().flatten() {
            match g {
                Guard::Held(r) => view.add_ref(r),
                Guard::Fill(m) => view.add_mut(m),
                Guard::Lost | Guard::Released => {}
            }
        }
        view
    }

    /// Turns the guards back into the lanes' tokens, in order.
    pub(crate) fn put_back(self, lanes: &mut [&mut Vec<Slot>]) {
        for (lane, guards) in lanes.iter_mut().zip(self.guards) {
            lane.extend(guards.into_iter().map(|g| match g {
                Guard::Held(r) => Slot::Held(r.into_token()),
                Guard::Fill(m) => Slot::Fill(m.into_token()),
                Guard::Lost => Slot::Lost,
                Guard::Released => Slot::Released,
            }));
        }
    }
}

pub(crate) fn entry(request: KvsRequest) -> Outcome<Entry> {
    handles::entry(request.id, "request", |o| matches!(o, Object::Request(_)))
}

/// Runs `f` on the locked request.
fn with<T>(request: KvsRequest, f: impl FnOnce(&mut RequestObj) -> Outcome<T>) -> Outcome<T> {
    let entry = entry(request)?;
    let mut r = handles::lock_request(&entry)?;
    f(&mut r)
}

/// Begins a request on `store`, with empty block tables.
///
/// # Safety
///
/// `out` points to writable memory for a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_request_begin(store: KvsStore, out: *mut KvsRequest) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        let s = crate::store::get(store)?;
        let layout = *s.store.layout();
        let lanes = (layout.num_layer_groups() * layout.num_head_shards()) as usize;
        let obj = RequestObj {
            ticket: Some(s.store.begin_request()),
            store: s,
            lanes: (0..lanes).map(|_| Vec::new()).collect(),
            head_shards: layout.num_head_shards(),
            scratch: Vec::new(),
        };
        let id = handles::insert(Object::Request(std::sync::Mutex::new(obj)))?;
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, KvsRequest { id }, "out") }
    })
}

/// Ends a request: releases every page it holds (cached pages stay cached
/// and become evictable; unpublished ones are freed) and destroys the
/// handle.
#[unsafe(no_mangle)]
pub extern "C" fn kvs_request_end(request: KvsRequest) -> KvsStatus {
    call(|| {
        with(request, RequestObj::end)?;
        handles::remove(request.id, "request", |o| {
            Ok(matches!(o, Object::Request(_)))
        })
    })
}

/// The lane all of `keys` belong to; `None` for no keys.
fn keys_lane(r: &RequestObj, keys: &[KvsKey]) -> Outcome<Option<usize>> {
    let Some(first) = keys.first() else {
        return Ok(None);
    };
    if keys
        .iter()
        .any(|k| (k.layer_group, k.head_shard) != (first.layer_group, first.head_shard))
    {
        return Err(Failure::invalid(
            "keys of one call must share a layer group and head shard",
        ));
    }
    r.lane_index(first.layer_group, first.head_shard).map(Some)
}

/// Looks up the longest cached prefix of `keys` (in sequence order, one
/// lane) and appends its pages, each with a reference, to the request's
/// block table for that lane; writes how many to `hits`. `total_tokens`
/// (the tokens the keys cover) sizes the miss count in the stats.
/// No keys (a prompt shorter than one block has no full block to look
/// up; `keys` may then be null) is 0 hits, counted as a lookup that
/// missed `total_tokens`.
///
/// Lock-free with the default policy: per block a map read, a reference
/// count and a wait-free record of the access.
///
/// # Safety
///
/// `keys` points to `n_keys` keys (or is null for none); `hits` to a
/// writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_lookup_prefix(
    request: KvsRequest,
    keys: *const KvsKey,
    n_keys: usize,
    total_tokens: usize,
    hits: *mut usize,
) -> KvsStatus {
    call(|| {
        args::check_out(hits, "hits")?;
        // SAFETY: the caller's promise on `keys`.
        let keys = unsafe { args::slice_in(keys, n_keys, "keys") }?;
        let found = with(request, |r| {
            let lane = keys_lane(r, keys)?;
            let store = Arc::clone(&r.store);
            let guard = store.store.pin();
            let mut slice_keys = std::mem::take(&mut r.scratch);
            slice_keys.clear();
            slice_keys.extend(keys.iter().map(|&k| SliceKey::from(k)));
            let mut found = Vec::with_capacity(keys.len());
            let n = store.store.lookup_prefix(
                r.ticket()?,
                &slice_keys,
                total_tokens,
                &guard,
                &mut found,
            )?;
            if let Some(lane) = lane {
                r.lanes[lane].extend(found.into_iter().map(|p| Slot::Held(p.into_token())));
            }
            r.scratch = slice_keys;
            Ok(n)
        })?;
        // SAFETY: checked above; the caller's promise on `hits`.
        unsafe { args::write_out(hits, found, "hits") }
    })
}

/// Appends `n` fresh pages to the lane's block table, all or nothing
/// (evicting cached pages in the policy's order if the pool is full), and
/// writes the position of the first to `first_slot`.
///
/// # Safety
///
/// `first_slot` points to a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_allocate(
    request: KvsRequest,
    layer_group: u32,
    head_shard: u32,
    n: u32,
    first_slot: *mut usize,
) -> KvsStatus {
    call(|| {
        args::check_out(first_slot, "first_slot")?;
        let first = with(request, |r| {
            let lane = r.lane_index(layer_group, head_shard)?;
            r.ticket()?;
            let store = Arc::clone(&r.store);
            let guard = store.store.pin();
            let pages = store.store.allocate(n, &guard)?;
            let first = r.lanes[lane].len();
            r.lanes[lane].extend(pages.into_iter().map(|p| Slot::Fill(p.into_token())));
            Ok(first)
        })?;
        // SAFETY: checked above; the caller's promise on `first_slot`.
        unsafe { args::write_out(first_slot, first, "first_slot") }
    })
}

/// Publishes the filled page at `slot` of `key`'s lane under `key`, with
/// the previous position's page as its parent (which must be published
/// already: publish blocks in order), holding `valid_tokens` tokens.
/// Writes the cached page's id to `page`: normally the same page; if
/// another request published `key` first, theirs, and this one is freed
/// (the block table then names theirs, with the same K/V).
///
/// # Safety
///
/// `key` points to a key; `page` to a writable `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_publish(
    request: KvsRequest,
    slot: usize,
    key: *const KvsKey,
    valid_tokens: u32,
    page: *mut u32,
) -> KvsStatus {
    call(|| {
        args::check_out(page, "page")?;
        // SAFETY: the caller's promise on `key`.
        let key = unsafe { args::read_in(key, "key") }?;
        let id = with(request, |r| publish(r, slot, key, valid_tokens))?;
        // SAFETY: checked above; the caller's promise on `page`.
        unsafe { args::write_out(page, id.0, "page") }
    })
}

fn publish(r: &mut RequestObj, slot: usize, key: KvsKey, valid_tokens: u32) -> Outcome<PageId> {
    let lane = r.lane_index(key.layer_group, key.head_shard)?;
    let store = Arc::clone(&r.store);
    let bt = store.store.layout().block_tokens();
    // Checked here so that a refused publish never costs the page.
    if valid_tokens == 0 || valid_tokens > bt {
        return Err(Failure::invalid(format!(
            "valid_tokens {valid_tokens} is outside 1..={bt}"
        )));
    }
    let slots = &mut r.lanes[lane];
    match slots.get(slot) {
        Some(Slot::Fill(_)) => {}
        Some(_) => {
            return Err(Failure::invalid(format!(
                "position {slot} is not a page being filled"
            )));
        }
        None => {
            return Err(Failure::invalid(format!(
                "position {slot} is past the lane's {} pages",
                slots.len()
            )));
        }
    }
    // A parent the window released is no parent: the block is published
    // without one (a root to the store, no parent in its event).
    if slot > 0 && !matches!(slots[slot - 1], Slot::Held(_) | Slot::Released) {
        return Err(Failure::invalid(format!(
            "position {} (the parent) is not published: publish blocks in order",
            slot - 1
        )));
    }
    // Through the field, not `ticket()`: the lanes are borrowed mutably next.
    let ticket = live(&r.ticket)?;
    let pool = store.store.pool();
    let slots = &mut r.lanes[lane];
    let Slot::Fill(fill) = std::mem::replace(&mut slots[slot], Slot::Lost) else {
        unreachable!("checked above")
    };
    let fill = pool.redeem_fill(fill)?;
    let parent = match slot.checked_sub(1) {
        Some(p) if matches!(slots[p], Slot::Held(_)) => {
            let Slot::Held(t) = std::mem::replace(&mut slots[p], Slot::Lost) else {
                unreachable!("matched above")
            };
            Some(pool.redeem(t)?)
        }
        _ => None,
    };
    let guard = store.store.pin();
    let result = store.store.publish(
        ticket,
        fill,
        key.into(),
        parent.as_ref(),
        valid_tokens,
        &guard,
    );
    if let Some(p) = parent {
        slots[slot - 1] = Slot::Held(p.into_token());
    }
    let cached = result?;
    let id = cached.handle().id();
    slots[slot] = Slot::Held(cached.into_token());
    Ok(id)
}

/// Releases the lane's pages from position `keep` on (cached pages lose
/// this request's reference; unpublished ones are freed).
#[unsafe(no_mangle)]
pub extern "C" fn kvs_request_truncate(
    request: KvsRequest,
    layer_group: u32,
    head_shard: u32,
    keep: usize,
) -> KvsStatus {
    call(|| {
        with(request, |r| {
            let lane = r.lane_index(layer_group, head_shard)?;
            r.truncate(lane, keep);
            Ok(())
        })
    })
}

/// Releases the pages no later token attends to under a sliding window of
/// `window` tokens, in every lane of the request: the next token, at
/// position `kv_len` (the tokens so far), sees `kv_len + 1 - window` to
/// `kv_len`, so every block before the one holding the first of those
/// goes. Their block-table entries become `KVS_PAGE_RELEASED` (positions
/// keep their blocks); cached pages stay in the store for other requests,
/// unpublished ones are freed. Writes how many pages it released to
/// `released`. Called after each decode step, a request holds at most
/// `ceil(window / block_tokens) + 1` pages per lane. `kvs_attend` with the
/// same `window` reads only pages it holds; a wider window reads a released
/// page and fails. A block published after its parent was released is
/// published without a parent. `window` 0 is an error.
///
/// # Safety
///
/// `released` points to a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_request_slide_window(
    request: KvsRequest,
    window: u32,
    kv_len: usize,
    released: *mut usize,
) -> KvsStatus {
    call(|| {
        args::check_out(released, "released")?;
        let n = with(request, |r| {
            live(&r.ticket)?;
            let bt = r.store.store.layout().block_tokens();
            Ok(r.release_before(first_kept_block(kv_len, window, bt)?))
        })?;
        // SAFETY: checked above; the caller's promise on `released`.
        unsafe { args::write_out(released, n, "released") }
    })
}

/// Writes the lane's page ids, in order, to `pages` (room for `cap`) and
/// their number to `len` (`KVS_PAGE_RELEASED` where a window released
/// the page). With too little room: `KVS_STATUS_BUFFER_TOO_SMALL`,
/// `len` written, no ids.
///
/// # Safety
///
/// `pages` points to `cap` writable `uint32_t` (null when `cap` is 0);
/// `len` to a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_block_table(
    request: KvsRequest,
    layer_group: u32,
    head_shard: u32,
    pages: *mut u32,
    cap: usize,
    len: *mut usize,
) -> KvsStatus {
    call(|| {
        args::check_out(len, "len")?;
        // SAFETY: the caller's promise on `pages`.
        let out = unsafe { args::slice_out(pages, cap, "pages") }?;
        let table = with(request, |r| r.table(r.lane_index(layer_group, head_shard)?))?;
        // SAFETY: checked above; the caller's promise on `len`.
        unsafe { args::write_out(len, table.len(), "len") }?;
        if table.len() > out.len() {
            return Err(Failure::too_small("page ids", table.len(), cap));
        }
        for (o, id) in out.iter_mut().zip(&table) {
            *o = id.0;
        }
        Ok(())
    })
}
