//! Sweeps of block hit ratio against capacity, as a table and an SVG plot,
//! and the replay's tables.

use std::path::Path;

use plotters::prelude::*;

use crate::replay::{HIT_BUCKETS, ReplayReport};

/// Formats reports as an aligned text table.
pub fn table(reports: &[ReplayReport]) -> String {
    let mut out = String::from(
        "policy    capacity  block_hit  token_hit  evictions  uncached  lookups/s   p50_us  p99_us  seconds\n",
    );
    for r in reports {
        out.push_str(&format!(
            "{:<9} {:>8}  {:>9.4}  {:>9.4}  {:>9}  {:>8}  {:>9.3e}  {:>7.2}  {:>6.2}  {:>7.3}\n",
            r.policy,
            r.capacity_blocks,
            r.block_hit_ratio,
            r.token_hit_ratio,
            r.evictions,
            r.uncached_requests,
            r.lookups_per_sec,
            r.p50_lookup_us,
            r.p99_lookup_us,
            r.seconds
        ));
    }
    out
}

/// `lookup_prefix` latency by blocks hit: per policy and capacity, each
/// hit range's lookups and their p50 / p99 microseconds.
pub fn by_hits_table(reports: &[ReplayReport]) -> String {
    let mut out = String::from("lookup_prefix latency by blocks hit: lookups, p50 / p99 us\n");
    out.push_str("policy    capacity");
    for &(lo, hi) in &HIT_BUCKETS {
        let range = match (lo, hi) {
            (lo, hi) if lo == hi => format!("{lo}"),
            (lo, u32::MAX) => format!("{lo}+"),
            (lo, hi) => format!("{lo}-{hi}"),
        };
        out.push_str(&format!("  {range:>20}"));
    }
    out.push('\n');
    for r in reports {
        out.push_str(&format!("{:<9} {:>8}", r.policy, r.capacity_blocks));
        for b in &r.by_hits {
            let cell = format!("{} {:.2}/{:.2}", b.lookups, b.p50_us, b.p99_us);
            out.push_str(&format!("  {cell:>20}"));
        }
        out.push('\n');
    }
    out
}

/// Plots block hit ratio against capacity (log scale), one line per policy.
pub fn plot(
    reports: &[ReplayReport],
    title: &str,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut policies: Vec<&str> = Vec::new();
    for r in reports {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let (lo, hi) = reports.iter().fold((u32::MAX, 1), |(lo, hi), r| {
        (lo.min(r.capacity_blocks), hi.max(r.capacity_blocks))
    });
    let top = reports
        .iter()
        .map(|r| r.block_hit_ratio)
        .fold(0.0f64, f64::max)
        .max(0.05)
        * 1.1;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(
            (f64::from(lo) * 0.8..f64::from(hi) * 1.25).log_scale(),
            0.0..top,
        )?;
    chart
        .configure_mesh()
        .x_labels(6)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE)
        .x_desc("capacity (blocks of 512 tokens, log scale)")
        .y_desc("block hit ratio")
        .draw()?;
    for (i, p) in policies.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut pts: Vec<(f64, f64)> = reports
            .iter()
            .filter(|r| r.policy == *p)
            .map(|r| (f64::from(r.capacity_blocks), r.block_hit_ratio))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(p.to_string())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            pts.iter()
                .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
        )?;
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
