//! Typed views of one head's K or V rows inside a page.

use half::{bf16, f16};
use zerocopy::FromBytes;

use crate::error::{Error, Result};
use crate::layout::{KvDtype, KvLayout, KvPart};

/// One head's `block_tokens × head_dim` K or V matrix, in the storage dtype
/// and as stored: keys of a [`KeyOrder::DimMajor`](crate::KeyOrder) layout
/// are its transpose, `head_dim × block_tokens`
/// ([`KvLayout::elem_offset`](crate::KvLayout::elem_offset)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvRows<'a> {
    /// f32 storage.
    F32(&'a [f32]),
    /// f16 storage.
    F16(&'a [f16]),
    /// bf16 storage.
    Bf16(&'a [bf16]),
}

impl KvRows<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            KvRows::F32(x) => x.len(),
            KvRows::F16(x) => x.len(),
            KvRows::Bf16(x) => x.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as f32.
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        match self {
            KvRows::F32(x) => x.get(i).copied(),
            KvRows::F16(x) => x.get(i).map(|v| v.to_f32()),
            KvRows::Bf16(x) => x.get(i).map(|v| v.to_f32()),
        }
    }
}

/// One head's K or V matrix, writable, as stored (see [`KvRows`]).
#[derive(Debug, PartialEq)]
pub enum KvRowsMut<'a> {
    /// f32 storage.
    F32(&'a mut [f32]),
    /// f16 storage.
    F16(&'a mut [f16]),
    /// bf16 storage.
    Bf16(&'a mut [bf16]),
}

fn region_bytes(
    layout: &KvLayout,
    part: KvPart,
    layer_in_group: u32,
    head_in_shard: u32,
) -> Result<core::ops::Range<usize>> {
    let es = layout.dtype().size_bytes();
    let r = layout.head_region(part, layer_in_group, head_in_shard)?;
    Ok(r.start * es..r.end * es)
}

const MISALIGNED: Error = Error::InvalidValue("page memory is not aligned for its dtype");

/// The typed rows of one head in `page` (a page of `layout`).
pub(crate) fn rows<'a>(
    layout: &KvLayout,
    page: &'a [u8],
    part: KvPart,
    layer_in_group: u32,
    head_in_shard: u32,
) -> Result<KvRows<'a>> {
    let bytes = &page[region_bytes(layout, part, layer_in_group, head_in_shard)?];
    Ok(match layout.dtype() {
        KvDtype::F32 => KvRows::F32(<[f32]>::ref_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::F16 => KvRows::F16(<[f16]>::ref_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::Bf16 => KvRows::Bf16(<[bf16]>::ref_from_bytes(bytes).map_err(|_| MISALIGNED)?),
    })
}

/// The typed rows of one head in `page`, writable.
pub(crate) fn rows_mut<'a>(
    layout: &KvLayout,
    page: &'a mut [u8],
    part: KvPart,
    layer_in_group: u32,
    head_in_shard: u32,
) -> Result<KvRowsMut<'a>> {
    let bytes = &mut page[region_bytes(layout, part, layer_in_group, head_in_shard)?];
    Ok(match layout.dtype() {
        KvDtype::F32 => KvRowsMut::F32(<[f32]>::mut_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::F16 => KvRowsMut::F16(<[f16]>::mut_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::Bf16 => KvRowsMut::Bf16(<[bf16]>::mut_from_bytes(bytes).map_err(|_| MISALIGNED)?),
    })
}
