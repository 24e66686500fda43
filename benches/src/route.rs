//! Prefix-aware routing across workers (`kvslice route`).
//!
//! W workers, each its own [`CacheStore`] with an event ring and a ZeroMQ
//! [`Publisher`] on loopback; one router, a [`Subscriber`] to all of them,
//! keeps the global prefix index their events build. Each request of a
//! trace goes to the worker a [`Strategy`] picks; the worker serves it
//! (lookup, allocate, publish, release) and forwards its events, and the
//! router waits until it has applied them before the next request, so runs
//! are deterministic.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use kvslice_core::events::{EventRing, KvEvent, Medium};
use kvslice_core::{CacheStore, Error};
use kvslice_events::{Publisher, PublisherConfig, Source, Subscriber, SubscriberStats, zmq};

use crate::replay::{Keys, fill, keys, lookup, trace_layout};
use crate::trace::Trace;

/// How the router picks a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Request `i` to worker `i mod W`.
    RoundRobin,
    /// To the worker that was sent the fewest prompt tokens so far.
    LeastLoaded,
    /// To the worker holding the longest cached prefix of the request,
    /// among those under the balance cap (a worker may take at most
    /// `balance` times its fair share of the requests routed so far);
    /// ties to the worker that last held a deeper block of the request
    /// (evicted everywhere since, see
    /// [`PrefixIndex::last_holder`](kvslice_events::index::PrefixIndex::last_holder)),
    /// then to the worker with fewer requests, then fewer tokens. The
    /// overlap-minus-load idea of Dynamo's KV router, with the load term
    /// as a hard cap.
    Prefix,
}

impl Strategy {
    /// Every strategy, in table order.
    pub const ALL: [Strategy; 3] = [
        Strategy::RoundRobin,
        Strategy::LeastLoaded,
        Strategy::Prefix,
    ];

    /// Its name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::RoundRobin => "round-robin",
            Strategy::LeastLoaded => "least-loaded",
            Strategy::Prefix => "prefix",
        }
    }
}

/// What to route with.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// Workers (1 to 64).
    pub workers: usize,
    /// Each worker's cache capacity, in trace blocks.
    pub capacity_blocks: u32,
    /// Each worker's eviction policy (see [`kvslice_core::evict::by_name`]).
    pub policy: String,
    /// The prefix strategy's cap on a worker's share of requests, as a
    /// multiple of the fair share (at least 1).
    pub balance: f64,
    /// Slots of the router's departed-block memory
    /// ([`PrefixIndex::with_departed_slots`](kvslice_events::index::PrefixIndex::with_departed_slots)).
    pub departed_slots: usize,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// One routing run's results.
#[derive(Debug, Clone)]
pub struct RouteReport {
    /// The strategy.
    pub strategy: Strategy,
    /// Workers.
    pub workers: usize,
    /// Each worker's capacity in blocks.
    pub capacity_blocks: u32,
    /// Requests routed.
    pub requests: u64,
    /// Block lookups over all workers.
    pub blocks: u64,
    /// Blocks found cached on the worker each request went to.
    pub hit_blocks: u64,
    /// `hit_blocks / blocks`: the cluster-wide block hit ratio.
    pub block_hit_ratio: f64,
    /// Requests each worker served.
    pub requests_per_worker: Vec<u64>,
    /// The busiest worker's requests over the mean.
    pub busiest_over_mean: f64,
    /// What the router received.
    pub router: SubscriberStats,
    /// Whether, at the end, the router's index named exactly the blocks
    /// every worker held.
    pub index_exact: bool,
    /// Wall time, seconds.
    pub seconds: f64,
}

impl RouteReport {
    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "strategy": self.strategy.name(),
            "workers": self.workers,
            "capacity_blocks": self.capacity_blocks,
            "requests": self.requests,
            "blocks": self.blocks,
            "hit_blocks": self.hit_blocks,
            "block_hit_ratio": self.block_hit_ratio,
            "requests_per_worker": self.requests_per_worker,
            "busiest_over_mean": self.busiest_over_mean,
            "router_batches": self.router.batches,
            "router_events": self.router.events,
            "router_gaps": self.router.gaps,
            "router_malformed": self.router.malformed,
            "index_exact": self.index_exact,
            "seconds": self.seconds,
        })
    }
}

/// Why a routing run stopped.
#[derive(Debug)]
pub enum RouteError {
    /// Bad configuration or a store error.
    Store(Error),
    /// A socket error.
    Zmq(zmq::Error),
    /// The router did not see a worker's events in time.
    Timeout {
        /// The worker.
        worker: usize,
    },
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteError::Store(e) => write!(f, "{e}"),
            RouteError::Zmq(e) => write!(f, "zeromq: {e}"),
            RouteError::Timeout { worker } => {
                write!(
                    f,
                    "the router did not receive worker {worker}'s events within 10 s"
                )
            }
        }
    }
}

