//! The `kvslice` tool's library: trace parsing, replay through the real
//! store, eviction policies by name, sweeps with plots, routing across
//! workers by their KV events, replicas sharing a Redis tier, the demo,
//! and the real-model runner
//! ([`llm`]). New to kvslice? Start with the [`guide`].

pub mod decode_workload;
pub mod demo;
#[cfg(feature = "llm")]
pub mod llm;
pub mod model;
pub mod policy;
pub mod read_loop;
pub mod replay;
pub mod rounds;
#[cfg(feature = "events")]
pub mod route;
pub mod serve;
pub mod sweep;
#[cfg(feature = "tier")]
pub mod tier;
pub mod trace;

/// A command-line count that must be at least 1 (`--max-new`,
/// `--requests`), refused by the parser otherwise.
///
/// ```
/// let p = kvslice_benches::at_least_one();
/// let cmd = clap::Command::new("t").arg(clap::Arg::new("n").long("n").value_parser(p));
/// assert!(cmd.clone().try_get_matches_from(["t", "--n", "0"]).is_err());
/// let m = cmd.try_get_matches_from(["t", "--n", "3"]).unwrap();
/// assert_eq!(m.get_one::<usize>("n"), Some(&3));
/// ```
pub fn at_least_one() -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..)
}

/// A K/V dtype from its name on a command line
/// ([`kvslice_core::KvDtype::name`]: f32,
/// f16, bf16, int8, fp8-e4m3), or an error that lists them.
///
/// ```
/// use kvslice_benches::parse_kv_dtype;
/// use kvslice_core::KvDtype;
///
/// assert_eq!(parse_kv_dtype("int8"), Ok(KvDtype::I8));
/// assert!(parse_kv_dtype("q4").unwrap_err().contains("fp8-e4m3"));
/// ```
pub fn parse_kv_dtype(name: &str) -> Result<kvslice_core::KvDtype, String> {
    use kvslice_core::KvDtype;
    KvDtype::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(|| {
            let known: Vec<&str> = KvDtype::ALL.iter().map(|d| d.name()).collect();
            format!("unknown K/V dtype {name:?}; known: {}", known.join(", "))
        })
}

/// Embedding kvslice in a runtime, step by step (`docs/GUIDE.md`; its code
/// runs as this module's doc tests).
#[doc = include_str!("../../docs/GUIDE.md")]
pub mod guide {}

/// int8 and fp8 K/V pages (`docs/QUANTIZATION.md`; its code runs as this
/// module's doc tests).
#[doc = include_str!("../../docs/QUANTIZATION.md")]
#[doc(hidden)]
pub mod quantization {}

/// The wgpu backend and its device-resident API (`docs/WGPU.md`; its code
/// is compiled as this module's doc tests).
#[cfg(feature = "wgpu")]
#[doc = include_str!("../../docs/WGPU.md")]
#[doc(hidden)]
pub mod wgpu_guide {}

/// The README, whose code runs as this module's doc tests.
#[doc = include_str!("../../README.md")]
#[doc(hidden)]
pub mod readme {}
