//! WGSL generation and the pipeline cache.
//!
//! The kernels in `shaders/` are written once; a generated prelude fixes
//! what varies per layout so the compiler sees constants: the head
//! dimension, the rows per tile, the dtype's load (or store) functions, and
//! one binding per pool chunk with a `switch` that picks the chunk.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use kvslice_core::{KvDtype, Result};

use crate::gpu::Gpu;
use crate::plan::KEY_TILE;

const COMMON: &str = include_str!("shaders/common.wgsl");
const ATTEND: &str = include_str!("shaders/attend.wgsl");
const ATTEND_SG: &str = include_str!("shaders/attend_sg.wgsl");
const MERGE: &str = include_str!("shaders/merge.wgsl");
const WRITE_KV: &str = include_str!("shaders/write_kv.wgsl");
const APPEND_SCALED: &str = include_str!("shaders/append_scaled.wgsl");

/// Threads per workgroup in every kernel (`WG` in the shaders).
pub(crate) const WORKGROUP_SIZE: u32 = 64;

/// Which kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// Pass 1, one key per thread (any adapter).
    Attend,
    /// Pass 1, lane groups per key with subgroup shuffles.
    AttendSg,
    Merge,
    WriteKv,
}

/// Everything a generated shader depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ShaderKey {
    pub kernel: Kernel,
    pub dtype: KvDtype,
    pub head_dim: u32,
    /// Rows per tile (attend, merge).
    pub rows: u32,
    /// Pool chunks bound (attend, write).
    pub chunks: u32,
    /// f16 K/V read as `f16` (SHADER_F16) rather than unpacked from `u32`.
    pub native_f16: bool,
    /// Lanes per key of [`Kernel::AttendSg`] (0 for the other kernels).
    pub group: u32,
}

/// First binding of the pool chunks in each kernel.
pub(crate) fn first_pool_binding(kernel: Kernel) -> u32 {
    match kernel {
        Kernel::Attend | Kernel::AttendSg => 5,
        Kernel::Merge => u32::MAX,
        Kernel::WriteKv => 4,
    }
}

