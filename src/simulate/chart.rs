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

/// Renders the report's curves (mean over seeds) from 75% arrival on.
pub fn svg(report: &Report) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (900, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
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
            .flat_map(|p| p.curve.iter())
            .filter(|c| c.arrived_pct >= x_min)
            .map(|c| 100.0 - c.allocated_pct)
            .fold(0.0f64, f64::max)
            .max(1.0)
            * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "Unallocated GPU vs arrived workload ({} GPUs, mean of {} seeds)",
                    report.gpus_total,
                    report.seeds.len()
                ),
                ("sans-serif", 20),
            )
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d(f64::from(x_min)..f64::from(x_max), 0.0..y_max)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("Arrived workload (% of GPU capacity)")
            .y_desc("Unallocated GPU (%)")
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, p) in report.policies.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<(f64, f64)> = p
                .curve
                .iter()
                .filter(|c| c.arrived_pct >= x_min && c.seeds > 0)
                .map(|c| (f64::from(c.arrived_pct), 100.0 - c.allocated_pct))
                .collect();
            chart
                .draw_series(LineSeries::new(points, color.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(p.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}
