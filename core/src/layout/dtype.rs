//! Storage element types for K/V and their conversion to and from f32.

use half::{bf16, f16};

use super::quant::{self, SCALED_LIMIT};
use crate::error::{Error, Result, check_len};

/// The element type K and V are stored in. Arithmetic is always f32.
///
/// The 8-bit types are *scaled*: each row (one token's `head_dim` values
/// of one kv head) is stored as codes and one f32 scale, kept in the
/// page's scale section ([`KvLayout::scale_region`](crate::KvLayout::scale_region)).
/// A row's scale is its largest magnitude over the largest code, so any
/// finite row fits, nothing saturates, and the rows of one head may differ
/// in magnitude by any factor (real keys have outlier channels and tokens).
/// Scaled rows are written with [`quantize_row`](Self::quantize_row) and
/// read with [`dequantize_row`](Self::dequantize_row).
///
/// ```
/// use kvslice_core::KvDtype;
///
/// let mut bytes = [0u8; 4];
/// KvDtype::F16.encode_row(&[1.5, -2.0], &mut bytes).unwrap();
/// let mut back = [0f32; 2];
/// KvDtype::F16.decode_row(&bytes, &mut back).unwrap();
/// assert_eq!(back, [1.5, -2.0]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16: the top half of an f32.
    Bf16,
    /// Signed 8-bit integers, `x ≈ q · scale`, `q` in −127..=127, one
    /// scale per row.
    I8,
    /// 8-bit floats E4M3 (OCP "e4m3fn": 4 exponent bits, 3 mantissa bits,
    /// largest 448, no infinities), `x ≈ f8 · scale`, one scale per row.
    F8E4M3,
}