impl std::error::Error for RouteError {}

impl From<Error> for RouteError {
    fn from(e: Error) -> Self {
        RouteError::Store(e)
    }
}

impl From<zmq::Error> for RouteError {
    fn from(e: zmq::Error) -> Self {
        RouteError::Zmq(e)
    }
}

/// How long the router waits for a worker's events.
const SYNC_TIMEOUT_MS: u64 = 10_000;

/// Routes every request of `trace` with `strategy`.
pub fn route(
    trace: &Trace,
    cfg: &RouteConfig,
    strategy: Strategy,
) -> Result<RouteReport, RouteError> {
    if !(1..=kvslice_events::index::MAX_WORKERS).contains(&cfg.workers) {
        return Err(Error::InvalidValue("workers must be between 1 and 64").into());
    }
    if cfg.capacity_blocks == 0 {
        return Err(Error::InvalidValue("capacity must be at least one block").into());
    }
    if cfg.balance.is_nan() || cfg.balance < 1.0 {
        return Err(Error::InvalidValue("balance must be at least 1").into());
    }
    if cfg.departed_slots > kvslice_events::index::MAX_DEPARTED_SLOTS {
        return Err(Error::InvalidValue("departed slots must be at most 2^30").into());
    }
    let layout = trace_layout()?;
    let keys = keys(trace, layout)?;
    let mut stores = Vec::with_capacity(cfg.workers);
    for _ in 0..cfg.workers {
        let policy = crate::policy::online(&cfg.policy, cfg.capacity_blocks)?;
        stores.push(
            CacheStore::new(layout, cfg.capacity_blocks, policy)?
                .with_events(EventRing::new(1 << 14, Medium::Gpu)),
        );
    }
    let mut pubs = (0..cfg.workers)
        .map(|_| {
            Publisher::bind(PublisherConfig {
                // Every batch is applied before the next request; nothing
                // to replay on loopback, and a gap would be counted.
                replay_endpoint: None,
                block_size: crate::trace::TRACE_BLOCK_TOKENS,
                ..PublisherConfig::default()
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sources: Vec<Source> = pubs
        .iter()
        .map(|p| Source {
            endpoint: p.endpoint(),
            replay_endpoint: None,
        })
        .collect();
    let mut router = Subscriber::connect(&sources, 100)?.with_departed_slots(cfg.departed_slots);
    let deadline = Instant::now() + std::time::Duration::from_millis(SYNC_TIMEOUT_MS);
    for (w, p) in pubs.iter_mut().enumerate() {
        while p.subscribers()? == 0 {
            if Instant::now() > deadline {
                return Err(RouteError::Timeout { worker: w });
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    let bar = progress_bar(cfg, strategy, trace.requests.len());
    let started = Instant::now();
    let mut requests = vec![0u64; cfg.workers];
    let mut tokens = vec![0u64; cfg.workers];
    let mut held = Vec::new();
    let mut latencies = Vec::new();
    let uncached = std::sync::atomic::AtomicU64::new(0);
    for i in 0..trace.requests.len() {
        let w = pick(strategy, cfg, i, &keys, &router, &requests, &tokens);
        requests[w] += 1;
        tokens[w] += trace.requests[i].input_length;
        let store = &stores[w];
        let guard = store.pin();
        let (req, hits) = lookup(store, trace, &keys, i, &guard, &mut held, &mut latencies)?;
        fill(
            store, trace, &keys, i, hits, &req, &guard, &mut held, &uncached,
        )?;
        held.clear();
        store.end_request(req)?;
        drop(guard);
        pubs[w].pump(store)?;
        if !router.sync(w, pubs[w].next_seq(), SYNC_TIMEOUT_MS)? {
            return Err(RouteError::Timeout { worker: w });
        }
        if i % 256 == 0 {
            bar.set_position(i as u64);
        }
    }
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    let index_exact = stores.iter().enumerate().all(|(w, s)| {
        let mut held = 0;
        s.snapshot(&mut |e| held += usize::from(matches!(e, KvEvent::Stored { .. })));
        held == router.index().blocks_of(w)
    });
    let hit_blocks: u64 = stores.iter().map(|s| s.stats().hit_blocks).sum();
    let blocks = trace.blocks();
    let n = trace.requests.len() as u64;
    let mean = n as f64 / cfg.workers as f64;
    Ok(RouteReport {
        strategy,
        workers: cfg.workers,
        capacity_blocks: cfg.capacity_blocks,
        requests: n,
        blocks,
        hit_blocks,
        block_hit_ratio: hit_blocks as f64 / blocks.max(1) as f64,
        busiest_over_mean: requests.iter().copied().max().unwrap_or(0) as f64
            / mean.max(f64::MIN_POSITIVE),
        requests_per_worker: requests,
        router: router.stats(),
        index_exact,
        seconds,
    })
}

/// The worker `strategy` sends request `i` to.
fn pick(
    strategy: Strategy,
    cfg: &RouteConfig,
    i: usize,
    keys: &Keys,
    router: &Subscriber,
    requests: &[u64],
    tokens: &[u64],
) -> usize {
    let least = |ws: &mut dyn Iterator<Item = usize>| {
        ws.min_by_key(|&w| (requests[w], tokens[w], w)).unwrap_or(0)
    };
    match strategy {
        Strategy::RoundRobin => i % cfg.workers,
        Strategy::LeastLoaded => (0..cfg.workers)
            .min_by_key(|&w| (tokens[w], w))
            .unwrap_or(0),
        Strategy::Prefix => {
            let overlaps = router.index().overlaps(&keys.per_request[i]);
            let cap = (cfg.balance * (i + 1) as f64 / cfg.workers as f64).ceil() as u64;
            let open: Vec<usize> = (0..cfg.workers).filter(|&w| requests[w] < cap).collect();
            if open.is_empty() {
                return least(&mut (0..cfg.workers));
            }
            let best = open.iter().map(|&w| overlaps[w]).max().unwrap_or(0);
            // Among the longest, the worker that last held a deeper block:
            // its policy may remember the conversation.
            if let Some((_, w)) = router.index().last_holder(&keys.per_request[i])
                && open.contains(&w)
                && overlaps[w] == best
            {
                return w;
            }
            least(&mut open.into_iter().filter(|&w| overlaps[w] == best))
        }
    }
}

fn progress_bar(cfg: &RouteConfig, strategy: Strategy, n: usize) -> ProgressBar {
    if !cfg.progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>24} [{bar:30}] {pos}/{len} requests ({per_sec}, eta {eta})",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(format!("{} x{}", strategy.name(), cfg.workers));
    bar
}

/// The reports as an aligned table, with each hit ratio against
/// round-robin's at the same worker count.
pub fn table(reports: &[RouteReport]) -> String {
    let mut out = String::from(
        "workers  strategy       block_hit  vs_round_robin  busiest/mean  router_events  index_exact  seconds\n",
    );
    for r in reports {
        let rr = reports
            .iter()
            .find(|o| o.workers == r.workers && o.strategy == Strategy::RoundRobin)
            .map_or(f64::NAN, |o| {
                r.block_hit_ratio / o.block_hit_ratio.max(f64::MIN_POSITIVE)
            });
        out.push_str(&format!(
            "{:>7}  {:<13} {:>10.4}  {:>13.2}x  {:>12.2}  {:>13}  {:>11}  {:>7.2}\n",
            r.workers,
            r.strategy.name(),
            r.block_hit_ratio,
            rr,
            r.busiest_over_mean,
            r.router.events,
            r.index_exact,
            r.seconds
        ));
    }
    out
}

/// A bar chart: block hit ratio per strategy, grouped by worker count,
/// with the busiest worker's load over the mean written on each bar.
pub fn plot(
    reports: &[RouteReport],
    path: &std::path::Path,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let mut groups: Vec<usize> = reports.iter().map(|r| r.workers).collect();
    groups.dedup();
    let top = reports
        .iter()
        .map(|r| r.block_hit_ratio)
        .fold(0.0f64, f64::max)
        .max(0.05)
        * 1.25;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let width = Strategy::ALL.len() as f64 + 1.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "cluster block hit ratio by routing strategy",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..groups.len() as f64 * width, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .light_line_style(WHITE)
        .y_desc("block hit ratio")
        .draw()?;
    for (g, workers) in groups.iter().enumerate() {
        let x0 = g as f64 * width + 0.5;
        chart.draw_series(std::iter::once(Text::new(
            format!("{workers} workers"),
            (x0 + 0.9, -top * 0.04),
            ("sans-serif", 15),
        )))?;
        for (s, strategy) in Strategy::ALL.iter().enumerate() {
            let Some(r) = reports
                .iter()
                .find(|r| r.workers == *workers && r.strategy == *strategy)
            else {
                continue;
            };
            let color = Palette99::pick(s).to_rgba();
            let x = x0 + s as f64;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x, 0.0), (x + 0.8, r.block_hit_ratio)],
                color.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!(
                    "{:.3} ({:.2}x load)",
                    r.block_hit_ratio, r.busiest_over_mean
                ),
                (x, r.block_hit_ratio + top * 0.02),
                ("sans-serif", 11),
            )))?;
            if g == 0 {
                chart
                    .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
                    .label(strategy.name())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled())
                    });
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
