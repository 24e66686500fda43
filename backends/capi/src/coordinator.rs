//! Coordinators: tokens to canonical block keys.

use kvslice_core::{Coordinator, HashSecret, KeyScope, Request};

use crate::handles::{self, Object};
use crate::status::{Failure, KvsStatus, Outcome, call};
use crate::{KvsCoordinator, KvsKey, KvsLayout, KvsPlanInfo, KvsPlanRequest, args};

/// Makes a coordinator for `layout` keyed by the deployment's 16-byte
/// `secret` (keys are keyed hashes: without the secret nobody can predict
/// or forge them).
///
/// # Safety
///
/// `secret` points to 16 readable bytes; `out` to writable memory for a
/// handle. Both are only used during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_coordinator_new(
    layout: KvsLayout,
    secret: *const [u8; 16],
    out: *mut KvsCoordinator,
) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        // SAFETY: the caller's promise on `secret`.
        let secret = unsafe { args::read_in(secret, "secret") }?;
        let coord = Coordinator::new(crate::layout::get(layout)?, HashSecret::from_bytes(secret));
        let id = handles::insert(Object::Coordinator(coord))?;
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, KvsCoordinator { id }, "out") }
    })
}

/// Destroys a coordinator handle.
#[unsafe(no_mangle)]
pub extern "C" fn kvs_coordinator_destroy(coordinator: KvsCoordinator) -> KvsStatus {
    call(|| {
        handles::remove(coordinator.id, "coordinator", |o| {
            Ok(matches!(o, Object::Coordinator(_)))
        })
    })
}

fn with<T>(c: KvsCoordinator, f: impl FnOnce(&Coordinator) -> Outcome<T>) -> Outcome<T> {
    let entry = handles::entry(c.id, "coordinator", |o| matches!(o, Object::Coordinator(_)))?;
    let Object::Coordinator(coord) = &*entry else {
        unreachable!("checked by `entry`")
    };
    f(coord)
}

/// Plans `request` into block keys for one layer group and head shard:
/// writes `info`, and the keys to `keys` (room for `keys_cap`).
///
/// When `keys_cap` is smaller than the plan, returns
/// `KVS_STATUS_BUFFER_TOO_SMALL` with `info` written (its `blocks` is the
/// room needed) and no keys. `keys` may be null when `keys_cap` is 0.
///
/// # Safety
///
/// `request` points to a `KvsPlanRequest` whose `tokens` and `salt` point
/// to `n_tokens` ids and `salt_len` bytes (either may be null when its
/// length is 0); `keys` to `keys_cap` writable keys; `info` to a writable
/// `KvsPlanInfo`. All are only used during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_plan(
    coordinator: KvsCoordinator,
    request: *const KvsPlanRequest,
    keys: *mut KvsKey,
    keys_cap: usize,
    info: *mut KvsPlanInfo,
) -> KvsStatus {
    call(|| {
        args::check_out(info, "info")?;
        // SAFETY: the caller's promise on `request` and what it points to.
        let r = unsafe { args::read_in(request, "request") }?;
        // SAFETY: as above.
        let tokens = unsafe { args::slice_in(r.tokens, r.n_tokens, "request.tokens") }?;
        // SAFETY: as above.
        let salt = unsafe { args::slice_in(r.salt, r.salt_len, "request.salt") }?;
        // SAFETY: the caller's promise on `keys`.
        let keys = unsafe { args::slice_out(keys, keys_cap, "keys") }?;
        let range = if r.range_start == 0 && r.range_end == 0 {
            0..tokens.len()
        } else {
            r.range_start..r.range_end
        };
        let (plan_info, written) = with(coordinator, |coord| {
            let plan = coord.plan(
                &Request::new(tokens)
                    .with_scope(KeyScope {
                        salt,
                        adapter: None,
                    })
                    .with_range(range),
            )?;
            let it = plan.keys_for(r.layer_group, r.head_shard)?;
            let token_range = plan.token_range();
            let plan_info = KvsPlanInfo {
                blocks: it.len(),
                full_blocks: plan.full_blocks(),
                token_start: token_range.start,
                token_end: token_range.end,
            };
            if it.len() > keys.len() {
                return Ok((plan_info, false));
            }
            for (slot, key) in keys.iter_mut().zip(it) {
                *slot = key.into();
            }
            Ok((plan_info, true))
        })?;
        // SAFETY: checked above; the caller's promise on `info`.
        unsafe { args::write_out(info, plan_info, "info") }?;
        if written {
            Ok(())
        } else {
            Err(Failure::too_small("plan keys", plan_info.blocks, keys_cap))
        }
    })
}