/// The complete WGSL source for `key`.
pub(crate) fn source(key: &ShaderKey) -> String {
    let hd = key.head_dim;
    let mut s = String::new();
    let native = key.native_f16 && key.dtype == KvDtype::F16 && key.kernel == Kernel::Attend;
    if native {
        s.push_str("enable f16;\n");
    }
    let pairs_per_thread = hd.div_ceil(2).div_ceil(KEY_TILE).max(1);
    let _ = writeln!(
        s,
        "const HD: u32 = {hd}u;\nconst R: u32 = {}u;\nconst PPT: u32 = {pairs_per_thread}u;\n\
         const SCALED: bool = {};",
        key.rows,
        key.dtype.is_scaled()
    );
    s.push_str(COMMON);
    match key.kernel {
        Kernel::Attend => {
            let elem = if native { "f16" } else { "u32" };
            pool_bindings(
                &mut s,
                key,
                &format!("var<storage, read> pool{{i}}: array<{elem}>"),
            );
            if native {
                chunk_switch(
                    &mut s,
                    key.chunks,
                    "fn ld(c: u32, e: u32) -> f32",
                    "return f32(pool{i}[e]);",
                );
                s.push_str("fn ld2(c: u32, e: u32) -> vec2<f32> { return vec2<f32>(ld(c, e), ld(c, e + 1u)); }\n");
                s.push_str("fn row_scale(c: u32, w: u32) -> f32 { return 1.0; }\n");
            } else {
                chunk_switch(
                    &mut s,
                    key.chunks,
                    "fn word(c: u32, i: u32) -> u32",
                    "return pool{i}[i];",
                );
                s.push_str(&loads(key.dtype, hd));
            }
            s.push_str(ATTEND);
        }
        Kernel::AttendSg => {
            pool_bindings(&mut s, key, "var<storage, read> pool{i}: array<vec4<u32>>");
            chunk_switch(
                &mut s,
                key.chunks,
                "fn quad(c: u32, i: u32) -> vec4<u32>",
                "return pool{i}[i];",
            );
            lane_group_prelude(&mut s, key);
            s.push_str(ATTEND_SG);
        }
        Kernel::Merge => s.push_str(MERGE),
        Kernel::WriteKv if key.dtype.is_scaled() => {
            pool_bindings(
                &mut s,
                key,
                "var<storage, read_write> pool{i}: array<atomic<u32>>",
            );
            // Four codes share a word, possibly of two rows (two threads):
            // clear and set only our byte, atomically.
            chunk_switch(
                &mut s,
                key.chunks,
                "fn put_byte(c: u32, e: u32, code: u32)",
                "let sh = (e & 3u) * 8u; \
                 atomicAnd(&pool{i}[e >> 2u], ~(0xffu << sh)); \
                 atomicOr(&pool{i}[e >> 2u], code << sh);",
            );
            chunk_switch(
                &mut s,
                key.chunks,
                "fn put_word(c: u32, w: u32, bits: u32)",
                "atomicStore(&pool{i}[w], bits);",
            );
            let (max_code, code) = match key.dtype {
                KvDtype::I8 => (kvslice_core::I8_MAX, "i8_code"),
                _ => (kvslice_core::F8E4M3_MAX, "e4m3_code"),
            };
            let _ = writeln!(
                s,
                "const MAX_CODE: f32 = {max_code:?};\nconst ZERO_BELOW: f32 = {:e};\n\
                 fn code(y: f32) -> u32 {{ return {code}(y); }}",
                kvslice_core::SCALED_ZERO_BELOW
            );
            s.push_str(APPEND_SCALED);
        }
        Kernel::WriteKv => {
            pool_bindings(
                &mut s,
                key,
                "var<storage, read_write> pool{i}: array<atomic<u32>>",
            );
            let body = match key.dtype {
                KvDtype::F32 => "atomicStore(&pool{i}[e], bitcast<u32>(x));",
                // Two threads may own the two halves of one word: clear and
                // set only our half, atomically, so neither loses the other.
                KvDtype::F16 | KvDtype::Bf16 => {
                    "let sh = (e & 1u) * 16u; \
                     atomicAnd(&pool{i}[e >> 1u], ~(0xffffu << sh)); \
                     atomicOr(&pool{i}[e >> 1u], bits(x) << sh);"
                }
                KvDtype::I8 | KvDtype::F8E4M3 => unreachable!("the arm above"),
            };
            match key.dtype {
                KvDtype::F16 => s.push_str("fn bits(x: f32) -> u32 { return f16_bits(x); }\n"),
                KvDtype::Bf16 => s.push_str("fn bits(x: f32) -> u32 { return bf16_bits(x); }\n"),
                _ => {}
            }
            chunk_switch(&mut s, key.chunks, "fn put(c: u32, e: u32, x: f32)", body);
            s.push_str(WRITE_KV);
        }
    }
    s
}

fn pool_bindings(s: &mut String, key: &ShaderKey, decl: &str) {
    let first = first_pool_binding(key.kernel);
    for i in 0..key.chunks {
        let _ = writeln!(
            s,
            "@group(0) @binding({}) {};",
            first + i,
            decl.replace("{i}", &i.to_string())
        );
    }
}

/// `signature { switch c { case i: { body(i) } ... default: { body(0) } } }`
fn chunk_switch(s: &mut String, chunks: u32, signature: &str, body: &str) {
    let _ = writeln!(s, "{signature} {{\n    switch c {{");
    for i in 1..chunks {
        let _ = writeln!(
            s,
            "        case {i}u: {{ {} }}",
            body.replace("{i}", &i.to_string())
        );
    }
    let _ = writeln!(
        s,
        "        default: {{ {} }}\n    }}\n}}",
        body.replace("{i}", "0")
    );
}

