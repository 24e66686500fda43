//! Model and page geometry: validated once, then every size is a lookup.
//!
//! A page holds K and V of `block_tokens` tokens for one layer group and one
//! head shard. Inside a page the order is
//! `[layer in group][K | V][kv head in shard][token][head_dim]`, so one
//! head's keys for a block are a contiguous `block_tokens × head_dim` matrix;
//! with [`KeyOrder::DimMajor`] that matrix of keys is stored transposed,
//! `[head_dim][token]` (values keep `[token][head_dim]`). Scaled 8-bit
//! dtypes ([`KvDtype::is_scaled`]) add a scale section after the values,
//! 4-byte aligned: one f32 per row, `[layer in group][K | V][kv head in
//! shard][token]`.

mod dtype;
mod quant;
mod shard;

use core::ops::Range;

pub use dtype::KvDtype;
pub use quant::{F8E4M3_MAX, I8_MAX, SCALED_ZERO_BELOW, f8e4m3_from_f32, f8e4m3_to_f32};
pub use shard::HeadShard;

use crate::error::{Error, Result, check_index};

/// How layers are grouped into pages: the slicing granularity along depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerGrouping {
    /// Every layer of a block in one page (token-level granularity).
    AllLayers,
    /// One page per layer (layer-level granularity).
    PerLayer,
    /// Pages of this many consecutive layers; the last group may be shorter.
    Groups(u32),
}

/// How one head's keys are ordered inside a block: the only part of the
/// page format that differs between layouts of equal sizes.
///
/// ```
/// use kvslice_core::{KeyOrder, KvDtype, KvLayout, KvPart, LayoutSpec};
///
/// let spec = LayoutSpec::new(1, 4, 1, 8, 16, KvDtype::F16);
/// let tm = KvLayout::new(spec)?;
/// let dm = KvLayout::new(spec.with_key_order(KeyOrder::DimMajor))?;
/// // Element 3 of token 5: row-major, or column-major over the block.
/// assert_eq!(tm.elem_offset(KvPart::K, 5, 3), 5 * 8 + 3);
/// assert_eq!(dm.elem_offset(KvPart::K, 5, 3), 3 * 16 + 5);
/// // Values keep token-major order, and the two layouts never share keys.
/// assert_eq!(dm.elem_offset(KvPart::V, 5, 3), 5 * 8 + 3);
/// assert_ne!(tm.fingerprint_words(), dm.fingerprint_words());
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KeyOrder {
    /// `[token][head_dim]`: each key's elements contiguous, as values are.
    #[default]
    TokenMajor,
    /// `[head_dim][token]`: each element's values over the block's tokens
    /// contiguous, so that a SIMD kernel scores a vector of keys per
    /// instruction with no horizontal sums (vLLM's CUDA key cache is
    /// transposed in part for the same reason, `[head_dim / x][token][x]`
    /// with 16-byte `x`). kvslice-cpu's four-row decode kernels take it in
    /// whole blocks of a multiple of 16 tokens (GQA groups of four); other
    /// shapes and kernel sets widen it through a transpose, slower than
    /// token-major keys. The wgpu engine does not take it yet.
    DimMajor,
}

/// Unvalidated layout parameters; turn them into a [`KvLayout`] with
/// [`KvLayout::new`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayoutSpec {
    /// Transformer layers.
    pub num_layers: u32,
    /// Query heads; a multiple of `num_kv_heads` (grouped-query attention).
    pub num_q_heads: u32,
    /// Key/value heads.
    pub num_kv_heads: u32,
    /// Elements per head vector.
    pub head_dim: u32,
    /// Tokens per page.
    pub block_tokens: u32,
    /// Storage dtype of K and V.
    pub dtype: KvDtype,
    /// Layer granularity of a page.
    pub grouping: LayerGrouping,
    /// Tensor-parallel workers the kv heads are split across.
    pub head_shards: u32,
    /// Order of each head's keys inside a block.
    pub key_order: KeyOrder,
}

impl LayoutSpec {
    /// A spec with all layers in one page and no head sharding.
    pub const fn new(
        num_layers: u32,
        num_q_heads: u32,
        num_kv_heads: u32,
        head_dim: u32,
        block_tokens: u32,
        dtype: KvDtype,
    ) -> Self {
        Self {
            num_layers,
            num_q_heads,
            num_kv_heads,
            head_dim,
            block_tokens,
            dtype,
            grouping: LayerGrouping::AllLayers,
            head_shards: 1,
            key_order: KeyOrder::TokenMajor,
        }
    }

