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
use kvslice_benches::replay::{ReplayConfig, ReplayReport, replay, same_memory_blocks};
use kvslice_benches::sweep;
use kvslice_benches::trace::Trace;
use kvslice_core::KvDtype;

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
    /// Serve a stream of requests over a tiny model, with and without prefix reuse.
    Serve(ServeArgs),
    /// Route a trace across workers that publish KV events: prefix-aware vs round-robin vs least-loaded.
    #[cfg(feature = "events")]
    Route(RouteArgs),
    /// Replicas sharing a Redis tier: each alone, with the tier, and one pooled store.
    #[cfg(feature = "tier")]
    Tier(TierArgs),
    /// Walk a few requests through the coordinator and the reference engine.
    Demo,
    /// Chat with a real model (SmolLM2 GGUF) whose K/V lives in kvslice.
    #[cfg(feature = "llm")]
    Generate(kvslice_benches::llm::cli::GenerateArgs),
    /// Multi-turn chat workload under reuse strategies: latency, memory, hits.
    #[cfg(feature = "llm")]
    Profile(kvslice_benches::llm::cli::ProfileArgs),
    /// Decode and prefill of the real model against candle's own KV cache.
    #[cfg(feature = "llm")]
    ModelBench(kvslice_benches::llm::cli::ModelBenchArgs),
    /// What 8-bit K/V costs the real model: greedy agreement and NLL per K/V dtype.
    #[cfg(feature = "llm")]
    KvAccuracy(kvslice_benches::llm::cli::KvAccuracyArgs),
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// Attention engine: cpu, reference or wgpu.
    #[arg(long, default_value = "cpu")]
    engine: String,
    /// Requests in the stream.
    #[arg(long, default_value_t = 24, value_parser = kvslice_benches::at_least_one())]
    requests: usize,
    /// Distinct system prompts the requests share.
    #[arg(long, default_value_t = 3, value_parser = kvslice_benches::at_least_one())]
    system_prompts: usize,
    /// Greedy decode steps per request.
    #[arg(long, default_value_t = 8)]
    decode_steps: usize,
    /// Cache capacity in 16-token pages.
    #[arg(long, default_value_t = 256)]
    capacity_pages: u32,
    /// Storage dtype of K/V pages: f16, bf16, f32, int8 or fp8-e4m3.
    #[arg(long, default_value = "f16")]
    kv_dtype: String,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Clone)]
struct TraceArgs {
    /// JSONL trace (Mooncake format). Default: the repository's conversation trace.
    #[arg(long, default_value = DEFAULT_TRACE)]
    trace: PathBuf,
    /// Skip (and count) malformed lines instead of failing on the first.
    #[arg(long)]
    skip_bad_lines: bool,
}

/// For the commands that serve one store from several threads (route and
/// tier serve requests one at a time).
#[derive(Args, Clone)]
struct ThreadsArg {
    /// Worker threads serving requests concurrently.
    #[arg(long, default_value_t = 1, value_parser = kvslice_benches::at_least_one())]
    threads: usize,
}

#[derive(Args, Clone)]
struct ReplayArgs {
    #[command(flatten)]
    trace: TraceArgs,
    #[command(flatten)]
    threads: ThreadsArg,
    /// Cache capacity in 512-token blocks; a comma-separated list sweeps.
    #[arg(long, value_delimiter = ',', default_value = "1000,3000,10000,30000")]
    capacity_blocks: Vec<u32>,
    /// Eviction policies (comma-separated), or `all`.
    #[arg(long, value_delimiter = ',', default_value = "default,lru")]
    policy: Vec<String>,
    /// K/V storage dtypes (comma-separated: f16, bf16, f32, int8,
    /// fp8-e4m3). Capacities are then memory: that of so many f16 blocks,
    /// which holds 1.94x the int8 or fp8 blocks (head_dim 128 rows).
    #[arg(long, value_delimiter = ',', default_value = "f16")]
    kv_dtype: Vec<String>,
    /// One JSON object per (policy, capacity) on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Also print `lookup_prefix` latency by how many blocks each lookup
    /// hit: a policy that hits more serves longer prefixes, whose lookups
    /// take longer.
    #[arg(long)]
    by_hits: bool,
    /// With `--tier`, the cache spills evicted blocks to a Redis tier and
    /// fetches a prefix's continuation from it; the table then splits hits
    /// into local and remote (`kvslice tier` runs several replicas).
    #[cfg(feature = "tier")]
    #[command(flatten)]
    tier: TierOpts,
}

