//! `kvslice`: replay real prefix-cache traces through the store, sweep
//! policies and capacities, serve a small model, or walk through a demo.
//!
//! With no arguments it replays the repository's copy of the Mooncake
//! conversation trace with the default policy and LRU at four capacities.

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use kvslice_benches::policy::POLICIES;
use kvslice_benches::replay::{ReplayConfig, ReplayReport, replay};
use kvslice_benches::sweep;
use kvslice_benches::trace::Trace;

const DEFAULT_TRACE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/conversation_trace.jsonl");

#[derive(Parser)]
#[command(
    name = "kvslice",
    version,
    about = "KV-cache slicing: trace replay, policy sweeps, serving demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Replay a Mooncake-format trace through the Coordinator and CacheStore (the default).
    Replay(ReplayArgs),
    /// Replay at many capacities and plot block hit ratio against capacity.
    Sweep(SweepArgs),
    /// Walk a few requests through the coordinator and the reference engine.
    Demo,
}

#[derive(Args, Clone)]
struct TraceArgs {
    /// JSONL trace (Mooncake format). Default: the repository's conversation trace.
    #[arg(long, default_value = DEFAULT_TRACE)]
    trace: PathBuf,
    /// Skip (and count) malformed lines instead of failing on the first.
    #[arg(long)]
    skip_bad_lines: bool,
    /// Worker threads serving requests concurrently.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Args, Clone)]
struct ReplayArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Cache capacity in 512-token blocks; a comma-separated list sweeps.
    #[arg(long, value_delimiter = ',', default_value = "1000,3000,10000,30000")]
    capacity_blocks: Vec<u32>,
    /// Eviction policies (comma-separated), or `all`.
    #[arg(long, value_delimiter = ',', default_value = "default,lru")]
    policy: Vec<String>,
    /// One JSON object per (policy, capacity) on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
struct SweepArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Capacities to sweep, in blocks.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "500,1000,2000,3000,5000,10000,20000,30000,50000"
    )]
    capacity_blocks: Vec<u32>,
    /// Policies to plot (comma-separated), or `all`.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    policy: Vec<String>,
    /// Where to write the SVG plot.
    #[arg(long, default_value = "kvslice-sweep.svg")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli
        .command
        .unwrap_or_else(|| Command::Replay(ReplayArgs::parse_from_defaults()))
    {
        Command::Replay(args) => run_replay(&args),
        Command::Sweep(args) => run_sweep(&args),
        Command::Demo => kvslice_benches::demo::demo().map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvslice: {e}");
            ExitCode::FAILURE
        }
    }
}

impl ReplayArgs {
    fn parse_from_defaults() -> Self {
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            args: ReplayArgs,
        }
        Only::parse_from(["kvslice"]).args
    }
}

fn load(args: &TraceArgs) -> Result<Trace, String> {
    let file =
        File::open(&args.trace).map_err(|e| format!("opening {}: {e}", args.trace.display()))?;
    let trace = Trace::read(BufReader::new(file), args.skip_bad_lines)
        .map_err(|e| format!("{}: {e}", args.trace.display()))?;
    if trace.skipped_lines > 0 {
        eprintln!("kvslice: skipped {} malformed lines", trace.skipped_lines);
    }
    if trace.requests.is_empty() {
        return Err(format!("{}: no requests", args.trace.display()));
    }
    Ok(trace)
}

fn policies(names: &[String]) -> Result<Vec<String>, String> {
    if names.iter().any(|n| n == "all") {
        return Ok(POLICIES.iter().map(|s| s.to_string()).collect());
    }
    for n in names {
        if !POLICIES.contains(&n.as_str()) {
            return Err(format!(
                "unknown policy {n:?}; known: {}, all",
                POLICIES.join(", ")
            ));
        }
    }
    Ok(names.to_vec())
}

fn run_all(
    trace: &Trace,
    args: &TraceArgs,
    policies: &[String],
    capacities: &[u32],
    progress: bool,
) -> Result<Vec<ReplayReport>, String> {
    let mut reports = Vec::new();
    for p in policies {
        for &c in capacities {
            let cfg = ReplayConfig {
                policy: p.clone(),
                capacity_blocks: c,
                threads: if p == "belady" { 1 } else { args.threads },
                progress,
            };
            reports.push(replay(trace, &cfg).map_err(|e| format!("{p} at {c} blocks: {e}"))?);
        }
    }
    Ok(reports)
}

fn run_replay(args: &ReplayArgs) -> Result<(), String> {
    let policies = policies(&args.policy)?;
    let trace = load(&args.trace)?;
    let reports = run_all(
        &trace,
        &args.trace,
        &policies,
        &args.capacity_blocks,
        !args.json,
    )?;
    if args.json {
        for r in &reports {
            println!("{}", r.to_json());
        }
        return Ok(());
    }
    println!(
        "trace {}: {} requests, {} block lookups ({} threads)\n",
        args.trace.trace.display(),
        trace.requests.len(),
        trace.blocks(),
        args.trace.threads
    );
    print!("{}", sweep::table(&reports));
    print_ratios(&reports);
    Ok(())
}

/// "default vs lru" block hit ratios, when both ran.
fn print_ratios(reports: &[ReplayReport]) {
    let find = |p: &str, c: u32| {
        reports
            .iter()
            .find(|r| r.policy == p && r.capacity_blocks == c)
    };
    let mut lines = Vec::new();
    for r in reports.iter().filter(|r| r.policy == "default") {
        if let Some(l) = find("lru", r.capacity_blocks) {
            lines.push(format!(
                "  {:>6} blocks: {:.2}x",
                r.capacity_blocks,
                r.block_hit_ratio / l.block_hit_ratio.max(f64::MIN_POSITIVE)
            ));
        }
    }
    if !lines.is_empty() {
        println!("\ndefault / lru block hit ratio:\n{}", lines.join("\n"));
    }
}

fn run_sweep(args: &SweepArgs) -> Result<(), String> {
    let policies = policies(&args.policy)?;
    let trace = load(&args.trace)?;
    let reports = run_all(&trace, &args.trace, &policies, &args.capacity_blocks, true)?;
    print!("{}", sweep::table(&reports));
    print_ratios(&reports);
    let name = args
        .trace
        .trace
        .file_stem()
        .map_or("trace".into(), |s| s.to_string_lossy().into_owned());
    sweep::plot(
        &reports,
        &format!("block hit ratio vs capacity: {name}"),
        &args.out,
    )
    .map_err(|e| format!("plotting: {e}"))?;
    println!("\nplot written to {}", args.out.display());
    Ok(())
}
