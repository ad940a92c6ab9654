//! The report's plots, drawn from its [`Results`] with plotters' SVG backend (text as SVG
//! `<text>`, laid out without system fonts): throughput by scenario, latency percentiles
//! by load, healthy p99 beside bad neighbours, and the recovery drain against the
//! receiver's capacity with the concurrency limit over time. Medians with min–max bars.

use std::path::Path;

use plotters::prelude::*;

use super::stats::Run;
use super::stats::Spread;
use super::{Options, Results};

type Error = Box<dyn std::error::Error>;

const WIDTH: u32 = 900;
const FONT: &str = "sans-serif";
const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

/// Writes every plot the results have data for into `dir`; the files written.
pub fn write_all(r: &Results, o: &Options, dir: &Path) -> Result<Vec<String>, Error> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut put = |name: &str, svg: Option<String>| -> Result<(), Error> {
        if let Some(svg) = svg {
            std::fs::write(dir.join(name), svg)?;
            written.push(name.to_owned());
        }
        Ok(())
    };
    put("throughput.svg", throughput(r, o)?)?;
    put("latency.svg", latency(r)?)?;
    put("isolation.svg", isolation(r)?)?;
    put("recovery.svg", recovery(r)?)?;
    Ok(written)
}

/// An axis label: the tick value without trailing zeros (`20000`, `0.5`), rounded to six
/// decimals against binary noise (`0.30000000000000004`).
fn tidy(x: f64) -> String {
    let r = (x * 1e6).round() / 1e6;
    format!("{}", if r == 0.0 { 0.0 } else { r })
}

fn spread(runs: &[Run], f: impl Fn(&Run) -> f64) -> Spread {
    Spread::of(runs.iter().map(f))
}

/// Horizontal bars (median) with min–max whiskers, one per labelled spread.
fn bars(title: &str, unit: &str, rows: &[(String, Spread)]) -> Result<Option<String>, Error> {
    if rows.is_empty() {
        return Ok(None);
    }
    let mut svg = String::new();
    {
        let height = 120 + 44 * rows.len() as u32;
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let top = rows.iter().map(|(_, s)| s.max).fold(0.0, f64::max) * 1.15;
        let n = rows.len();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 20))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(330)
            .build_cartesian_2d(0.0..top.max(1.0), -0.5..n as f64 - 0.5)?;
        let labels: Vec<String> = rows.iter().map(|(l, _)| l.clone()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|y| {
                let i = y.round();
                if (y - i).abs() > 0.01 || i < 0.0 {
                    return String::new();
                }
                // Row 0 at the top.
                labels
                    .get(n.saturating_sub(1 + i as usize))
                    .cloned()
                    .unwrap_or_default()
            })
            .x_desc(unit)
            .x_label_formatter(&|x| tidy(*x))
            .label_style((FONT, 13))
            .draw()?;
        for (i, (_, s)) in rows.iter().enumerate() {
            let y = (n - 1 - i) as f64;
            let color = COLORS[i % COLORS.len()];
            chart.draw_series([Rectangle::new(
                [(0.0, y - 0.32), (s.median, y + 0.32)],
                color.mix(0.75).filled(),
            )])?;
            if s.runs > 1 {
                chart.draw_series([ErrorBar::new_horizontal(
                    y,
                    s.min,
                    s.median,
                    s.max,
                    BLACK.stroke_width(1),
                    10,
                )])?;
            }
            chart.draw_series([Text::new(
                format!("{:.0}", s.median),
                (s.max + top * 0.01, y + 0.12),
                (FONT, 13),
            )])?;
        }
        root.present()?;
    }
    Ok(Some(svg))
}

fn throughput(r: &Results, o: &Options) -> Result<Option<String>, Error> {
    let mut rows = Vec::new();
    let mut add = |label: String, runs: &[Run]| {
        if !runs.is_empty() {
            rows.push((label, spread(runs, |r| r.rate)));
        }
    };
    add("10 endpoints".into(), &r.throughput);
    add(format!("{} endpoints", o.scale_endpoints), &r.scale);
    add(
        format!("fan-out to {} endpoints", o.fanout_endpoints),
        &r.fanout,
    );
    add("ordered endpoint".into(), &r.ordered);
    add(format!("ordering key ({} keys)", o.ordering_keys), &r.keyed);
    for n in [1, 3] {
        let runs: Vec<f64> = r
            .replicas
            .iter()
            .filter(|x| x.replicas == n)
            .map(|x| x.rate)
            .collect();
        if !runs.is_empty() {
            rows.push((
                format!("{n} dispatcher process(es), 12 shards"),
                Spread::of(runs),
            ));
        }
    }
    bars(
        "Deliveries per second by scenario (median, min–max)",
        "deliveries/s",
        &rows,
    )
}