#[cfg(feature = "events")]
#[derive(Args, Clone)]
struct RouteArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Worker counts to run (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "4,8")]
    workers: Vec<usize>,
    /// Each worker's cache capacity in 512-token blocks.
    #[arg(long, default_value_t = 1000)]
    capacity_blocks: u32,
    /// Each worker's eviction policy.
    #[arg(long, default_value = "default")]
    policy: String,
    /// The prefix strategy's cap on a worker's share of requests, as a
    /// multiple of the fair share: tight caps also spread cache pressure.
    #[arg(long, default_value_t = 1.05)]
    balance: f64,
    /// Slots of the router's memory of which worker last held each block
    /// evicted everywhere (0: none); prefix routing sends ties there.
    #[arg(long, default_value_t = kvslice_events::index::DEFAULT_DEPARTED_SLOTS)]
    departed_slots: usize,
    /// Where to write the SVG plot.
    #[arg(long, default_value = "kvslice-route.svg")]
    out: PathBuf,
    /// One JSON object per (workers, strategy) on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "tier")]
#[derive(Args, Clone)]
struct TierArgs {
    #[command(flatten)]
    trace: TraceArgs,
    /// Replicas, each with its own cache (threads).
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Each replica's cache capacity in 512-token blocks.
    #[arg(long, default_value_t = 1000)]
    capacity_blocks: u32,
    /// Each cache's eviction policy.
    #[arg(long, default_value = "default")]
    policy: String,
    #[command(flatten)]
    tier: TierOpts,
    /// Setups to run (comma-separated): alone, tier, pooled.
    #[arg(long, value_delimiter = ',', default_value = "alone,tier,pooled")]
    setups: Vec<String>,
    /// One JSON object per setup on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

/// Where the shared tier is and how blocks go to it (`kvslice tier`,
/// `kvslice replay --tier`).
#[cfg(feature = "tier")]
#[derive(Args, Clone)]
struct TierOpts {
    /// The tier: redis:// URLs, comma-separated (a cluster's seed nodes or
    /// one server). For `tier`, default $KVSLICE_REDIS_URLS, else the
    /// loopback cluster `.ci/redis-cluster.sh start` runs; `replay` uses a
    /// tier only when given one.
    #[arg(long)]
    tier: Option<String>,
    /// Key namespace in Redis (default: a fresh one per run).
    #[arg(long)]
    namespace: Option<String>,
    /// Spill blocks when published (write-through), not when evicted.
    #[arg(long)]
    write_through: bool,
    /// How long spilled blocks live in Redis, in seconds.
    #[arg(long, default_value_t = 600)]
    ttl_secs: u64,
}

#[cfg(feature = "tier")]
impl TierOpts {
    /// The tier's configuration at `urls`, in this run's namespace.
    fn config(&self, urls: &str) -> kvslice_redis::TierConfig {
        let namespace = self.namespace.clone().unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("kvslice-tier-{}-{nanos}", std::process::id())
        });
        kvslice_redis::TierConfig::new(urls)
            .namespace(&namespace)
            .write_through(self.write_through)
            .ttl(Some(std::time::Duration::from_secs(self.ttl_secs.max(1))))
    }

    fn mode(&self) -> &'static str {
        if self.write_through {
            "write-through"
        } else {
            "spill on evict"
        }
    }
}

