//! PNG plots of a run, drawn with plotters' bitmap backend.
//!
//! Text is rendered with ab_glyph from a TrueType font found at run time
//! under /usr/share/fonts (Debian's fonts-dejavu-core: DejaVu Sans). The
//! choice: plotters' default `ttf` feature goes through font-kit, which
//! needs fontconfig and freetype development libraries to build; ab_glyph
//! is pure Rust, and a font file read at run time keeps a binary font out
//! of the repository. Without any font the plots are skipped, and the
//! report says why.
//!
//! Plots:
//! - `sweep-p99.png`: per-chunk p99 vs concurrent streams (log-log) for
//!   direct, nginx and speedtap, with the target (direct's p99 + 1 ms);
//!   log scales because the figures span 0.1 ms to a second once the
//!   machine is saturated;
//! - `chunk-latency-cdf.png`: per-chunk latency CDF of every arm in the
//!   many-streams workload (log-scale latency), the floor included.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::arms::ArmKind;
use crate::report::Report;

/// Preferred fonts first; any other .ttf under /usr/share/fonts will do.
const FONTS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn any_ttf(dir: &Path, depth: usize) -> Option<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in &entries {
        if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("ttf")) {
            return Some(p.clone());
        }
    }
    if depth == 0 {
        return None;
    }
    entries
        .iter()
        .filter(|p| p.is_dir())
        .find_map(|p| any_ttf(p, depth - 1))
}

/// Registers a font as "sans-serif" (once per process).
fn register_font() -> Result<(), String> {
    let path = FONTS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| any_ttf(Path::new("/usr/share/fonts"), 3))
        .ok_or("no TrueType font under /usr/share/fonts (install fonts-dejavu-core)")?;
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    // plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{} is not a usable font", path.display()))
}

fn color(kind: ArmKind) -> RGBColor {
    match kind {
        ArmKind::Direct => RGBColor(110, 110, 110),
        ArmKind::Speedtap => RGBColor(214, 39, 40),
        ArmKind::Capture => RGBColor(255, 127, 14),
        ArmKind::Nginx => RGBColor(31, 119, 180),
        ArmKind::Litellm => RGBColor(44, 160, 44),
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// One plot's drawing function.
type Drawer = fn(&Report, &Path) -> DrawResult;

fn sweep_plot(report: &Report, path: &Path) -> DrawResult {
    let series: Vec<(ArmKind, Vec<(f64, f64)>)> =
        [ArmKind::Direct, ArmKind::Nginx, ArmKind::Speedtap]
            .into_iter()
            .map(|k| {
                let pts = report
                    .sweep_series(k)
                    .into_iter()
                    .map(|(n, us)| (n as f64, (us / 1_000.0).max(0.001)))
                    .collect();
                (k, pts)
            })
            .collect();
    // The target, drawn where it applies: direct's p99 plus 1 ms.
    let target: Vec<(f64, f64)> = series
        .iter()
        .find(|(k, _)| *k == ArmKind::Direct)
        .map(|(_, p)| p.iter().map(|&(n, ms)| (n, ms + 1.0)).collect())
        .unwrap_or_default();
    let ys = series.iter().flat_map(|(_, p)| p.iter().map(|(_, y)| *y));
    let (lo, hi) = ys.fold((f64::MAX, 2.0f64), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let lo = if lo == f64::MAX { 0.01 } else { lo };
    let max_n = report
        .sweep
        .iter()
        .map(|l| l.streams)
        .max()
        .unwrap_or(10)
        .max(10) as f64;
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Per-chunk p99 vs concurrent streams at 20 tok/s",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d(
            (0.8f64..max_n * 1.25).log_scale(),
            (lo * 0.7..hi * 1.5).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("concurrent streams")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("p99 send-to-arrival (ms, log scale)")
        .y_label_formatter(&|y| format!("{y}"))
        .label_style(("sans-serif", 14))
        .draw()?;
    let orange = RGBColor(255, 127, 14);
    chart
        .draw_series(LineSeries::new(target, orange.stroke_width(1)))?
        .label("target: direct + 1 ms")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], orange.stroke_width(1)));
    for (kind, pts) in &series {
        let c = color(*kind);
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(kind.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn cdf_plot(report: &Report, path: &Path) -> DrawResult {
    const POINTS: usize = 400;
    let mut series = Vec::new();
    for arm in &report.arms {
        let Some(r) = &arm.result else { continue };
        let mut v = r.multi.chunk_ns.clone();
        if v.is_empty() {
            continue;
        }
        v.sort_unstable();
        let pts: Vec<(f64, f64)> = (0..=POINTS)
            .map(|q| {
                let i = q * (v.len() - 1) / POINTS;
                ((v[i] as f64 / 1_000.0).max(1.0), q as f64 / POINTS as f64)
            })
            .collect();
        series.push((arm.kind, pts));
    }
    let max_x = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
        .fold(100.0f64, f64::max);
    let min_x = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(x, _)| *x))
        .fold(max_x, f64::min);
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Per-chunk latency, {} streams at 40 tok/s (CDF)",
                report.plan.multi_streams
            ),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((min_x * 0.8..max_x * 1.25).log_scale(), 0f64..1.0)?;
    chart
        .configure_mesh()
        .x_desc("send to arrival (µs, log scale)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("fraction of chunks")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (kind, pts) in series {
        let c = color(kind);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))?
            .label(kind.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Draws every plot into `dir`; the file names written.
pub fn draw(report: &Report, dir: &Path) -> Result<Vec<String>, String> {
    register_font()?;
    let mut files = Vec::new();
    let jobs: [(&str, Drawer); 2] = [
        ("chunk-latency-cdf.png", cdf_plot),
        ("sweep-p99.png", sweep_plot),
    ];
    for (name, draw) in jobs {
        if name.starts_with("sweep") && report.sweep.is_empty() {
            continue;
        }
        draw(report, &dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
        files.push(name.to_owned());
    }
    Ok(files)
}
