//! Storage element types for K/V and their conversion to and from f32.

use half::{bf16, f16};

use crate::error::{Result, check_len};

/// The element type K and V are stored in. Arithmetic is always f32.
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
}

impl KvDtype {
    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
        }
    }

    /// A stable small number for hashing and serialisation.
    pub const fn tag(self) -> u8 {
        match self {
            KvDtype::F32 => 0,
            KvDtype::F16 => 1,
            KvDtype::Bf16 => 2,
        }
    }

    /// Rounds `x` to this dtype and back, as storing and loading it would.
    pub fn round_trip(self, x: f32) -> f32 {
        match self {
            KvDtype::F32 => x,
            KvDtype::F16 => f16::from_f32(x).to_f32(),
            KvDtype::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }

    /// Decodes little-endian elements from `bytes` into `out`.
    ///
    /// `bytes.len()` must be `out.len() * self.size_bytes()`.
    pub fn decode_row(self, bytes: &[u8], out: &mut [f32]) -> Result<()> {
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
        }
    }

    /// Encodes `src` into little-endian elements in `bytes`, rounding to
    /// nearest even.
    ///
    /// `bytes.len()` must be `src.len() * self.size_bytes()`.
    pub fn encode_row(self, src: &[f32], bytes: &mut [u8]) -> Result<()> {
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
        for dt in [KvDtype::F32, KvDtype::F16, KvDtype::Bf16] {
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
    fn wrong_buffer_length_is_an_error() {
        let mut out = [0f32; 3];
        assert!(KvDtype::F16.decode_row(&[0u8; 5], &mut out).is_err());
        assert!(KvDtype::F32.encode_row(&out, &mut [0u8; 11]).is_err());
    }
}