/// `ld(c, e)` (element `e` of chunk `c`), `ld2` (elements `e`, `e + 1`)
/// and `row_scale(c, w)` (the f32 at word `w`; 1 for unscaled types) for
/// K/V stored as `u32` words.
fn loads(dtype: KvDtype, head_dim: u32) -> String {
    // Every row starts at an even element when the head dimension is even
    // (pages, layers, heads and rows are all whole rows), so a pair of
    // 16-bit elements is one word.
    let aligned = head_dim.is_multiple_of(2);
    let pair =
        "fn ld2(c: u32, e: u32) -> vec2<f32> { return vec2<f32>(ld(c, e), ld(c, e + 1u)); }\n";
    let unscaled = "fn row_scale(c: u32, w: u32) -> f32 { return 1.0; }\n";
    let byte = "fn byte(c: u32, e: u32) -> u32 { return (word(c, e >> 2u) >> ((e & 3u) * 8u)) & 0xffu; }\n\
                fn row_scale(c: u32, w: u32) -> f32 { return bitcast<f32>(word(c, w)); }\n";
    match (dtype, aligned) {
        (KvDtype::F32, _) => {
            format!(
                "fn ld(c: u32, e: u32) -> f32 {{ return bitcast<f32>(word(c, e)); }}\n{pair}{unscaled}"
            )
        }
        (KvDtype::F16, true) => format!(
            "fn ld(c: u32, e: u32) -> f32 {{ return unpack2x16float(word(c, e >> 1u))[e & 1u]; }}\n\
             fn ld2(c: u32, e: u32) -> vec2<f32> {{ return unpack2x16float(word(c, e >> 1u)); }}\n{unscaled}"
        ),
        (KvDtype::F16, false) => format!(
            "fn ld(c: u32, e: u32) -> f32 {{ return unpack2x16float(word(c, e >> 1u))[e & 1u]; }}\n{pair}{unscaled}"
        ),
        // bf16 is the top half of an f32: shift it into place.
        (KvDtype::Bf16, true) => format!(
            "fn ld(c: u32, e: u32) -> f32 {{ return bitcast<f32>(((word(c, e >> 1u) >> ((e & 1u) * 16u)) & 0xffffu) << 16u); }}\n\
             fn ld2(c: u32, e: u32) -> vec2<f32> {{ let w = word(c, e >> 1u); return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u)); }}\n{unscaled}"
        ),
        (KvDtype::Bf16, false) => format!(
            "fn ld(c: u32, e: u32) -> f32 {{ return bitcast<f32>(((word(c, e >> 1u) >> ((e & 1u) * 16u)) & 0xffffu) << 16u); }}\n{pair}{unscaled}"
        ),
        // Codes; the row's scale is applied by the kernel.
        (KvDtype::I8, _) => format!(
            "{byte}fn ld(c: u32, e: u32) -> f32 {{ return f32(bitcast<i32>(byte(c, e) << 24u) >> 24u); }}\n{pair}"
        ),
        // E4M3 is the f16 with the same sign, exponent and mantissa fields,
        // over 256 (the two exponent biases differ by 8).
        (KvDtype::F8E4M3, _) => format!(
            "{byte}fn ld(c: u32, e: u32) -> f32 {{ let b = byte(c, e); \
             return unpack2x16float(((b & 0x80u) << 8u) | ((b & 0x7fu) << 7u)).x * 256.0; }}\n{pair}"
        ),
    }
}