    /// Sets the layer grouping.
    pub const fn with_grouping(mut self, grouping: LayerGrouping) -> Self {
        self.grouping = grouping;
        self
    }

    /// Sets the number of head shards (tensor-parallel workers).
    pub const fn with_head_shards(mut self, shards: u32) -> Self {
        self.head_shards = shards;
        self
    }

    /// Sets the order of keys inside a block.
    pub const fn with_key_order(mut self, order: KeyOrder) -> Self {
        self.key_order = order;
        self
    }
}

/// Which half of a layer's region: keys or values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvPart {
    /// Keys.
    K,
    /// Values.
    V,
}

/// Most (layer group, head shard) lanes a layout may have: a request
/// keeps a list of pages per lane, and the largest models have a few
/// thousand (128 layers × 64 kv heads is 8,192).
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, LayerGrouping, LayoutSpec, MAX_LANES};
///
/// // One lane per layer and kv head.
/// let lanes = |layers| {
///     LayoutSpec::new(layers, 1024, 1024, 8, 16, KvDtype::F16)
///         .with_grouping(LayerGrouping::PerLayer)
///         .with_head_shards(1024)
/// };
/// assert_eq!(1024 * 1024, MAX_LANES);
/// assert!(KvLayout::new(lanes(1024)).is_ok());
/// assert!(KvLayout::new(lanes(1025)).is_err());
/// ```
pub const MAX_LANES: u32 = 1 << 20;

/// A validated layout. Construct with [`KvLayout::new`].
///
/// ```
/// use kvslice_core::{KvDtype, KvLayout, LayerGrouping, LayoutSpec};
///
/// let layout = KvLayout::new(
///     LayoutSpec::new(32, 32, 8, 128, 16, KvDtype::F16)
///         .with_grouping(LayerGrouping::PerLayer)
///         .with_head_shards(2),
/// )?;
/// assert_eq!(layout.num_layer_groups(), 32);
/// assert_eq!(layout.gqa_ratio(), 4);
/// // K and V, 4 kv heads per shard, 16 tokens of 128 f16 values.
/// assert_eq!(layout.page_bytes(), 2 * 4 * 16 * 128 * 2);
/// # Ok::<(), kvslice_core::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    spec: LayoutSpec,
    layers_per_group: u32,
    num_groups: u32,
    /// kv heads in the largest shard; pages are sized for it.
    max_shard_heads: u32,
    /// Elements between consecutive kv heads of a part.
    head_stride: usize,
    /// Elements between K and V of one layer.
    part_stride: usize,
    /// Elements between consecutive layers of a group.
    layer_stride: usize,
    page_elems: usize,
    /// Where the scale section starts (bytes; `page_bytes` when unscaled).
    scales_start: usize,
    page_bytes: usize,
}

