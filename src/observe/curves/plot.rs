//! `oar plot`: a job's curves ([`crate::observe::curves`]) drawn to a PNG with plotters, the loss
//! above and the AUC below, against each trainer's samples: a line per trainer through its step
//! points, its pass figures as dots, the AUC over all trainers, the test set's and the next day's
//! as marks of their own. The text uses DejaVu Sans, built in (the `dejavu` crate), drawn with
//! plotters' `ab_glyph` backend, so drawing needs no font installed on the machine: plotters'
//! default `ttf` backend looks fonts up through fontconfig.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::observe::curves::{Kind, Point};

/// Pixels of the picture.
const SIZE: (u32, u32) = (1100, 800);

fn register_font() -> anyhow::Result<()> {
    static FONT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *FONT.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    anyhow::ensure!(ok, "the built-in font could not be loaded");
    Ok(())
}

/// The value a panel shows of a point.
type Value = fn(&Point) -> Option<f64>;

/// Reads the curves file `csv` and draws it to the PNG `out`; returns the points drawn.
pub fn draw_file(csv: &Path, out: &Path) -> anyhow::Result<usize> {
    crate::base::state_file::check_output(out, &[csv])?;
    let points = crate::observe::curves::read(csv)?;
    draw(&points, &format!("training curves: {}", csv.display()), out)?;
    Ok(points.len())
}

/// Draws `points` to the PNG `out`; `title` heads the picture.
pub fn draw(points: &[Point], title: &str, out: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(!points.is_empty(), "no curve points to draw");
    register_font()?;
    // Drawn beside `out`, then renamed over it: never written through a link at its name.
    let dir = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = out.file_name().with_context(|| format!("{}: no file name", out.display()))?;
    let tmp = dir.join(format!(".{}.{}.tmp.png", name.to_string_lossy(), std::process::id()));
    // Made here first, so nothing already at that name (a link) is drawn through.
    drop(crate::base::state_file::create_new(&tmp, 0o644)?);
    let drawn = draw_to(points, title, &tmp)
        .and_then(|()| std::fs::rename(&tmp, out).with_context(|| format!("cannot write {}", out.display())));
    if drawn.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    drawn
}