/// The subgroup kernel's constants and its per-key arithmetic, written out
/// straight: every array index is a literal, so the compiler keeps queries,
/// keys, values and accumulators in registers (a loop counter as an index
/// can make a driver keep the array in memory and gather from it).
fn lane_group_prelude(s: &mut String, key: &ShaderKey) {
    let (g, hd, r) = (key.group, key.head_dim, key.rows);
    let dpl = hd / g;
    let q4 = dpl / 4;
    let vw = 16 / key.dtype.size_bytes() as u32;
    let _ = writeln!(
        s,
        "const G: u32 = {g}u;\nconst NG: u32 = {}u;\nconst DPL: u32 = {dpl}u;\n\
         const VW: u32 = {vw}u;\nconst Q4: u32 = {q4}u;\nconst RQ: u32 = {}u;",
        WORKGROUP_SIZE / g,
        r * q4
    );
    s.push_str(
        "struct State {\n    m: array<f32, R>,\n    l: array<f32, R>,\n    acc: array<vec4<f32>, RQ>,\n}\n",
    );

    if key.dtype == KvDtype::F8E4M3 {
        // The two E4M3 codes in the low 16 bits of `w`, decoded.
        s.push_str(
            "fn e4m3_pair(w: u32) -> vec2<f32> {\n    \
             let h = ((w & 0x80u) << 8u) | ((w & 0x7fu) << 7u) | ((w & 0x8000u) << 16u) | ((w & 0x7f00u) << 15u);\n    \
             return unpack2x16float(h) * 256.0;\n}\n",
        );
    }
    // load_dims(c, e): DPL elements from element e (a multiple of VW) of
    // chunk c, as Q4 vec4s, one 16-byte load per VW elements.
    s.push_str("fn load_dims(c: u32, e: u32) -> array<vec4<f32>, Q4> {\n    var x: array<vec4<f32>, Q4>;\n    let at = e / VW;\n");
    for i in 0..dpl / vw {
        let _ = writeln!(s, "    let w{i} = quad(c, at + {i}u);");
        match key.dtype {
            KvDtype::F32 => {
                let _ = writeln!(s, "    x[{i}] = bitcast<vec4<f32>>(w{i});");
            }
            KvDtype::F16 => {
                let _ = writeln!(
                    s,
                    "    x[{}] = vec4<f32>(unpack2x16float(w{i}.x), unpack2x16float(w{i}.y));\n    \
                     x[{}] = vec4<f32>(unpack2x16float(w{i}.z), unpack2x16float(w{i}.w));",
                    2 * i,
                    2 * i + 1
                );
            }
            // bf16 is the top half of an f32; the low half of a word is the
            // earlier element.
            KvDtype::Bf16 => {
                let _ = writeln!(
                    s,
                    "    let lo{i} = bitcast<vec4<f32>>(w{i} << vec4<u32>(16u));\n    \
                     let hi{i} = bitcast<vec4<f32>>(w{i} & vec4<u32>(0xffff0000u));\n    \
                     x[{}] = vec4<f32>(lo{i}.x, hi{i}.x, lo{i}.y, hi{i}.y);\n    \
                     x[{}] = vec4<f32>(lo{i}.z, hi{i}.z, lo{i}.w, hi{i}.w);",
                    2 * i,
                    2 * i + 1
                );
            }
            // Codes, four per word, little-endian: sign-extended for int8;
            // for E4M3, two at a time become the f16s with the same fields,
            // over 256.
            KvDtype::I8 => {
                for (k, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    let _ = writeln!(
                        s,
                        "    x[{}] = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w{i}.{comp}) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));",
                        4 * i + k as u32
                    );
                }
            }
            KvDtype::F8E4M3 => {
                for (k, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                    let _ = writeln!(
                        s,
                        "    x[{}] = vec4<f32>(e4m3_pair(w{i}.{comp}), e4m3_pair(w{i}.{comp} >> 16u));",
                        4 * i + k as u32
                    );
                }
            }
        }
    }
    s.push_str("    return x;\n}\n");
    if key.dtype.is_scaled() {
        s.push_str("fn row_scale(c: u32, w: u32) -> f32 { return bitcast<f32>(quad(c, w >> 2u)[w & 3u]); }\n");
    } else {
        s.push_str("fn row_scale(c: u32, w: u32) -> f32 { return 1.0; }\n");
    }

    // scores(q, k): each row's partial dot product over this lane's dims,
    // summed over the lane group by a butterfly of shuffles.
    s.push_str("fn scores(q: array<vec4<f32>, RQ>, k: array<vec4<f32>, Q4>, ks: f32) -> array<f32, R> {\n    var s: array<f32, R>;\n");
    for row in 0..r {
        let terms: Vec<String> = (0..q4)
            .map(|j| format!("dot(q[{}], k[{j}])", row * q4 + j))
            .collect();
        let _ = writeln!(s, "    s[{row}] = ({}) * ks;", terms.join(" + "));
    }
    let mut off = g / 2;
    while off > 0 {
        for row in 0..r {
            let _ = writeln!(s, "    s[{row}] += subgroupShuffleXor(s[{row}], {off}u);");
        }
        off /= 2;
    }
    s.push_str("    return s;\n}\n");

    // visible(key, ok, at, live): which rows see `key` (bottom-right
    // causal mask and window); `at[r]` is row r's last visible key.
    s.push_str(
        "fn visible(key: u32, ok: bool, at: array<u32, R>, live: array<bool, R>) -> array<bool, R> {\n    var v: array<bool, R>;\n",
    );
    for row in 0..r {
        // `at - key` wraps when key > at, which the causal test rejects.
        let _ = writeln!(
            s,
            "    v[{row}] = ok && live[{row}] && key <= at[{row}] && at[{row}] - key < params.window;"
        );
    }
    s.push_str("    return v;\n}\n");

    // advance(st, s, v, vis): the online softmax over one more key.
    s.push_str(
        "fn advance(st: State, s: array<f32, R>, v: array<vec4<f32>, Q4>, vs: f32, vis: array<bool, R>) -> State {\n    var o: State;\n",
    );
    for row in 0..r {
        let _ = writeln!(
            s,
            "    let sc{row} = select(NEG, s[{row}], vis[{row}]);\n    \
             let mx{row} = max(st.m[{row}], sc{row});\n    \
             let a{row} = exp(st.m[{row}] - mx{row});\n    \
             let p{row} = select(0.0, exp(sc{row} - mx{row}), vis[{row}]);\n    \
             let pv{row} = p{row} * vs;\n    \
             o.m[{row}] = mx{row};\n    \
             o.l[{row}] = st.l[{row}] * a{row} + p{row};"
        );
        for j in 0..q4 {
            let i = row * q4 + j;
            let _ = writeln!(
                s,
                "    o.acc[{i}] = st.acc[{i}] * a{row} + pv{row} * v[{j}];"
            );
        }
    }
    s.push_str("    return o;\n}\n");
}

