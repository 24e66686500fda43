//! The engines-agree cases (`kvslice_core::testkit::edge_cases`) through
//! the wgpu engine, on device pages and through the staging wrapper over
//! host pages, against the reference engine: the same error, or outputs
//! within tolerance.

use kvslice_core::testkit::edge_cases;
use kvslice_core::{PageBuf, ReferenceEngine};
use kvslice_wgpu::StagingEngine;

#[test]
fn wgpu_agrees_with_the_reference_on_edge_cases() {
    let Some(e) =
        kvslice_wgpu::testing::engine_or_skip("wgpu_agrees_with_the_reference_on_edge_cases")
    else {
        return;
    };
    let cases = edge_cases(0x5eed, 120);
    let staging = StagingEngine::new(kvslice_wgpu::WgpuEngine::new().unwrap());
    for case in &cases {
        let mut host = PageBuf::new(case.layout, case.pages).unwrap();
        let want = case.run(&ReferenceEngine, &mut host);
        let mut host = PageBuf::new(case.layout, case.pages).unwrap();
        let got = case.run(&staging, &mut host);
        assert!(
            case.agrees(&got, &want, 2e-3),
            "{} (staging): {got:?} vs {want:?}",
            case.name
        );
        let fresh = PageBuf::new(case.layout, case.pages).unwrap();
        let mut device = e.upload(&fresh).unwrap();
        let got = case.run(&e, &mut device);
        assert!(
            case.agrees(&got, &want, 2e-3),
            "{} (device): {got:?} vs {want:?}",
            case.name
        );
    }
}
