//! The heatmap: a matrix drawn white (0) to dark blue (1), its values written in the cells, with
//! a colour bar.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{draw_png, register_font};
use crate::context::LabError;

/// The heatmap's colour of a value in [0, 1]: white at 0, dark blue at 1.
fn heat(t: f64) -> RGBColor {
    RGBColor(
        (255.0 - t * 225.0) as u8,
        (255.0 - t * 175.0) as u8,
        (255.0 - t * 95.0) as u8,
    )
}

/// The heatmap's colour bar: the scale from 0 (bottom) to 1 (top), labelled every 0.25.
fn colour_bar(area: &DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String> {
    let (top, bottom, left, width) = (70i32, 650i32, 14i32, 26i32);
    let steps = 100;
    for k in 0..steps {
        let t = k as f64 / (steps - 1) as f64;
        let y0 = bottom - ((bottom - top) as f64 * (k + 1) as f64 / steps as f64) as i32;
        let y1 = bottom - ((bottom - top) as f64 * k as f64 / steps as f64) as i32;
        area.draw(&Rectangle::new(
            [(left, y0), (left + width, y1)],
            heat(t).filled(),
        ))
        .map_err(|e| e.to_string())?;
    }
    area.draw(&Rectangle::new(
        [(left, top), (left + width, bottom)],
        BLACK.stroke_width(1),
    ))
    .map_err(|e| e.to_string())?;
    for k in 0..=4 {
        let t = k as f64 / 4.0;
        let y = bottom - ((bottom - top) as f64 * t) as i32;
        area.draw(&Text::new(
            format!("{t:.2}"),
            (left + width + 6, y - 7),
            ("sans-serif", 14).into_font(),
        ))
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Draws a matrix as a heatmap (white = 0, dark blue = 1) with the values written in the cells;
/// row 0 is at the top.
pub fn heatmap(
    path: &Path,
    title: &str,
    matrix: &[Vec<f64>],
    x_label: &str,
    y_label: &str,
) -> Result<(), LabError> {
    register_font();
    draw_png(path, (860, 720), |root| {
        heatmap_on(path, title, matrix, x_label, y_label, root)
    })
}

fn heatmap_on(
    path: &Path,
    title: &str,
    matrix: &[Vec<f64>],
    x_label: &str,
    y_label: &str,
    root: DrawingArea<BitMapBackend<'_>, Shift>,
) -> Result<(), LabError> {
    let rows = matrix.len();
    let cols = matrix.first().map_or(0, |r| r.len());
    root.fill(&WHITE).map_err(|e| LabError::io(path, e))?;
    let (map_area, bar_area) = root.split_horizontally(760);
    let flip = |i: f64| (rows as f64 - 1.0) - i;
    let draw = || -> Result<(), String> {
        colour_bar(&bar_area)?;
        let mut chart = ChartBuilder::on(&map_area)
            .caption(title, ("sans-serif", 24))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(60)
            .build_cartesian_2d(-0.5..cols as f64 - 0.5, -0.5..rows as f64 - 0.5)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_labels(cols.min(16))
            .y_labels(rows.min(16))
            .x_label_formatter(&|x| format!("{}", x.round() as i64))
            .y_label_formatter(&|y| format!("{}", flip(y.round()) as i64))
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()
            .map_err(|e| e.to_string())?;
        for (i, row) in matrix.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let t = v.clamp(0.0, 1.0);
                let color = heat(t);
                let (x, y) = (j as f64, flip(i as f64));
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)],
                        color.filled(),
                    )))
                    .map_err(|e| e.to_string())?;
                if rows <= 16 && cols <= 16 {
                    let text_color = if t > 0.55 { WHITE } else { BLACK };
                    chart
                        .draw_series(std::iter::once(Text::new(
                            format!("{v:.2}"),
                            (x - 0.3, y + 0.15),
                            ("sans-serif", 15).into_font().color(&text_color),
                        )))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    };
    draw().map_err(|e| LabError::io(path, e))?;
    root.present().map_err(|e| LabError::io(path, e))
}
