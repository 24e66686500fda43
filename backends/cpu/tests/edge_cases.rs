//! The engines-agree cases (`kvslice_core::testkit::edge_cases`) through
//! every CPU kernel set this machine (or the emulator CI runs it under)
//! has, against the reference engine: the same error, or outputs within
//! tolerance. Builder arguments at their extremes are clamped, never an
//! overflow.

use kvslice_core::testkit::{Outcome, edge_cases};
use kvslice_core::{PageBuf, ReferenceEngine};
use kvslice_cpu::{BUILDER_LIMIT, CpuEngine, Kernels};

#[test]
fn every_kernel_set_agrees_with_the_reference_on_edge_cases() {
    let cases = edge_cases(0x5eed, 300);
    let mut sets: Vec<Kernels> = Kernels::supported();
    sets.push(Kernels::scalar());
    let (mut errors, mut outputs) = (0, 0);
    for case in &cases {
        let mut pages = PageBuf::new(case.layout, case.pages).unwrap();
        let want = case.run(&ReferenceEngine, &mut pages);
        match &want {
            Outcome::Output(o) => {
                assert!(o.iter().all(|x| x.is_finite()), "{}: {o:?}", case.name);
                outputs += 1;
            }
            _ => errors += 1,
        }
        for k in &sets {
            for engine in [
                CpuEngine::new().with_kernels(*k),
                CpuEngine::new()
                    .with_kernels(*k)
                    .with_threads(1)
                    .with_span_keys(0),
                CpuEngine::new()
                    .with_kernels(*k)
                    .with_chunk_pages(usize::MAX)
                    .with_span_keys(usize::MAX)
                    .with_query_tile_rows(usize::MAX),
                // Threads at their extreme, chunks sized from them:
                // clamped, not overflowed (2^60 threads once wrapped the
                // chunk count to zero and divided by it).
                CpuEngine::new().with_kernels(*k).with_threads(1 << 60),
            ] {
                let mut pages = PageBuf::new(case.layout, case.pages).unwrap();
                let got = case.run(&engine, &mut pages);
                assert!(
                    case.agrees(&got, &want, 1e-3),
                    "{} on {}: {got:?}, the reference says {want:?}",
                    case.name,
                    k.name
                );
            }
        }
    }
    println!(
        "{} cases ({errors} refused, {outputs} computed) on {:?}",
        cases.len(),
        sets.iter().map(|k| k.name).collect::<Vec<_>>()
    );
    assert!(
        errors > 10 && outputs > 10,
        "the random cases cover both outcomes"
    );
}

#[test]
fn the_issue_examples_have_their_documented_outcome() {
    use kvslice_core::Error;
    let cases = edge_cases(1, 0);
    let run = |name: &str| {
        let c = cases.iter().find(|c| c.name == name).unwrap();
        let mut pages = PageBuf::new(c.layout, c.pages).unwrap();
        c.run(&CpuEngine::new(), &mut pages)
    };
    let too_large = |what, token, element| {
        Outcome::WriteFailed(
            0,
            Error::ValueTooLarge {
                what,
                token,
                element,
            },
        )
    };
    assert_eq!(run("k 70000 in f16"), too_large("key", 1, 0));
    assert_eq!(run("k f32::MAX in bf16"), too_large("key", 2, 0));
    assert_eq!(run("k 3e38 in f32"), too_large("key", 0, 5));
    assert_eq!(run("v 1e5 in f16"), too_large("value", 8, 17));
    assert_eq!(run("v 3e38 in f32"), too_large("value", 0, 0));
    // In f32 pages the maths' limit: all weight on the big key's V = 7.
    match run("k 70000 in f32") {
        Outcome::Output(o) => assert!(o.iter().all(|x| (x - 7.0).abs() < 1e-4), "{o:?}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        run("q past its limit"),
        Outcome::AttendFailed(Error::ValueTooLarge { what: "query", .. })
    ));
    assert_eq!(
        run("a written page twice in the table"),
        Outcome::WriteFailed(0, Error::DuplicatePage { page: 0 })
    );
    assert!(matches!(run("a page read twice"), Outcome::Output(_)));
    assert_eq!(
        run("context past the table"),
        Outcome::AttendFailed(Error::ContextPastTable {
            kv_len: 17,
            table_tokens: 16
        })
    );
    assert_eq!(
        run("k one element short"),
        Outcome::WriteFailed(
            0,
            Error::ShapeMismatch {
                what: "k length (whole tokens of shard kv heads × head_dim)",
                expected: 64,
                actual: 63
            }
        )
    );
    assert_eq!(BUILDER_LIMIT, 1 << 24);
}
