//! PURE: the chart of unallocated GPU % against arrived % per policy (like the FGD paper's
//! Fig. 9(a)), as an SVG string.

use plotters::prelude::*;

use super::report::Report;

const COLORS: [RGBColor; 9] = [
    RGBColor(127, 127, 127),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
];

/// A panel's view: arrived % and unallocated % ranges.
struct View {
    x: (u32, u32),
    y: (f64, f64),
}

/// The points of a policy's curve inside `x` (mean over seeds; buckets no seed reached left out).
fn points(p: &super::report::PolicyReport, x: (u32, u32)) -> Vec<(f64, f64)> {
    p.curve
        .iter()
        .filter(|c| c.arrived_pct >= x.0 && c.arrived_pct <= x.1 && c.seeds > 0)
        .map(|c| (f64::from(c.arrived_pct), 100.0 - c.allocated_pct))
        .collect()
}

/// The two panels: every curve from 75% arrival on, and a zoom on the (up to) two policies
/// lowest at the end, from where they have all come down to near their final level (not before
/// 95% arrival), where the best policies differ by tenths of a point. Returns the zoomed
/// policies' indexes too: the zoom draws only them, so no curve leaves its panel.
fn views(report: &Report) -> (View, View, Vec<usize>) {
    let x_max = report
        .policies
        .iter()
        .flat_map(|p| p.curve.last())
        .map(|c| c.arrived_pct)
        .max()
        .unwrap_or(100)
        .max(80);
    let x_min = 75u32.min(x_max.saturating_sub(5));
    let y_max = report
        .policies
        .iter()
        .flat_map(|p| points(p, (x_min, x_max)))
        .map(|(_, y)| y)
        .fold(0.0f64, f64::max)
        .max(1.0)
        * 1.1;
    let full = View {
        x: (x_min, x_max),
        y: (0.0, y_max),
    };
    let from = 95u32.min(x_max.saturating_sub((x_max - x_min) / 5));
    let mut ends: Vec<(f64, usize)> = report
        .policies
        .iter()
        .enumerate()
        .filter_map(|(i, p)| points(p, (from, x_max)).last().map(|(_, y)| (*y, i)))
        .collect();
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let lowest: Vec<usize> = ends.iter().take(2).map(|(_, i)| *i).collect();
    let curves: Vec<Vec<(f64, f64)>> = lowest
        .iter()
        .map(|i| points(&report.policies[*i], (from, x_max)))
        .collect();
    let (Some(first), Some(last)) = (ends.first(), ends.get(lowest.len().saturating_sub(1))) else {
        return (
            full,
            View {
                x: (from, x_max),
                y: (0.0, y_max),
            },
            lowest,
        );
    };
    // Near the final level: within twice the spread of the ends (at least half a point).
    let cap = last.0 + (last.0 - first.0).max(0.5) * 2.0;
    let start = curves
        .iter()
        .map(|c| {
            // The first x from which this curve stays under the cap.
            c.iter()
                .rposition(|(_, y)| *y > cap)
                .map_or(from, |k| c.get(k + 1).map_or(x_max, |(x, _)| *x as u32))
        })
        .max()
        .unwrap_or(from)
        .min(x_max.saturating_sub(1));
    let ys: Vec<f64> = curves
        .iter()
        .flatten()
        .filter(|(x, _)| *x >= f64::from(start))
        .map(|(_, y)| *y)
        .collect();
    let lo = ys.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let pad = ((hi - lo) * 0.1).max(0.05);
    let zoom = View {
        x: (start, x_max),
        y: ((lo - pad).max(0.0), hi + pad),
    };
    (full, zoom, lowest)
}

/// Why the chart could not be drawn (plotters' error for the SVG backend).
pub type ChartError = DrawingAreaErrorKind<std::io::Error>;

/// Renders the report's curves (mean over seeds): every policy from 75% arrival on, above, and
/// the lowest ones zoomed in, below; the legend sits to the right of both.
pub fn svg(report: &Report) -> Result<String, ChartError> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (960, 900)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(
            &format!(
                "Unallocated GPU vs arrived workload ({} GPUs, mean of {} seeds; lower is better)",
                report.gpus_total,
                report.seeds.len()
            ),
            ("sans-serif", 20),
        )?;
        let (plots, legend) = root.split_horizontally(780);
        let (top, bottom) = plots.split_vertically(470);
        let (full, zoom, lowest) = views(report);
        let every: Vec<usize> = (0..report.policies.len()).collect();
        for (area, view, title, shown) in [
            (&top, &full, "every policy".to_string(), &every),
            (
                &bottom,
                &zoom,
                format!("the {} lowest, zoomed in", lowest.len()),
                &lowest,
            ),
        ] {
            let mut chart = ChartBuilder::on(area)
                .caption(&title, ("sans-serif", 15))
                .margin(10)
                .margin_right(28)
                .x_label_area_size(44)
                .y_label_area_size(56)
                .build_cartesian_2d(f64::from(view.x.0)..f64::from(view.x.1), view.y.0..view.y.1)?;
            chart
                .configure_mesh()
                .x_desc("Arrived workload (% of GPU capacity)")
                .y_desc("Unallocated GPU (%)")
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| {
                    if view.y.1 - view.y.0 < 2.0 {
                        format!("{v:.2}")
                    } else {
                        format!("{v:.1}")
                    }
                })
                .draw()?;
            for &i in shown {
                let color = COLORS[i % COLORS.len()];
                chart.draw_series(LineSeries::new(
                    points(&report.policies[i], view.x),
                    color.stroke_width(2),
                ))?;
            }
        }
        // The legend, in its own column right of the plots: it covers no curve.
        for (i, p) in report.policies.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let y = 60 + 24 * i32::try_from(i).unwrap_or(0);
            legend.draw(&PathElement::new(
                vec![(8, y), (34, y)],
                color.stroke_width(3),
            ))?;
            legend.draw(&Text::new(
                p.name.clone(),
                (42, y - 7),
                ("sans-serif", 14).into_font(),
            ))?;
        }
        root.present()?;
    }
    Ok(out)
}
