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
    /// A scaled 8-bit dtype: codes and one scale per token.
    Scaled(ScaledRows<'a>),
}

/// One head's rows of a scaled dtype ([`KvDtype::is_scaled`]): the codes
/// as stored and the `block_tokens` scales, token order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScaledRows<'a> {
    /// [`KvDtype::I8`] or [`KvDtype::F8E4M3`].
    pub dtype: KvDtype,
    /// `block_tokens × head_dim` codes (transposed for dim-major keys).
    pub codes: &'a [u8],
    /// One scale per token of the block.
    pub scales: &'a [f32],
    /// Whether the codes are stored `[head_dim][token]`.
    pub dim_major: bool,
}

impl ScaledRows<'_> {
    /// Element `i` (in storage order) as f32: its code times its token's
    /// scale.
    /// `None` past the end, and for rows whose codes are not a whole
    /// number of rows of one scale each (possible only for rows built by
    /// hand from the public fields).
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        let code = *self.codes.get(i)?;
        let bt = self.scales.len();
        let token = if self.dim_major {
            i.checked_rem(bt)?
        } else {
            let row = self.codes.len().checked_div(bt).filter(|&r| r > 0)?;
            i / row
        };
        let mut x = [0f32];
        self.dtype
            .dequantize_row(&[code], *self.scales.get(token)?, &mut x)
            .ok()?;
        Some(x[0])
    }
}

impl KvRows<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            KvRows::F32(x) => x.len(),
            KvRows::F16(x) => x.len(),
            KvRows::Bf16(x) => x.len(),
            KvRows::Scaled(x) => x.codes.len(),
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
            KvRows::Scaled(x) => x.get_f32(i),
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
    /// A scaled 8-bit dtype: `codes` as stored (see [`ScaledRows`]) and
    /// one scale per token.
    Scaled {
        /// [`KvDtype::I8`] or [`KvDtype::F8E4M3`].
        dtype: KvDtype,
        /// The codes.
        codes: &'a mut [u8],
        /// The scales.
        scales: &'a mut [f32],
    },
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
    if let Some(sr) = layout.scale_region(part, layer_in_group, head_in_shard)? {
        return Ok(KvRows::Scaled(ScaledRows {
            dtype: layout.dtype(),
            codes: bytes,
            scales: <[f32]>::ref_from_bytes(&page[sr]).map_err(|_| MISALIGNED)?,
            dim_major: part == KvPart::K && layout.key_order() == crate::KeyOrder::DimMajor,
        }));
    }
    Ok(match layout.dtype() {
        KvDtype::F32 => KvRows::F32(<[f32]>::ref_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::F16 => KvRows::F16(<[f16]>::ref_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::Bf16 => KvRows::Bf16(<[bf16]>::ref_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::I8 | KvDtype::F8E4M3 => unreachable!("scaled dtypes have a scale region"),
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
    let region = region_bytes(layout, part, layer_in_group, head_in_shard)?;
    if let Some(sr) = layout.scale_region(part, layer_in_group, head_in_shard)? {
        // The scale section follows every value, so the page splits there.
        let (values, scales) = page.split_at_mut(sr.start);
        return Ok(KvRowsMut::Scaled {
            dtype: layout.dtype(),
            codes: &mut values[region],
            scales: <[f32]>::mut_from_bytes(&mut scales[..sr.len()]).map_err(|_| MISALIGNED)?,
        });
    }
    let bytes = &mut page[region];
    Ok(match layout.dtype() {
        KvDtype::F32 => KvRowsMut::F32(<[f32]>::mut_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::F16 => KvRowsMut::F16(<[f16]>::mut_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::Bf16 => KvRowsMut::Bf16(<[bf16]>::mut_from_bytes(bytes).map_err(|_| MISALIGNED)?),
        KvDtype::I8 | KvDtype::F8E4M3 => unreachable!("scaled dtypes have a scale region"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows built by hand whose codes and scales disagree are `None`, not
    /// a division by zero or an index past the scales.
    #[test]
    fn mismatched_hand_built_rows_are_none() {
        let rows = |codes, scales, dim_major| ScaledRows {
            dtype: KvDtype::I8,
            codes,
            scales,
            dim_major,
        };
        assert_eq!(rows(&[1, 2], &[1.0; 4], false).get_f32(0), None);
        assert_eq!(rows(&[0; 3], &[1.0; 2], false).get_f32(2), None);
        assert_eq!(rows(&[1], &[], true).get_f32(0), None);
        assert_eq!(rows(&[2, 4], &[0.5, 0.25], false).get_f32(1), Some(1.0));
    }
}