/// Compiled pipelines, built on first use.
#[derive(Debug, Default)]
pub(crate) struct Pipelines {
    cache: Mutex<HashMap<ShaderKey, Arc<wgpu::ComputePipeline>>>,
}

impl Pipelines {
    /// The pipeline for `key`, compiling it (inside error scopes, so a
    /// shader the driver rejects is a typed validation error) if needed.
    pub(crate) fn get(&self, gpu: &Gpu, key: ShaderKey) -> Result<Arc<wgpu::ComputePipeline>> {
        if let Some(p) = self.lock().get(&key) {
            return Ok(Arc::clone(p));
        }
        let src = source(&key);
        let pipeline = Arc::new(compile(gpu, &format!("{key:?}"), &src)?);
        self.lock().insert(key, Arc::clone(&pipeline));
        Ok(pipeline)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ShaderKey, Arc<wgpu::ComputePipeline>>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Compiles WGSL `src` with entry point `main`.
pub(crate) fn compile(gpu: &Gpu, label: &str, src: &str) -> Result<wgpu::ComputePipeline> {
    gpu.scoped(|| {
        let module = gpu
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(label),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        gpu.device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(label),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvslice_core::{DeviceFailure, Error};

    /// A shader the device rejects is a typed validation error, not a panic.
    #[test]
    fn a_rejected_shader_is_a_validation_error() {
        let Some(engine) = crate::testing::engine_or_skip("rejected_shader") else {
            return;
        };
        let gpu = engine.gpu();
        let bad = "@compute @workgroup_size(1) fn main() { let x: u32 = 1.5; }";
        let err = compile(gpu, "bad", bad).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Device {
                    kind: DeviceFailure::Validation,
                    ..
                }
            ),
            "{err}"
        );
        // The device is still usable afterwards.
        let good = "@compute @workgroup_size(1) fn main() {}";
        compile(gpu, "good", good).unwrap();
    }

    /// Every generated variant parses and validates with naga (the same
    /// front end wgpu runs), without needing an adapter.
    #[test]
    fn every_variant_validates() {
        // (head_dim, rows, chunks, native_f16, lanes per key)
        let plain = [
            (128, 16, 1, false, 0),
            (7, 1, 3, false, 0),
            (64, 4, 2, true, 0),
            (1, 2, 1, true, 0),
        ];
        let lane_groups = [
            (128, 4, 1, false, 8),
            (8, 1, 3, false, 1),
            (64, 4, 2, false, 2),
            (128, 2, 1, false, 16),
        ];
        for kernel in [
            Kernel::Attend,
            Kernel::AttendSg,
            Kernel::Merge,
            Kernel::WriteKv,
        ] {
            for dtype in KvDtype::ALL {
                let variants = if kernel == Kernel::AttendSg {
                    &lane_groups
                } else {
                    &plain
                };
                for &(head_dim, rows, chunks, native_f16, group) in variants {
                    let vw = 16 / dtype.size_bytes() as u32;
                    if group > 0 && (head_dim / group) % vw != 0 {
                        continue; // not a layout the lane-group kernel takes
                    }
                    let key = ShaderKey {
                        kernel,
                        dtype,
                        head_dim,
                        rows,
                        chunks,
                        native_f16,
                        group,
                    };
                    let src = source(&key);
                    let module = naga::front::wgsl::parse_str(&src)
                        .unwrap_or_else(|e| panic!("{key:?}: {}\n{src}", e.emit_to_string(&src)));
                    naga::valid::Validator::new(
                        naga::valid::ValidationFlags::all(),
                        naga::valid::Capabilities::all(),
                    )
                    .validate(&module)
                    .unwrap_or_else(|e| panic!("{key:?}: {}\n{src}", e.emit_to_string(&src)));
                }
            }
        }
    }
}
