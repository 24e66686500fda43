//! The committed fuzz seeds, for the stable tests that replay them.

use std::path::PathBuf;
use std::vec::Vec;

/// The committed seeds of fuzz target `target` (`fuzz/corpus/<target>/` in
/// the repository), sorted by path, with their paths: what each crate's
/// corpus replay runs through the target's harness, so that a fuzz
/// finding stays a regression test on stable Rust. Panics if the folder
/// cannot be read or holds fewer than `at_least` files.
///
/// ```
/// use kvslice_core::testkit::fuzz_seeds;
///
/// for (path, bytes) in fuzz_seeds("page_pool", 1) {
///     kvslice_core::fuzzing::page_pool(&bytes);
///     assert!(path.starts_with(kvslice_core::testkit::fuzz_corpus_dir()));
/// }
/// ```
pub fn fuzz_seeds(target: &str, at_least: usize) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = fuzz_corpus_dir().join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    paths.sort();
    assert!(
        paths.len() >= at_least,
        "{} seeds in {}, fewer than {at_least}",
        paths.len(),
        dir.display()
    );
    paths
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect()
}

/// The repository's `fuzz/corpus` folder.
pub fn fuzz_corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus")
}