impl KvLayout {
    /// Validates `spec` and precomputes the page geometry.
    ///
    /// Errors with [`Error::InvalidLayout`] for zero sizes, query heads that
    /// are not a multiple of kv heads, a zero-sized layer group, more head
    /// shards than kv heads or more than [`MAX_LANES`] (layer group, head
    /// shard) lanes, and with [`Error::Overflow`] when a page would not fit
    /// in memory or a query row (`num_q_heads × head_dim`) not in a `u32`.
    pub fn new(spec: LayoutSpec) -> Result<Self> {
        let nonzero = [
            (spec.num_layers, "num_layers is zero"),
            (spec.num_q_heads, "num_q_heads is zero"),
            (spec.num_kv_heads, "num_kv_heads is zero"),
            (spec.head_dim, "head_dim is zero"),
            (spec.block_tokens, "block_tokens is zero"),
            (spec.head_shards, "head_shards is zero"),
        ];
        if let Some((_, why)) = nonzero.iter().find(|(v, _)| *v == 0) {
            return Err(Error::InvalidLayout(why));
        }
        if !spec.num_q_heads.is_multiple_of(spec.num_kv_heads) {
            return Err(Error::InvalidLayout(
                "num_q_heads is not a multiple of num_kv_heads",
            ));
        }
        if spec.head_shards > spec.num_kv_heads {
            return Err(Error::InvalidLayout("more head shards than kv heads"));
        }
        let layers_per_group = match spec.grouping {
            LayerGrouping::AllLayers => spec.num_layers,
            LayerGrouping::PerLayer => 1,
            LayerGrouping::Groups(0) => {
                return Err(Error::InvalidLayout("layer group size is zero"));
            }
            LayerGrouping::Groups(n) => n.min(spec.num_layers),
        };
        let num_groups = spec.num_layers.div_ceil(layers_per_group);
        let max_shard_heads = spec.num_kv_heads.div_ceil(spec.head_shards);
        // Widths and counts that callers hold in a u32.
        if spec.num_q_heads.checked_mul(spec.head_dim).is_none() {
            return Err(Error::Overflow("query row (num_q_heads × head_dim)"));
        }
        if num_groups
            .checked_mul(spec.head_shards)
            .is_none_or(|lanes| lanes > MAX_LANES)
        {
            return Err(Error::InvalidLayout(
                "more than MAX_LANES (layer group, head shard) lanes",
            ));
        }

        let mul = |a: usize, b: u32, what| a.checked_mul(b as usize).ok_or(Error::Overflow(what));
        let head_stride = mul(spec.block_tokens as usize, spec.head_dim, "head stride")?;
        let part_stride = mul(head_stride, max_shard_heads, "K/V stride")?;
        let layer_stride = mul(part_stride, 2, "layer stride")?;
        let page_elems = mul(layer_stride, layers_per_group, "page elements")?;
        let values_bytes = mul(page_elems, spec.dtype.size_bytes() as u32, "page bytes")?;
        let (scales_start, page_bytes) = if spec.dtype.is_scaled() {
            // One f32 per row of head_dim values, after the values.
            let start = values_bytes
                .checked_next_multiple_of(4)
                .ok_or(Error::Overflow("page bytes"))?;
            let scales = mul(page_elems / spec.head_dim as usize, 4, "page bytes")?;
            let total = start
                .checked_add(scales)
                .ok_or(Error::Overflow("page bytes"))?;
            (start, total)
        } else {
            (values_bytes, values_bytes)
        };
        if page_bytes > isize::MAX as usize {
            return Err(Error::Overflow("page bytes"));
        }
        Ok(Self {
            spec,
            layers_per_group,
            num_groups,
            max_shard_heads,
            head_stride,
            part_stride,
            layer_stride,
            page_elems,
            scales_start,
            page_bytes,
        })
    }

