//! The serving loop: output with prefix reuse equals output recomputed from
//! scratch (same generated tokens, logits within the engine tests'
//! tolerance), on the CPU, reference and wgpu engines, over f16, int8 and
//! fp8 pages.

use kvslice_benches::serve::{ServeConfig, serve};
use kvslice_core::KvDtype;

#[test]
fn reuse_matches_recompute_on_every_engine() {
    for kv_dtype in [KvDtype::F16, KvDtype::I8, KvDtype::F8E4M3] {
        reuse_matches_recompute_with(kv_dtype);
    }
}

/// The CPU and reference engines over K/V stored as `kv_dtype`.
fn reuse_matches_recompute_with(kv_dtype: KvDtype) {
    let cfg = ServeConfig {
        requests: 9,
        system_prompts: 2,
        system_tokens: 48,
        max_suffix_tokens: 20,
        decode_steps: 4,
        capacity_pages: 64,
        seed: 3,
        kv_dtype,
    };
    for report in [
        serve(&kvslice_cpu::CpuEngine::new(), "cpu", &cfg).unwrap(),
        serve(&kvslice_core::ReferenceEngine, "reference", &cfg).unwrap(),
    ] {
        assert!(report.tokens_match, "{report:?}");
        assert!(report.max_logit_rel_diff <= 1e-3, "{report:?}");
        // Requests after the first of each system prompt reuse its blocks.
        assert!(report.reused_tokens >= (9 - 2) * 48, "{report:?}");
        assert!(report.block_hit_ratio > 0.5, "{report:?}");
    }
}

/// The wgpu engine over host pages, for f16 and the 8-bit types.
#[cfg(feature = "wgpu")]
#[test]
fn reuse_matches_recompute_on_the_wgpu_engine() {
    let Some(engine) = kvslice_wgpu::testing::engine_or_skip("serve_wgpu") else {
        return;
    };
    let engine = kvslice_wgpu::StagingEngine::new(engine);
    for kv_dtype in [KvDtype::F16, KvDtype::I8, KvDtype::F8E4M3] {
        let cfg = ServeConfig {
            requests: 5,
            system_prompts: 2,
            system_tokens: 48, // three whole 16-token blocks
            max_suffix_tokens: 12,
            decode_steps: 3,
            capacity_pages: 48,
            seed: 4,
            kv_dtype,
        };
        let report = serve(&engine, "wgpu", &cfg).unwrap();
        assert!(report.tokens_match, "{kv_dtype:?}: {report:?}");
        assert!(
            report.max_logit_rel_diff <= 1e-3,
            "{kv_dtype:?}: {report:?}"
        );
        assert!(
            report.reused_tokens >= (5 - 2) * 48,
            "{kv_dtype:?}: {report:?}"
        );
    }
}

#[test]
fn a_cache_smaller_than_a_request_is_an_error() {
    let cfg = ServeConfig {
        capacity_pages: 2,
        ..ServeConfig::default()
    };
    assert!(serve(&kvslice_core::ReferenceEngine, "reference", &cfg).is_err());
}
