//! The bench's plots, drawn with plotters' bitmap backend into memory and
//! written with [`super::png`]: docs/latency.png (the latency CDF of the QD1
//! contenders), docs/iops-depth.png and docs/iops-size.png (the sweep's IOPS
//! against queue depth and against I/O size).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;

use super::png;
use crate::deps;

/// Image size in pixels.
const SIZE: (u32, u32) = (1000, 620);
/// Where Debian's fonts-dejavu-core puts its sans-serif face.
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// One line of the plot.
pub struct Line {
    /// Legend text.
    pub label: String,
    /// (latency µs, fraction of I/Os at or below), increasing.
    pub points: Vec<(f64, f64)>,
}

/// Finds (installing fonts-dejavu-core when missing) and registers the font
/// plotters draws text with.
fn register_font() -> Result<()> {
    let path = PathBuf::from(FONT);
    if !path.exists() {
        deps::apt_install(&["fonts-dejavu-core"])
            .context("the plot needs a TrueType font (fonts-dejavu-core)")?;
    }
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    // plotters keeps fonts for the life of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a usable TrueType font", path.display()))
}

/// Colours: upnvme variants in blues and greens, the floor in black (grey with
/// the SQ tail first), the kernel in warm colours.
fn colour(label: &str, i: usize) -> RGBColor {
    const UPNVME: [RGBColor; 4] = [
        RGBColor(0x1f, 0x4e, 0xd8),
        RGBColor(0x5a, 0x9b, 0xf0),
        RGBColor(0x17, 0x9c, 0x6e),
        RGBColor(0x7f, 0xc9, 0x7f),
    ];
    match label {
        l if l.starts_with("upnvme") => UPNVME[i % UPNVME.len()],
        l if l.contains("floor") && l.contains("SQ tail first") => RGBColor(0x99, 0x99, 0x99),
        l if l.contains("floor") => RGBColor(0x20, 0x20, 0x20),
        l if l.contains("io_uring") => RGBColor(0xd6, 0x27, 0x28),
        l if l.contains("pvsync2") => RGBColor(0xff, 0x7f, 0x0e),
        _ => RGBColor(0x9b, 0x4d, 0xca),
    }
}

/// The drawing area of a plot under construction.
type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// Registers the font, lets `draw` paint a white [`SIZE`] canvas and writes
/// it as a PNG to `out`.
fn render(out: &Path, draw: impl FnOnce(&Area<'_>) -> Result<()>) -> Result<()> {
    register_font()?;
    let mut rgb = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
        draw(&root)?;
        root.present().map_err(|e| anyhow!("{e}"))?;
    }
    let png = png::encode_rgb(SIZE.0, SIZE.1, &rgb);
    std::fs::write(out, png).with_context(|| format!("writing {}", out.display()))
}

/// Line width: the headline contenders (upnvme's default, io_uring) thicker.
fn width(label: &str) -> u32 {
    if label == "upnvme" || label.starts_with("upnvme QD") || label.contains("io_uring") {
        3
    } else {
        2
    }
}

/// Where a plot's legend goes.
pub use plotters::chart::SeriesLabelPosition as Legend;

/// Draws IOPS (y, linear from 0) against `x` on a log2 scale, for `lines` of
/// (x, IOPS) points, and writes it as a PNG to `out`. The x axis is labelled
/// at the powers of two only (`x_label` of the value), so a depth or size
/// sweep reads 1, 2, 4, … instead of a log scale's decimal ticks.
pub fn iops(
    lines: &[Line],
    title: &str,
    x_desc: &str,
    x_label: &dyn Fn(f64) -> String,
    legend: Legend,
    out: &Path,
) -> Result<()> {
    let lines: Vec<Line> = lines
        .iter()
        .filter(|l| !l.points.is_empty() && l.points.iter().all(|p| p.0 > 0.0))
        .map(|l| Line {
            label: l.label.clone(),
            points: l.points.iter().map(|&(x, y)| (x.log2(), y)).collect(),
        })
        .collect();
    let xs = || lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let (lo, hi) = (
        xs().fold(f64::INFINITY, f64::min),
        xs().fold(f64::NEG_INFINITY, f64::max),
    );
    if lines.is_empty() || hi <= lo {
        bail!("no IOPS data to plot (two x values or more are needed)");
    }
    let top = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        * 1.15;
    let (lo, hi) = (lo.floor() - 0.3, hi.ceil() + 0.3);
    // One label per power of two: (hi - lo) rounds to the count of integers.
    let ticks = (hi - lo).round() as usize;
    render(out, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 22))
            .margin(18)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(lo..hi, 0f64..top.max(1.0))
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc("IOPS (thousands)")
            .x_labels(ticks)
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() < 1e-6 {
                    x_label(v.round().exp2())
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| format!("{:.0}", v / 1000.0))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        let mut upnvme_seen = 0;
        let mut kernel_seen = 0;
        for l in &lines {
            let c = if l.label.starts_with("upnvme") {
                upnvme_seen += 1;
                colour(&l.label, upnvme_seen - 1)
            } else if l.label.contains("io_uring") {
                kernel_seen += 1;
                // A second io_uring line in dark red.
                if kernel_seen > 1 {
                    RGBColor(0x8c, 0x1c, 0x13)
                } else {
                    colour(&l.label, 0)
                }
            } else {
                colour(&l.label, 0)
            };
            let w = width(&l.label);
            chart
                .draw_series(LineSeries::new(l.points.clone(), c.stroke_width(w)))
                .map_err(|e| anyhow!("{e}"))?
                .label(l.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(w))
                });
            chart
                .draw_series(l.points.iter().map(|&p| Circle::new(p, 4, c.filled())))
                .map_err(|e| anyhow!("{e}"))?;
        }
        chart
            .configure_series_labels()
            .position(legend)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("{e}"))
    })
}