fn draw_to(points: &[Point], title: &str, out: &Path) -> anyhow::Result<()> {
    let root = BitMapBackend::new(out, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let (upper, lower) = root.split_vertically(SIZE.1 / 2 - 20);
    // Loss falls and AUC rises: the legend goes where the curves are not.
    panel(&upper, points, "loss", |p| p.loss, SeriesLabelPosition::LowerLeft)?;
    panel(&lower, points, "AUC", |p| p.auc, SeriesLabelPosition::LowerRight)?;
    root.present().with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}

fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    points: &[Point],
    name: &str,
    value: Value,
    legend: SeriesLabelPosition,
) -> anyhow::Result<()> {
    let shown: Vec<(f64, f64)> = points.iter().filter_map(|p| Some((p.samples as f64, value(p)?))).collect();
    if shown.is_empty() {
        area.draw(&Text::new(format!("no {name} measured"), (60, 60), ("sans-serif", 18)))?;
        return Ok(());
    }
    let x_max = shown.iter().map(|p| p.0).fold(1.0, f64::max) * 1.02;
    let (lo, hi) = shown.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    let pad = ((hi - lo) * 0.08).max(1e-3);
    let (bottom, top) = (lo - pad, hi + pad);
    // Finite values near f64's limits make an infinite range, on which the drawing library
    // loops for good (a launch that had succeeded spun at full CPU, deaf to SIGTERM).
    anyhow::ensure!(
        bottom.is_finite() && top.is_finite() && x_max.is_finite(),
        "{name} values from {lo} to {hi} are too far apart to draw"
    );
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..x_max, bottom..top)?;
    chart
        .configure_mesh()
        .x_desc("samples (per trainer)")
        .y_desc(name)
        .x_label_formatter(&|x| samples_label(*x))
        .y_label_formatter(&|y| value_label(*y))
        .label_style(("sans-serif", 14))
        .draw()?;
    // Grouped once: a scan of every point per trainer took 43 s for 100,000 trainers' lines.
    let mut by_trainer: std::collections::BTreeMap<u32, Vec<&Point>> = std::collections::BTreeMap::new();
    for p in points {
        by_trainer.entry(p.trainer).or_default().push(p);
    }
    anyhow::ensure!(
        by_trainer.len() <= crate::base::layout::MAX_PEERS,
        "{} trainers' curves: a job has at most {}",
        by_trainer.len(),
        crate::base::layout::MAX_PEERS
    );
    for (&t, mine) in &by_trainer {
        let color = Palette99::pick(t as usize).to_rgba();
        let of = |kind: Kind| -> Vec<(f64, f64)> {
            mine.iter().filter(|p| p.kind == kind).filter_map(|p| Some((p.samples as f64, value(p)?))).collect()
        };
        let steps = of(Kind::Steps);
        if !steps.is_empty() {
            chart
                .draw_series(LineSeries::new(steps, color.stroke_width(2)))?
                .label(format!("trainer {t}, every N steps"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        let passes = of(Kind::Pass);
        if !passes.is_empty() {
            chart
                .draw_series(passes.into_iter().map(|p| Circle::new(p, 5, color.filled())))?
                .label(format!("trainer {t}, pass"))
                .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
        }
    }
    let marks: [(Kind, &str, RGBColor); 3] = [
        (Kind::AllTrainers, "pass, all trainers", BLACK),
        (Kind::Test, "test", RED),
        (Kind::NextDay, "next day", BLUE),
    ];
    for (kind, label, color) in marks {
        let at: Vec<(f64, f64)> =
            points.iter().filter(|p| p.kind == kind).filter_map(|p| Some((p.samples as f64, value(p)?))).collect();
        if !at.is_empty() {
            chart
                .draw_series(at.into_iter().map(|p| TriangleMarker::new(p, 7, color.filled())))?
                .label(label)
                .legend(move |(x, y)| TriangleMarker::new((x + 10, y), 6, color.filled()));
        }
    }
    chart
        .configure_series_labels()
        .position(legend)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

/// A sample count as an axis shows it: 25k, 1.5M, 2.0e12.
fn samples_label(x: f64) -> String {
    if x >= 1e12 {
        format!("{x:.1e}")
    } else if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.0}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A loss or AUC as an axis shows it: three decimals, or three significant digits in
/// exponent form where decimals would print hundreds of digits (a diverged loss of 1e308)
/// or none (1e-9).
fn value_label(y: f64) -> String {
    if y != 0.0 && !(1e-3..1e6).contains(&y.abs()) {
        format!("{y:.2e}")
    } else {
        format!("{y:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_labels_stay_short_for_any_value() {
        assert_eq!(value_label(0.4512), "0.451");
        assert_eq!(value_label(0.0), "0.000");
        assert_eq!(value_label(-1e308), "-1.00e308");
        assert_eq!(value_label(2.5e-9), "2.50e-9");
        assert_eq!(samples_label(1.5e6), "1.5M");
        assert_eq!(samples_label(25_000.0), "25k");
        assert_eq!(samples_label(1.8e19), "1.8e19");
        for v in [f64::MAX, -f64::MAX, f64::MIN_POSITIVE, 1e-320, f64::NAN, f64::INFINITY] {
            assert!(value_label(v).len() <= 10 && samples_label(v.abs()).len() <= 10, "{v}");
        }
    }

    #[test]
    fn a_picture_is_drawn_with_curves_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("curves.png");
        let mut points = Vec::new();
        for t in 0..2u32 {
            for s in 1..=10u64 {
                let loss = Some(0.6 - 0.01 * s as f64);
                let auc = Some(0.6 + 0.01 * s as f64 + 0.005 * t as f64);
                points.push(Point {
                    trainer: t,
                    pass: 1,
                    step: s * 50,
                    samples: s * 25_600,
                    seconds: s as f64,
                    kind: Kind::Steps,
                    loss,
                    auc,
                });
            }
        }
        points.push(Point {
            trainer: 0,
            pass: 1,
            step: 500,
            samples: 256_000,
            seconds: 10.0,
            kind: Kind::Test,
            loss: Some(0.45),
            auc: Some(0.78),
        });
        draw(&points, "test job", &out).unwrap();
        let decoder = png::Decoder::new(std::fs::File::open(&out).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), SIZE);
        // Not a blank page: many pixels are neither white nor black (the curves' colours).
        let coloured = buf[..info.buffer_size()]
            .chunks(3)
            .filter(|p| !(p.iter().all(|&c| c > 240) || p.iter().all(|&c| c < 15)) && p[0].abs_diff(p[1]) > 40)
            .count();
        assert!(coloured > 500, "{coloured} coloured pixels");
        assert!(draw(&[], "empty", &out).is_err());
        // More trainers than a job has is refused, not drawn a legend entry each.
        let many: Vec<Point> =
            (0..=crate::base::layout::MAX_PEERS as u32).map(|t| Point { trainer: t, ..points[0] }).collect();
        let err = format!("{:#}", draw(&many, "many", &out).unwrap_err());
        assert!(err.contains("65537 trainers' curves: a job has at most 65536"), "{err}");
    }
}