#[derive(Args, Clone)]
struct SweepArgs {
    #[command(flatten)]
    trace: TraceArgs,
    #[command(flatten)]
    threads: ThreadsArg,
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
        Command::Serve(args) => run_serve(&args),
        #[cfg(feature = "events")]
        Command::Route(args) => run_route(&args),
        #[cfg(feature = "tier")]
        Command::Tier(args) => run_tier(&args),
        Command::Demo => kvslice_benches::demo::demo().map_err(|e| e.to_string()),
        #[cfg(feature = "llm")]
        Command::Generate(args) => kvslice_benches::llm::cli::run_generate(&args),
        #[cfg(feature = "llm")]
        Command::Profile(args) => kvslice_benches::llm::cli::run_profile(&args),
        #[cfg(feature = "llm")]
        Command::ModelBench(args) => kvslice_benches::llm::cli::run_model_bench(&args),
        #[cfg(feature = "llm")]
        Command::KvAccuracy(args) => kvslice_benches::llm::cli::run_kv_accuracy(&args),
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
    threads: usize,
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
                threads: if p == "belady" { 1 } else { threads },
                lockstep: false,
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
    let dtypes = args
        .kv_dtype
        .iter()
        .map(|d| kvslice_benches::parse_kv_dtype(d))
        .collect::<Result<Vec<_>, _>>()?;
    #[cfg(feature = "tier")]
    if let Some(urls) = &args.tier.tier {
        if dtypes != [KvDtype::F16] {
            return Err(
                "--kv-dtype is not supported with --tier: the tier's capacity is Redis's".into(),
            );
        }
        return run_replay_tier(args, &policies, &trace, urls);
    }
    if !args.json {
        let belady = if args.threads.threads > 1 && policies.iter().any(|p| p == "belady") {
            "; belady, an offline oracle, on 1"
        } else {
            ""
        };
        println!(
            "trace {}: {} requests, {} block lookups ({} threads{belady})",
            args.trace.trace.display(),
            trace.requests.len(),
            trace.blocks(),
            args.threads.threads
        );
    }
    let mut by_dtype = Vec::new();
    for &dtype in &dtypes {
        let capacities: Vec<u32> = args
            .capacity_blocks
            .iter()
            .map(|&c| same_memory_blocks(c, dtype))
            .collect();
        let reports = run_all(
            &trace,
            args.threads.threads,
            &policies,
            &capacities,
            !args.json,
        )?;
        if args.json {
            for (i, r) in reports.iter().enumerate() {
                let mut j = r.to_json();
                j["kv_dtype"] = dtype.name().into();
                j["memory_f16_blocks"] = args.capacity_blocks[i % capacities.len()].into();
                println!("{j}");
            }
        } else {
            if dtypes.len() > 1 || dtype != KvDtype::F16 {
                println!(
                    "\nK/V as {}: the memory of {:?} f16 blocks holds {capacities:?} blocks",
                    dtype.name(),
                    args.capacity_blocks
                );
            }
            println!();
            print!("{}", sweep::table(&reports));
            if args.by_hits {
                print!("\n{}", sweep::by_hits_table(&reports));
            }
            print_ratios(&reports);
        }
        by_dtype.push((dtype, reports));
    }
    if !args.json {
        print_dtype_ratios(&by_dtype, &args.capacity_blocks);
    }
    Ok(())
}

/// Block hit ratio of each dtype against the first (f16 unless told
/// otherwise) at the same memory, when several ran.
fn print_dtype_ratios(by_dtype: &[(KvDtype, Vec<ReplayReport>)], memory: &[u32]) {
    let Some(((base, base_reports), rest)) = by_dtype.split_first() else {
        return;
    };
    if rest.is_empty() {
        return;
    }
    println!(
        "\nblock hit ratio at the same memory, against {}:",
        base.name()
    );
    for (dtype, reports) in rest {
        // Reports run policy by policy, each over every capacity.
        for (i, (r, b)) in reports.iter().zip(base_reports).enumerate() {
            println!(
                "  {:>9} {:>8}, memory of {:>6} f16 blocks: {:.4} against {:.4} ({:.2}x)",
                dtype.name(),
                r.policy,
                memory[i % memory.len()],
                r.block_hit_ratio,
                b.block_hit_ratio,
                r.block_hit_ratio / b.block_hit_ratio.max(f64::MIN_POSITIVE)
            );
        }
    }
}