fn latency(r: &Results) -> Result<Option<String>, Error> {
    if r.latency.is_empty() {
        return Ok(None);
    }
    type Pick = fn(&Run) -> f64;
    let series: [(&str, Pick); 4] = [
        ("p50", |r| r.latency.p50),
        ("p90", |r| r.latency.p90),
        ("p99", |r| r.latency.p99),
        ("max", |r| r.latency.max),
    ];
    let mut points = r.latency.clone();
    points.sort_by(|a, b| {
        Spread::of(a.rates.iter().copied())
            .median
            .total_cmp(&Spread::of(b.rates.iter().copied()).median)
    });
    let x_of = |p: &super::LoadPoint| Spread::of(p.rates.iter().copied()).median;
    let x_max = points.iter().map(x_of).fold(0.0, f64::max) * 1.08;
    let y_max = points
        .iter()
        .flat_map(|p| p.runs.iter().map(|r| r.latency.max))
        .fold(1.0, f64::max)
        * 2.0;
    let y_min = points
        .iter()
        .flat_map(|p| p.runs.iter().map(|r| r.latency.p50))
        .fold(f64::MAX, f64::min)
        .clamp(0.01, 1.0)
        / 2.0;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 520)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Latency by load, publish sent → request received (median, min–max)",
                (FONT, 20),
            )
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max.max(1.0), (y_min..y_max).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("load, events/s (10 endpoints)")
            .y_desc("latency, ms (log scale)")
            .x_label_formatter(&|x| tidy(*x))
            .y_label_formatter(&|y| tidy(*y))
            .label_style((FONT, 13))
            .draw()?;
        for (k, (name, pick)) in series.iter().enumerate() {
            let color = COLORS[k % COLORS.len()];
            let line: Vec<(f64, f64)> = points
                .iter()
                .map(|p| (x_of(p), spread(&p.runs, pick).median))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(line.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
            chart.draw_series(points.iter().filter(|p| p.runs.len() > 1).map(|p| {
                let s = spread(&p.runs, pick);
                ErrorBar::new_vertical(x_of(p), s.min, s.median, s.max, color.stroke_width(1), 8)
            }))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 13))
            .draw()?;
        root.present()?;
    }
    Ok(Some(svg))
}

fn isolation(r: &Results) -> Result<Option<String>, Error> {
    let mut rows = Vec::new();
    for (group, cases) in [
        ("10 endpoints", &r.isolation),
        ("1,000 endpoints", &r.isolation_scale),
        ("steady tenant", &r.burst),
    ] {
        for case in cases {
            rows.push((
                format!("{group}: {}", case.label),
                spread(&case.runs, |r| r.acked.p99),
            ));
        }
    }
    bars(
        "Healthy endpoints' p99 beside bad neighbours (median, min–max)",
        "p99 latency from the publish ack, ms",
        &rows,
    )
}

fn recovery(r: &Results) -> Result<Option<String>, Error> {
    if r.recovery.is_empty() {
        return Ok(None);
    }
    let x_max = r
        .recovery
        .iter()
        .map(|run| run.drain_seconds.max(run.ideal_seconds))
        .fold(1.0, f64::max)
        * 1.05;
    let events = r.recovery.iter().map(|run| run.events).max().unwrap_or(1) as f64;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, 760)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(440);
        let mut chart = ChartBuilder::on(&top)
            .caption(
                "Recovery: backlog delivered against the receiver's capacity",
                (FONT, 20),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max, 0.0..events * 1.05)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the receiver came back")
            .y_desc("events delivered")
            .x_label_formatter(&|x| tidy(*x))
            .y_label_formatter(&|y| tidy(*y))
            .label_style((FONT, 13))
            .draw()?;
        let first = &r.recovery[0];
        let capacity = move |t: f64| (first.burst + first.rate * t).min(events);
        let ideal = first.ideal_seconds;
        chart
            .draw_series(LineSeries::new(
                [(0.0, capacity(0.0)), (ideal, events), (x_max, events)],
                BLACK.stroke_width(1),
            ))?
            .label(format!(
                "receiver capacity: {:.0} + {:.0}/s",
                first.burst, first.rate
            ))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(1)));
        for (k, run) in r.recovery.iter().enumerate() {
            let color = COLORS[k % COLORS.len()];
            let label = run.receiver();
            let line = std::iter::once((0.0, 0.0))
                .chain(run.curve.iter().map(|(t, n, _)| (*t, *n as f64)));
            chart
                .draw_series(LineSeries::new(line, color.stroke_width(2)))?
                .label(format!(
                    "{label}: {:.0} s, {:.2}× ideal, {:.1} % refused",
                    run.drain_seconds,
                    run.ratio(),
                    run.refused_share() * 100.0
                ))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 13))
            .draw()?;

        let limit_max = r
            .recovery
            .iter()
            .flat_map(|run| run.limits.iter().filter_map(|(_, l, _)| *l))
            .max()
            .unwrap_or(1) as f64;
        let refused_max = r
            .recovery
            .iter()
            .flat_map(|run| run.curve.iter().map(|(_, _, n)| *n))
            .max()
            .unwrap_or(0) as f64;
        let y_max = limit_max.max(refused_max).max(1.0) * 1.15;
        let mut chart = ChartBuilder::on(&bottom)
            .caption(
                "Concurrency limit (health record, every second) and 429s per second",
                (FONT, 16),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("seconds since the receiver came back")
            .y_desc("limit / 429 per s")
            .x_label_formatter(&|x| tidy(*x))
            .y_label_formatter(&|y| tidy(*y))
            .label_style((FONT, 13))
            .draw()?;
        for (k, run) in r.recovery.iter().enumerate() {
            let color = COLORS[k % COLORS.len()];
            let limits = run
                .limits
                .iter()
                .filter_map(|(t, l, _)| l.map(|l| (*t, f64::from(l))));
            chart
                .draw_series(LineSeries::new(limits, color.stroke_width(2)))?
                .label(format!("limit, {}", run.receiver()))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            let refused = run.curve.iter().map(|(t, _, n)| (*t, *n as f64));
            chart
                .draw_series(LineSeries::new(refused, color.mix(0.5).stroke_width(1)))?
                .label(format!("429 per second, {}", run.receiver()))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.mix(0.5).stroke_width(1))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font((FONT, 12))
            .draw()?;
        root.present()?;
    }
    Ok(Some(svg))
}
