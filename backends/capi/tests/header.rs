//! The checked-in header is what cbindgen makes of the crate now.

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads the crate")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = dir.join("include/kvslice.h");
    if std::env::var_os("KVSLICE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "include/kvslice.h is stale: regenerate it with \
         `KVSLICE_BLESS=1 cargo test -p kvslice-capi --test header`"
    );
}
