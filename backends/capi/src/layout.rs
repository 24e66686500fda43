//! Layouts: the model's K/V geometry, validated once.

use kvslice_core::{KeyOrder, KvDtype, KvLayout, LayerGrouping, LayoutSpec};

use crate::handles::{self, Object};
use crate::status::{Failure, Outcome, call};
use crate::{KvsLayout, KvsLayoutInfo, KvsLayoutSpec, KvsShardInfo, KvsStatus, args, types};

pub(crate) fn get(layout: KvsLayout) -> Outcome<KvLayout> {
    handles::get(layout.id, "layout", |o| match o {
        Object::Layout(l) => Some(*l),
        _ => None,
    })
}

fn spec(s: &KvsLayoutSpec) -> Outcome<LayoutSpec> {
    let dtype = match s.dtype {
        types::KVS_DTYPE_F32 => KvDtype::F32,
        types::KVS_DTYPE_F16 => KvDtype::F16,
        types::KVS_DTYPE_BF16 => KvDtype::Bf16,
        types::KVS_DTYPE_I8 => KvDtype::I8,
        types::KVS_DTYPE_F8E4M3 => KvDtype::F8E4M3,
        d => return Err(Failure::invalid(format!("unknown dtype {d} (KVS_DTYPE_*)"))),
    };
    let grouping = match s.layers_per_group {
        0 => LayerGrouping::AllLayers,
        1 => LayerGrouping::PerLayer,
        n => LayerGrouping::Groups(n),
    };
    let key_order = match s.key_order {
        types::KVS_KEY_ORDER_TOKEN_MAJOR => KeyOrder::TokenMajor,
        types::KVS_KEY_ORDER_DIM_MAJOR => KeyOrder::DimMajor,
        o => {
            return Err(Failure::invalid(format!(
                "unknown key order {o} (KVS_KEY_ORDER_*)"
            )));
        }
    };
    Ok(LayoutSpec::new(
        s.num_layers,
        s.num_q_heads,
        s.num_kv_heads,
        s.head_dim,
        s.block_tokens,
        dtype,
    )
    .with_grouping(grouping)
    .with_head_shards(s.head_shards.max(1))
    .with_key_order(key_order))
}

/// Validates `spec` and makes a layout handle in `out`.
///
/// # Safety
///
/// `spec` points to a `KvsLayoutSpec`; `out` to writable memory for a
/// handle. Both are only used during the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_layout_new(
    spec: *const KvsLayoutSpec,
    out: *mut KvsLayout,
) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        // SAFETY: the caller's promise on `spec`.
        let s = unsafe { args::read_in(spec, "spec") }?;
        let layout = KvLayout::new(self::spec(&s)?)?;
        let id = handles::insert(Object::Layout(layout))?;
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, KvsLayout { id }, "out") }
    })
}

/// Sizes derived from `layout`, written to `out`.
///
/// # Safety
///
/// `out` points to writable memory for a `KvsLayoutInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_layout_info(layout: KvsLayout, out: *mut KvsLayoutInfo) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        let l = get(layout)?;
        let shard = l.head_shard(0)?;
        let info = KvsLayoutInfo {
            page_bytes: l.page_bytes(),
            layer_groups: l.num_layer_groups(),
            head_shards: l.num_head_shards(),
            kv_row: shard.num_kv_heads() * l.head_dim(),
            q_row: shard.num_q_heads() * l.head_dim(),
        };
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, info, "out") }
    })
}

/// Head shard `shard`'s heads and row sizes, written to `out`;
/// `KVS_STATUS_INVALID_ARGUMENT` past the layout's shards.
///
/// # Safety
///
/// `out` points to writable memory for a `KvsShardInfo`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvs_layout_shard_info(
    layout: KvsLayout,
    shard: u32,
    out: *mut KvsShardInfo,
) -> KvsStatus {
    call(|| {
        args::check_out(out, "out")?;
        let l = get(layout)?;
        let s = l.head_shard(shard)?;
        let info = KvsShardInfo {
            first_kv_head: s.kv_heads().start,
            kv_heads: s.num_kv_heads(),
            first_q_head: s.q_heads().start,
            q_heads: s.num_q_heads(),
            kv_row: s.num_kv_heads() * l.head_dim(),
            q_row: s.num_q_heads() * l.head_dim(),
        };
        // SAFETY: checked above; the caller's promise on `out`.
        unsafe { args::write_out(out, info, "out") }
    })
}

/// Destroys a layout handle. Stores and coordinators made from it keep
/// their own copy.
#[unsafe(no_mangle)]
pub extern "C" fn kvs_layout_destroy(layout: KvsLayout) -> KvsStatus {
    call(|| handles::remove(layout.id, "layout", |o| Ok(matches!(o, Object::Layout(_)))))
}