impl KvDtype {
    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::I8 | KvDtype::F8E4M3 => 1,
        }
    }

    /// Whether rows carry a scale (the 8-bit types).
    ///
    /// ```
    /// use kvslice_core::KvDtype;
    ///
    /// assert!(KvDtype::I8.is_scaled() && !KvDtype::F16.is_scaled());
    /// ```
    pub const fn is_scaled(self) -> bool {
        matches!(self, KvDtype::I8 | KvDtype::F8E4M3)
    }

    /// Every dtype, for tests and command lines.
    pub const ALL: [KvDtype; 5] = [
        KvDtype::F32,
        KvDtype::F16,
        KvDtype::Bf16,
        KvDtype::I8,
        KvDtype::F8E4M3,
    ];

    /// A stable small number for hashing and serialisation.
    pub const fn tag(self) -> u8 {
        match self {
            KvDtype::F32 => 0,
            KvDtype::F16 => 1,
            KvDtype::Bf16 => 2,
            KvDtype::I8 => 3,
            KvDtype::F8E4M3 => 4,
        }
    }

    /// Rounds `x` to this dtype and back, as storing and loading it would
    /// (for a scaled type: as a row of its own).
    pub fn round_trip(self, x: f32) -> f32 {
        match self {
            KvDtype::F32 => x,
            KvDtype::F16 => f16::from_f32(x).to_f32(),
            KvDtype::Bf16 => bf16::from_f32(x).to_f32(),
            KvDtype::I8 | KvDtype::F8E4M3 => {
                let mut row = [x];
                self.round_trip_row(&mut row);
                row[0]
            }
        }
    }

    /// Rounds one row (a token's values of one kv head) to this dtype and
    /// back in place, as storing and loading it would.
    ///
    /// ```
    /// use kvslice_core::KvDtype;
    ///
    /// let mut row = [1.0f32, -0.5, 0.1];
    /// KvDtype::I8.round_trip_row(&mut row);
    /// // Scale 1/127: 0.1 becomes code 13.
    /// let scale = 1.0f32 / 127.0;
    /// assert_eq!(row, [127.0 * scale, -64.0 * scale, 13.0 * scale]);
    /// ```
    pub fn round_trip_row(self, row: &mut [f32]) {
        if !self.is_scaled() {
            row.iter_mut().for_each(|x| *x = self.round_trip(*x));
            return;
        }
        let mut codes = alloc::vec![0u8; row.len()];
        let scale = self.quantize_codes(row, &mut codes);
        self.dequantize_codes(&codes, scale, row);
    }

    fn quantize_codes(self, src: &[f32], codes: &mut [u8]) -> f32 {
        match self {
            KvDtype::I8 => quant::quantize_i8(src, codes),
            _ => quant::quantize_f8e4m3(src, codes),
        }
    }

    fn dequantize_codes(self, codes: &[u8], scale: f32, out: &mut [f32]) {
        for (o, &c) in out.iter_mut().zip(codes) {
            *o = scale
                * match self {
                    KvDtype::I8 => f32::from(c as i8),
                    _ => quant::f8e4m3_to_f32(c),
                };
        }
    }

    /// Stores one row of `src` in `bytes` (`src.len()` elements) and
    /// returns its scale: for a scaled type the row's codes and scale, for
    /// the others the encoded values ([`encode_row`](Self::encode_row))
    /// and 1. Values must be finite; scaled types store any finite row up
    /// to ±2^127 ([`fits`](Self::fits)), a row whose largest magnitude is
    /// below about 5·10^-36 as zeros with scale 0.
    ///
    /// ```
    /// use kvslice_core::KvDtype;
    ///
    /// let mut codes = [0u8; 3];
    /// let scale = KvDtype::F8E4M3.quantize_row(&[896.0, -1.0, 0.0], &mut codes)?;
    /// assert_eq!((scale, codes[0]), (2.0, 0x7E)); // 896 = 448 · 2
    /// let mut back = [0f32; 3];
    /// KvDtype::F8E4M3.dequantize_row(&codes, scale, &mut back)?;
    /// assert_eq!(back, [896.0, -1.0, 0.0]);
    /// # Ok::<(), kvslice_core::Error>(())
    /// ```
    pub fn quantize_row(self, src: &[f32], bytes: &mut [u8]) -> Result<f32> {
        if !self.is_scaled() {
            self.encode_row(src, bytes)?;
            return Ok(1.0);
        }
        check_len("encoded row bytes", src.len(), bytes.len())?;
        if src.iter().any(|x| !self.fits(*x)) {
            return Err(Error::InvalidValue(
                "a scaled row holds finite values up to 2^127",
            ));
        }
        Ok(self.quantize_codes(src, bytes))
    }

    /// Reads one row stored by [`quantize_row`](Self::quantize_row) with
    /// its `scale` into `out` (for unscaled types `scale` is ignored).
    pub fn dequantize_row(self, bytes: &[u8], scale: f32, out: &mut [f32]) -> Result<()> {
        if !self.is_scaled() {
            return self.decode_row(bytes, out);
        }
        check_len("encoded row bytes", out.len(), bytes.len())?;
        self.dequantize_codes(bytes, scale, out);
        Ok(())
    }

    /// Decodes little-endian elements from `bytes` into `out`.
    ///
    /// `bytes.len()` must be `out.len() * self.size_bytes()`. A scaled
    /// type needs its row's scale: [`dequantize_row`](Self::dequantize_row).
    pub fn decode_row(self, bytes: &[u8], out: &mut [f32]) -> Result<()> {
        self.unscaled()?;
        check_len(
            "encoded row bytes",
            out.len() * self.size_bytes(),
            bytes.len(),
        )?;
        match self {
            KvDtype::F32 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            KvDtype::F16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            KvDtype::Bf16 => {
                for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([c[0], c[1]]).to_f32();
                }
            }
            KvDtype::I8 | KvDtype::F8E4M3 => unreachable!("checked by unscaled()"),
        }
        Ok(())
    }

    /// Whether `x` is stored as a finite value: finite, and not so large
    /// that rounding to this dtype gives infinity (f16 above 65,519.99,
    /// bf16 near f32's largest values).
    ///
    /// ```
    /// use kvslice_core::KvDtype;
    ///
    /// assert!(KvDtype::F16.fits(65_504.0));
    /// assert!(!KvDtype::F16.fits(70_000.0));
    /// assert!(!KvDtype::Bf16.fits(f32::MAX));
    /// assert!(KvDtype::F32.fits(f32::MAX) && !KvDtype::F32.fits(f32::NAN));
    /// ```
    pub fn fits(self, x: f32) -> bool {
        match self {
            KvDtype::F32 => x.is_finite(),
            KvDtype::F16 => half::f16::from_f32(x).is_finite(),
            KvDtype::Bf16 => half::bf16::from_f32(x).is_finite(),
            KvDtype::I8 | KvDtype::F8E4M3 => x.abs() <= SCALED_LIMIT,
        }
    }

    fn unscaled(self) -> Result<()> {
        if self.is_scaled() {
            return Err(Error::DtypeMismatch {
                what: "an 8-bit dtype's rows carry a scale: use quantize_row/dequantize_row",
            });
        }
        Ok(())
    }

    /// The dtype's name on command lines and in reports: `f32`, `f16`,
    /// `bf16`, `int8`, `fp8-e4m3`.
    pub const fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::I8 => "int8",
            KvDtype::F8E4M3 => "fp8-e4m3",
        }
    }

    /// Encodes `src` into little-endian elements in `bytes`, rounding to
    /// nearest even.
    ///
    /// `bytes.len()` must be `src.len() * self.size_bytes()`. A scaled
    /// type makes a scale too: [`quantize_row`](Self::quantize_row).
    pub fn encode_row(self, src: &[f32], bytes: &mut [u8]) -> Result<()> {
        self.unscaled()?;
        check_len(
            "encoded row bytes",
            src.len() * self.size_bytes(),
            bytes.len(),
        )?;
        match self {
            KvDtype::F32 => {
                for (x, c) in src.iter().zip(bytes.chunks_exact_mut(4)) {
                    c.copy_from_slice(&x.to_le_bytes());
                }
            }
            KvDtype::F16 => {
                for (x, c) in src.iter().zip(bytes.chunks_exact_mut(2)) {
                    c.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
                }
            }
            KvDtype::Bf16 => {
                for (x, c) in src.iter().zip(bytes.chunks_exact_mut(2)) {
                    c.copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
                }
            }
            KvDtype::I8 | KvDtype::F8E4M3 => unreachable!("checked by unscaled()"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_matches_encode_decode() {
        let xs = [0.1f32, -3.75, 1e-3, 65504.0, 1234.567, -0.0];
        for dt in KvDtype::ALL.into_iter().filter(|d| !d.is_scaled()) {
            let mut bytes = [0u8; 24];
            let bytes = &mut bytes[..xs.len() * dt.size_bytes()];
            dt.encode_row(&xs, bytes).unwrap();
            let mut back = [0f32; 6];
            dt.decode_row(bytes, &mut back).unwrap();
            for (x, b) in xs.iter().zip(back) {
                assert_eq!(dt.round_trip(*x).to_bits(), b.to_bits(), "{dt:?} {x}");
            }
        }
        assert_ne!(KvDtype::F16.round_trip(0.1), 0.1);
        assert_ne!(KvDtype::Bf16.round_trip(0.1), KvDtype::F16.round_trip(0.1));
    }

    #[test]
    fn scaled_rows_round_trip_within_half_a_step() {
        let row: alloc::vec::Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
        for (dt, rel_step) in [(KvDtype::I8, 1.0 / 127.0), (KvDtype::F8E4M3, 1.0 / 16.0)] {
            let mut codes = [0u8; 64];
            let scale = dt.quantize_row(&row, &mut codes).unwrap();
            let mut back = [0f32; 64];
            dt.dequantize_row(&codes, scale, &mut back).unwrap();
            let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            for (x, b) in row.iter().zip(back) {
                // int8: half a step of amax/127; E4M3: half a mantissa step
                // (1/8 relative) of the value, or of the subnormal step.
                let bound = match dt {
                    KvDtype::I8 => 0.5 * amax * rel_step,
                    _ => (x.abs() * rel_step).max(amax / 448.0 * 2f32.powi(-10)),
                };
                assert!((x - b).abs() <= bound * 1.0001, "{dt:?} {x} -> {b}");
            }
            let mut again = row.clone();
            dt.round_trip_row(&mut again);
            assert_eq!(again, back);
            assert!(dt.encode_row(&row, &mut codes).is_err(), "needs a scale");
            assert!(dt.quantize_row(&[f32::MAX], &mut codes[..1]).is_err());
        }
        assert_eq!(
            KvDtype::F16.quantize_row(&[1.5], &mut [0u8; 2]).unwrap(),
            1.0
        );
    }

    #[test]
    fn wrong_buffer_length_is_an_error() {
        let mut out = [0f32; 3];
        assert!(KvDtype::F16.decode_row(&[0u8; 5], &mut out).is_err());
        assert!(KvDtype::F32.encode_row(&out, &mut [0u8; 11]).is_err());
    }
}
