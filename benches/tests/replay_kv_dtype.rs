//! `kvslice replay --kv-dtype`: capacities become memory, and 8-bit K/V
//! gives the cache more blocks of the same bytes, and more hits.

use std::process::Command;

#[test]
fn eight_bit_kv_holds_more_blocks_and_hits_more_in_the_same_memory() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvslice"))
        .args([
            "replay",
            "--threads",
            "1",
            "--policy",
            "lru",
            "--capacity-blocks",
            "1000",
            "--kv-dtype",
            "f16,int8,fp8-e4m3",
            "--json",
        ])
        .output()
        .expect("run kvslice");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let get = |dtype: &str| {
        rows.iter()
            .find(|r| r["kv_dtype"] == dtype)
            .unwrap_or_else(|| panic!("no {dtype} row in {rows:?}"))
    };
    let (f16, int8, fp8) = (get("f16"), get("int8"), get("fp8-e4m3"));
    for r in [f16, int8, fp8] {
        assert_eq!(r["memory_f16_blocks"], 1000);
    }
    assert_eq!(f16["capacity_blocks"], 1000);
    // 132 bytes a row of 128 against 256.
    assert_eq!(int8["capacity_blocks"], 1939);
    assert_eq!(fp8["capacity_blocks"], 1939);
    let hit = |r: &serde_json::Value| r["block_hit_ratio"].as_f64().unwrap();
    assert!(hit(int8) > hit(f16), "{} vs {}", hit(int8), hit(f16));

    let bad = Command::new(env!("CARGO_BIN_EXE_kvslice"))
        .args(["replay", "--kv-dtype", "int4"])
        .output()
        .expect("run kvslice");
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("unknown K/V dtype") && err.contains("int8"),
        "{err}"
    );
}