    /// The parameters this layout was built from.
    pub fn spec(&self) -> &LayoutSpec {
        &self.spec
    }
    /// Transformer layers.
    pub fn num_layers(&self) -> u32 {
        self.spec.num_layers
    }
    /// Query heads.
    pub fn num_q_heads(&self) -> u32 {
        self.spec.num_q_heads
    }
    /// Key/value heads.
    pub fn num_kv_heads(&self) -> u32 {
        self.spec.num_kv_heads
    }
    /// Query heads per kv head.
    pub fn gqa_ratio(&self) -> u32 {
        self.spec.num_q_heads / self.spec.num_kv_heads
    }
    /// Elements per head vector.
    pub fn head_dim(&self) -> u32 {
        self.spec.head_dim
    }
    /// Tokens per page.
    pub fn block_tokens(&self) -> u32 {
        self.spec.block_tokens
    }
    /// Storage dtype.
    pub fn dtype(&self) -> KvDtype {
        self.spec.dtype
    }
    /// Order of each head's keys inside a block.
    pub fn key_order(&self) -> KeyOrder {
        self.spec.key_order
    }
    /// Layers per page (the last group may hold fewer).
    pub fn layers_per_group(&self) -> u32 {
        self.layers_per_group
    }
    /// Number of layer groups, hence pages per block and shard.
    pub fn num_layer_groups(&self) -> u32 {
        self.num_groups
    }
    /// Number of head shards.
    pub fn num_head_shards(&self) -> u32 {
        self.spec.head_shards
    }
    /// Elements in one page.
    pub fn page_elems(&self) -> usize {
        self.page_elems
    }
    /// Bytes in one page (values, and scales for a scaled dtype).
    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    /// Byte range, inside a page, of the `block_tokens` f32 scales of one
    /// head's rows of `part` (little-endian, token order whatever the key
    /// order), or `None` for an unscaled dtype.
    ///
    /// ```
    /// use kvslice_core::{KvDtype, KvLayout, KvPart, LayoutSpec};
    ///
    /// // 1 layer, 2 kv heads of 128, blocks of 16 tokens, int8.
    /// let l = KvLayout::new(LayoutSpec::new(1, 8, 2, 128, 16, KvDtype::I8))?;
    /// let values = 2 * 2 * 16 * 128; // K and V, 2 heads, 16 tokens
    /// assert_eq!(l.page_bytes(), values + 2 * 2 * 16 * 4);
    /// assert_eq!(l.scale_region(KvPart::V, 0, 1)?, Some(values + 3 * 64..values + 4 * 64));
    /// // Half of an f16 page and 3% more: 1.94x the tokens in the same memory.
    /// let f16 = KvLayout::new(LayoutSpec::new(1, 8, 2, 128, 16, KvDtype::F16))?;
    /// assert_eq!(f16.page_bytes() * 1000 / l.page_bytes(), 1939);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn scale_region(
        &self,
        part: KvPart,
        layer_in_group: u32,
        head_in_shard: u32,
    ) -> Result<Option<Range<usize>>> {
        let region = self.head_region(part, layer_in_group, head_in_shard)?;
        if !self.spec.dtype.is_scaled() {
            return Ok(None);
        }
        let start = self.scales_start + 4 * (region.start / self.spec.head_dim as usize);
        Ok(Some(start..start + 4 * self.spec.block_tokens as usize))
    }

    /// The layer group holding `layer`, and the layer's index inside it.
    pub fn layer_group(&self, layer: u32) -> Result<(u32, u32)> {
        check_index("layer", layer as usize, self.spec.num_layers as usize)?;
        Ok((layer / self.layers_per_group, layer % self.layers_per_group))
    }

    /// The layers of group `group`.
    pub fn group_layers(&self, group: u32) -> Result<Range<u32>> {
        check_index("layer group", group as usize, self.num_groups as usize)?;
        let start = group * self.layers_per_group;
        Ok(start..(start + self.layers_per_group).min(self.spec.num_layers))
    }

    /// The kv and query heads that shard `shard` owns.
    pub fn head_shard(&self, shard: u32) -> Result<HeadShard> {
        HeadShard::new(self, shard)
    }

    /// Element range, inside a page, of one head's `block_tokens × head_dim`
    /// matrix of `part` for `layer_in_group` and `head_in_shard`.
    pub fn head_region(
        &self,
        part: KvPart,
        layer_in_group: u32,
        head_in_shard: u32,
    ) -> Result<Range<usize>> {
        check_index(
            "layer in group",
            layer_in_group as usize,
            self.layers_per_group as usize,
        )?;
        check_index(
            "kv head in shard",
            head_in_shard as usize,
            self.max_shard_heads as usize,
        )?;
        let part_offset = match part {
            KvPart::K => 0,
            KvPart::V => self.part_stride,
        };
        let start = layer_in_group as usize * self.layer_stride
            + part_offset
            + head_in_shard as usize * self.head_stride;
        Ok(start..start + self.head_stride)
    }

    /// Offset of element `dim` of token `slot` of a block inside one
    /// head's region of `part` ([`Self::head_region`]): `slot · head_dim +
    /// dim`, or `dim · block_tokens + slot` for dim-major keys. `slot` is
    /// below `block_tokens` and `dim` below `head_dim`.
    pub fn elem_offset(&self, part: KvPart, slot: usize, dim: usize) -> usize {
        debug_assert!(
            slot < self.spec.block_tokens as usize && dim < self.spec.head_dim as usize,
            "element {dim} of token {slot} is outside a block"
        );
        match (part, self.spec.key_order) {
            (KvPart::K, KeyOrder::DimMajor) => dim * self.spec.block_tokens as usize + slot,
            _ => slot * self.spec.head_dim as usize + dim,
        }
    }

    /// Whether a page of `other` holds the same values at the same bytes
    /// as a page of this layout: the same fingerprint and page size, however
    /// the specs spell it (a group of every layer is
    /// [`LayerGrouping::AllLayers`]). What a tier or spill sink must share
    /// with a store.
    ///
    /// ```
    /// use kvslice_core::{KeyOrder, KvDtype, KvLayout, LayerGrouping, LayoutSpec};
    ///
    /// let spec = LayoutSpec::new(2, 2, 2, 8, 4, KvDtype::F16);
    /// let all = KvLayout::new(spec)?;
    /// let two = KvLayout::new(spec.with_grouping(LayerGrouping::Groups(2)))?;
    /// let dim = KvLayout::new(spec.with_key_order(KeyOrder::DimMajor))?;
    /// assert!(all.same_pages(&two));
    /// assert!(!all.same_pages(&dim)); // the same size, another order
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn same_pages(&self, other: &KvLayout) -> bool {
        self.fingerprint_words() == other.fingerprint_words()
            && self.page_bytes() == other.page_bytes()
    }

    /// Every field that changes what a page holds, mixed into the root of
    /// every key chain so that pages of different layouts never share a key.
    pub fn fingerprint_words(&self) -> [u32; 9] {
        let s = &self.spec;
        [
            s.num_layers,
            s.num_q_heads,
            s.num_kv_heads,
            s.head_dim,
            s.block_tokens,
            s.dtype.tag() as u32,
            self.layers_per_group,
            s.head_shards,
            // Page format version: 1 is token-major keys, the format every
            // key had before dim-major keys existed (so those keys hold).
            match s.key_order {
                KeyOrder::TokenMajor => 1,
                KeyOrder::DimMajor => 2,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> LayoutSpec {
        LayoutSpec::new(6, 8, 4, 16, 5, KvDtype::Bf16)
    }

    #[test]
    fn rejects_bad_layouts() {
        let bad = [
            LayoutSpec {
                num_layers: 0,
                ..spec()
            },
            LayoutSpec {
                num_q_heads: 0,
                ..spec()
            },
            LayoutSpec {
                num_kv_heads: 0,
                ..spec()
            },
            LayoutSpec {
                head_dim: 0,
                ..spec()
            },
            LayoutSpec {
                block_tokens: 0,
                ..spec()
            },
            LayoutSpec {
                num_q_heads: 6,
                ..spec()
            },
            spec().with_head_shards(0),
            spec().with_head_shards(5),
            spec().with_grouping(LayerGrouping::Groups(0)),
        ];
        for s in bad {
            assert!(
                matches!(KvLayout::new(s), Err(Error::InvalidLayout(_))),
                "{s:?}"
            );
        }
    }

    #[test]
    fn page_size_overflow_is_an_error() {
        let huge = LayoutSpec::new(
            u32::MAX,
            u32::MAX,
            u32::MAX,
            u32::MAX,
            u32::MAX,
            KvDtype::F32,
        );
        assert!(matches!(KvLayout::new(huge), Err(Error::Overflow(_))));
        // 2^62 elements fit a usize, but 2^63 bytes exceed isize::MAX.
        let big = LayoutSpec::new(1 << 25, 1 << 12, 1 << 12, 1 << 12, 1 << 12, KvDtype::F16);
        assert!(matches!(
            KvLayout::new(big),
            Err(Error::Overflow("page bytes"))
        ));
        let ok = LayoutSpec::new(1 << 20, 1 << 12, 1 << 12, 1 << 12, 1 << 12, KvDtype::F16);
        assert_eq!(KvLayout::new(ok).unwrap().page_bytes(), 1 << 58);
        // Small pages whose query row or lane count a u32 cannot hold.
        let wide = LayoutSpec::new(1, 1 << 16, 1, 1 << 16, 1, KvDtype::F32);
        assert!(matches!(KvLayout::new(wide), Err(Error::Overflow(_))));
        let lanes = LayoutSpec::new(1 << 16, 1 << 16, 1 << 16, 1, 1, KvDtype::F32)
            .with_grouping(LayerGrouping::PerLayer)
            .with_head_shards(1 << 16);
        assert!(matches!(KvLayout::new(lanes), Err(Error::InvalidLayout(_))));
    }

    #[test]
    fn groups_cover_every_layer_once() {
        for grouping in [
            LayerGrouping::AllLayers,
            LayerGrouping::PerLayer,
            LayerGrouping::Groups(4),
            LayerGrouping::Groups(100),
        ] {
            let l = KvLayout::new(spec().with_grouping(grouping)).unwrap();
            let mut seen = [0u32; 6];
            for g in 0..l.num_layer_groups() {
                for layer in l.group_layers(g).unwrap() {
                    seen[layer as usize] += 1;
                    let (gg, i) = l.layer_group(layer).unwrap();
                    assert_eq!(gg, g);
                    assert_eq!(l.group_layers(g).unwrap().start + i, layer);
                }
            }
            assert_eq!(seen, [1; 6], "{grouping:?}");
            assert!(l.layer_group(6).is_err());
            assert!(l.group_layers(l.num_layer_groups()).is_err());
        }
    }

    #[test]
    fn head_regions_tile_the_page() {
        let l = KvLayout::new(
            spec()
                .with_grouping(LayerGrouping::Groups(4))
                .with_head_shards(3),
        )
        .unwrap();
        // 4 kv heads over 3 shards: the largest shard has 2.
        let mut covered = alloc::vec![0u8; l.page_elems()];
        for layer in 0..l.layers_per_group() {
            for part in [KvPart::K, KvPart::V] {
                for head in 0..2 {
                    for e in l.head_region(part, layer, head).unwrap() {
                        covered[e] += 1;
                    }
                }
            }
        }
        assert!(covered.iter().all(|&c| c == 1));
        assert_eq!(l.page_bytes(), l.page_elems() * 2);
        assert!(l.head_region(KvPart::K, 4, 0).is_err());
        assert!(l.head_region(KvPart::V, 0, 2).is_err());
    }
}