/// `kvslice replay --tier`: one replica (a store per policy and capacity)
/// with the tier behind it.
#[cfg(feature = "tier")]
fn run_replay_tier(
    args: &ReplayArgs,
    policies: &[String],
    trace: &Trace,
    urls: &str,
) -> Result<(), String> {
    use kvslice_benches::tier::{Setup, TierReplayConfig, table, tier_replay};
    if args.by_hits {
        return Err(
            "--by-hits is not supported with --tier: its table splits hits into local and remote"
                .into(),
        );
    }
    if args.threads.threads > 1 {
        return Err(
            "--tier replays one replica on one thread; `kvslice tier --replicas N` runs several"
                .into(),
        );
    }
    if !args.json {
        println!(
            "trace {}: {} requests, {} block lookups; tier {urls} ({})",
            args.trace.trace.display(),
            trace.requests.len(),
            trace.blocks(),
            args.tier.mode()
        );
    }
    for p in policies {
        for &c in &args.capacity_blocks {
            let cfg = TierReplayConfig {
                replicas: 1,
                capacity_blocks: c,
                policy: p.clone(),
                // Without --namespace, a fresh one per run: one
                // capacity's spills must not serve the next.
                tier: args.tier.config(urls),
                lead: 2,
                progress: !args.json,
            };
            let r = tier_replay(trace, &cfg, Setup::Tier)
                .map_err(|e| format!("{p} at {c} blocks: {e}"))?;
            if r.wrong_blocks > 0 {
                return Err(format!(
                    "{p} at {c} blocks: {} blocks fetched from the tier were not the block asked for",
                    r.wrong_blocks
                ));
            }
            if args.json {
                let mut j = r.to_json();
                j["policy"] = p.clone().into();
                println!("{j}");
            } else {
                println!("\npolicy {p}, {c} blocks:\n{}", table(&[r]));
            }
        }
    }
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

/// Refuses a plot path whose folder does not exist, before the replays
/// that would otherwise run for minutes and then fail to write it.
fn plot_folder_exists(out: &std::path::Path) -> Result<(), String> {
    let folder = out.parent().filter(|p| !p.as_os_str().is_empty());
    match folder.is_none_or(std::path::Path::is_dir) {
        true => Ok(()),
        false => Err(format!("--out {}: no such folder", out.display())),
    }
}

fn run_sweep(args: &SweepArgs) -> Result<(), String> {
    plot_folder_exists(&args.out)?;
    let policies = policies(&args.policy)?;
    let trace = load(&args.trace)?;
    let reports = run_all(
        &trace,
        args.threads.threads,
        &policies,
        &args.capacity_blocks,
        true,
    )?;
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

#[cfg(feature = "events")]
fn run_route(args: &RouteArgs) -> Result<(), String> {
    use kvslice_benches::route::{RouteConfig, Strategy, plot, route, table};
    plot_folder_exists(&args.out)?;
    policies(std::slice::from_ref(&args.policy))?;
    if args.policy == "belady" {
        return Err("belady is an offline oracle of one store; pick an online policy".into());
    }
    // Every worker count's pooled store (its workers' memory as one)
    // must fit a page pool: found before any run, not after the first.
    for &workers in &args.workers {
        kvslice_benches::policy::times(args.capacity_blocks, workers)
            .and_then(kvslice_benches::policy::check_capacity)
            .map_err(|e| format!("{workers} workers of {} blocks: {e}", args.capacity_blocks))?;
    }
    let trace = load(&args.trace)?;
    let mut reports = Vec::new();
    let mut pooled = Vec::new();
    for &workers in &args.workers {
        let cfg = RouteConfig {
            workers,
            capacity_blocks: args.capacity_blocks,
            policy: args.policy.clone(),
            balance: args.balance,
            departed_slots: args.departed_slots,
            progress: !args.json,
        };
        for s in Strategy::ALL {
            let r = route(&trace, &cfg, s).map_err(|e| format!("{} x{workers}: {e}", s.name()))?;
            if args.json {
                println!("{}", r.to_json());
            }
            reports.push(r);
        }
        // The same memory as one store: what no router can beat by much.
        let one = replay(
            &trace,
            &ReplayConfig {
                policy: args.policy.clone(),
                capacity_blocks: kvslice_benches::policy::times(args.capacity_blocks, workers)
                    .map_err(|e| e.to_string())?,
                threads: 1,
                lockstep: false,
                progress: false,
            },
        )
        .map_err(|e| e.to_string())?;
        pooled.push((workers, one.block_hit_ratio));
    }
    if args.json {
        return Ok(());
    }
    println!(
        "trace {}: {} requests, {} block lookups; each worker {} blocks, policy {}\n",
        args.trace.trace.display(),
        trace.requests.len(),
        trace.blocks(),
        args.capacity_blocks,
        args.policy
    );
    print!("{}", table(&reports));
    for (workers, ratio) in pooled {
        println!(
            "one store of {} blocks (all {workers} workers' memory, no routing): block hit ratio {ratio:.4}",
            u64::from(args.capacity_blocks) * workers as u64
        );
    }
    plot(&reports, &args.out).map_err(|e| format!("plotting: {e}"))?;
    println!("\nplot written to {}", args.out.display());
    Ok(())
}

#[cfg(feature = "tier")]
fn run_tier(args: &TierArgs) -> Result<(), String> {
    use kvslice_benches::tier::{Setup, TierReplayConfig, table, tier_replay};
    policies(std::slice::from_ref(&args.policy))?;
    let setups = args
        .setups
        .iter()
        .map(|s| match s.as_str() {
            "alone" => Ok(Setup::Alone),
            "tier" => Ok(Setup::Tier),
            "pooled" => Ok(Setup::Pooled),
            other => Err(format!(
                "unknown setup {other:?}; known: alone, tier, pooled"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let urls = args
        .tier
        .tier
        .clone()
        .unwrap_or_else(kvslice_redis::default_urls);
    let trace = load(&args.trace)?;
    let cfg = TierReplayConfig {
        replicas: args.replicas,
        capacity_blocks: args.capacity_blocks,
        policy: args.policy.clone(),
        tier: args.tier.config(&urls),
        lead: 2 * args.replicas,
        progress: !args.json,
    };
    let mut reports = Vec::new();
    for setup in setups {
        let r = tier_replay(&trace, &cfg, setup).map_err(|e| format!("{}: {e}", setup.name()))?;
        if args.json {
            println!("{}", r.to_json());
        }
        if r.wrong_blocks > 0 {
            return Err(format!(
                "{} blocks fetched from the tier were not the block asked for",
                r.wrong_blocks
            ));
        }
        reports.push(r);
    }
    if !args.json {
        println!(
            "trace {}: {} requests, {} block lookups; {} replicas of {} blocks, policy {}, tier {urls} ({})\n",
            args.trace.trace.display(),
            trace.requests.len(),
            trace.blocks(),
            args.replicas,
            args.capacity_blocks,
            args.policy,
            args.tier.mode()
        );
        print!("{}", table(&reports));
    }
    Ok(())
}

fn run_serve(args: &ServeArgs) -> Result<(), String> {
    use kvslice_benches::serve::{ServeConfig, serve};
    let cfg = ServeConfig {
        requests: args.requests,
        system_prompts: args.system_prompts,
        decode_steps: args.decode_steps,
        capacity_pages: args.capacity_pages,
        kv_dtype: kvslice_benches::parse_kv_dtype(&args.kv_dtype)?,
        ..ServeConfig::default()
    };
    let report = match args.engine.as_str() {
        "cpu" => serve(&kvslice_cpu::CpuEngine::new(), "cpu", &cfg),
        "reference" => serve(&kvslice_core::ReferenceEngine, "reference", &cfg),
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            let engine = kvslice_wgpu::WgpuEngine::new().map_err(|e| e.to_string())?;
            eprintln!("wgpu adapter: {}", engine.adapter().name);
            serve(&kvslice_wgpu::StagingEngine::new(engine), "wgpu", &cfg)
        }
        #[cfg(not(feature = "wgpu"))]
        "wgpu" => return Err("this build has no wgpu engine (the `wgpu` feature is off)".into()),
        other => {
            return Err(format!(
                "unknown engine {other:?}; known: cpu, reference, wgpu"
            ));
        }
    }
    .map_err(|e| e.to_string())?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "engine": report.engine, "requests": report.requests, "prompt_tokens": report.prompt_tokens,
                "reused_tokens": report.reused_tokens, "block_hit_ratio": report.block_hit_ratio,
                "tokens_per_sec_reuse": report.tokens_per_sec_reuse, "tokens_per_sec_scratch": report.tokens_per_sec_scratch,
                "max_logit_rel_diff": report.max_logit_rel_diff, "tokens_match": report.tokens_match,
                "kv_bytes": report.kv_bytes, "weight_bytes": report.weight_bytes,
            })
        );
    } else {
        println!(
            "served {} requests on the {} engine (4 layers, 8 q / 2 kv heads, head_dim 64, {} KV)",
            report.requests,
            report.engine,
            cfg.kv_dtype.name()
        );
        println!(
            "  prompt tokens:        {} ({} reused from cache)",
            report.prompt_tokens, report.reused_tokens
        );
        println!("  block hit ratio:      {:.3}", report.block_hit_ratio);
        println!("  tokens/s with reuse:  {:.0}", report.tokens_per_sec_reuse);
        println!(
            "  tokens/s from scratch: {:.0} ({:.2}x)",
            report.tokens_per_sec_scratch,
            report.tokens_per_sec_reuse / report.tokens_per_sec_scratch
        );
        println!(
            "  memory: {:.1} MiB K/V pages, {:.1} MiB weights",
            report.kv_bytes as f64 / 1048576.0,
            report.weight_bytes as f64 / 1048576.0
        );
        println!(
            "  reuse vs scratch: generated tokens {}, max logit difference {:.2e} (relative)",
            if report.tokens_match {
                "identical"
            } else {
                "DIFFER"
            },
            report.max_logit_rel_diff
        );
    }
    if !report.tokens_match || report.max_logit_rel_diff > 1e-3 {
        return Err(
            "output with cache reuse differs from the output recomputed from scratch".into(),
        );
    }
    Ok(())
}