/// Draws the CDF of `lines` and writes it as a PNG to `out`.
pub fn latency_cdf(lines: &[Line], title: &str, out: &Path) -> Result<()> {
    let lines: Vec<&Line> = lines.iter().filter(|l| l.points.len() >= 2).collect();
    if lines.is_empty() {
        bail!("no latency data to plot");
    }
    // x range: from the smallest latency to the largest 99.9th percentile.
    let lo = lines
        .iter()
        .map(|l| l.points[0].0)
        .fold(f64::INFINITY, f64::min)
        .max(0.1);
    let hi = lines
        .iter()
        .map(|l| {
            l.points
                .iter()
                .find(|(_, f)| *f >= 0.999)
                .unwrap_or(l.points.last().expect("two points"))
                .0
        })
        .fold(0.0, f64::max)
        .max(lo * 2.0);
    let (lo, hi) = (lo * 0.9, hi * 1.1);
    render(out, |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 22))
            .margin(18)
            .x_label_area_size(50)
            .y_label_area_size(60)
            .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)
            .map_err(|e| anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("latency (µs, log scale)")
            .y_desc("fraction of I/Os at or below")
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .label_style(("sans-serif", 15))
            .axis_desc_style(("sans-serif", 17))
            .draw()
            .map_err(|e| anyhow!("{e}"))?;
        let mut upnvme_seen = 0;
        for l in &lines {
            let c = colour(&l.label, upnvme_seen);
            if l.label.starts_with("upnvme") {
                upnvme_seen += 1;
            }
            let w = width(&l.label);
            let pts: Vec<(f64, f64)> = l
                .points
                .iter()
                .copied()
                .filter(|(x, _)| *x >= lo && *x <= hi)
                .collect();
            chart
                .draw_series(LineSeries::new(pts, c.stroke_width(w)))
                .map_err(|e| anyhow!("{e}"))?
                .label(l.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(w))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 15))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow!("{e}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        if !Path::new(FONT).exists() {
            eprintln!("skipped: {FONT} is not installed");
            return;
        }
        let out = std::env::temp_dir().join(format!("xtask-plot-{}.png", std::process::id()));
        let lines = vec![
            Line {
                label: "upnvme".into(),
                points: vec![(8.0, 0.1), (20.0, 0.5), (90.0, 0.999), (200.0, 1.0)],
            },
            Line {
                label: "kernel io_uring hipri".into(),
                points: vec![(40.0, 0.01), (80.0, 0.5), (300.0, 1.0)],
            },
        ];
        latency_cdf(&lines, "test", &out).unwrap();
        let data = std::fs::read(&out).unwrap();
        assert!(data.starts_with(b"\x89PNG"));
        assert!(data.len() > 1000);
        let sweep = vec![
            Line {
                label: "upnvme".into(),
                points: vec![(1.0, 60e3), (2.0, 140e3), (128.0, 220e3)],
            },
            Line {
                label: "kernel io_uring hipri".into(),
                points: vec![(1.0, 20e3), (128.0, 120e3)],
            },
        ];
        iops(
            &sweep,
            "test",
            "queue depth",
            &|v| format!("{v:.0}"),
            Legend::UpperLeft,
            &out,
        )
        .unwrap();
        let data = std::fs::read(&out).unwrap();
        assert!(data.starts_with(b"\x89PNG") && data.len() > 1000);
        let one = vec![Line {
            label: "upnvme".into(),
            points: vec![(1.0, 1.0)],
        }];
        assert!(
            iops(
                &one,
                "test",
                "qd",
                &|v| format!("{v}"),
                Legend::UpperLeft,
                &out
            )
            .is_err()
        );
        std::fs::remove_file(out).unwrap();
    }
}
