//! Markdown tables for the report.

/// Escapes the characters that would break a Markdown table cell.
pub fn md_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// A Markdown table (cells are escaped).
pub fn md_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let esc = |cells: &[String]| {
        cells
            .iter()
            .map(|c| md_cell(c))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let headers: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    let mut s = format!(
        "| {} |\n|{}|\n",
        esc(&headers),
        vec!["---"; headers.len()].join("|")
    );
    for r in rows {
        s.push_str(&format!("| {} |\n", esc(r)));
    }
    s
}

/// A float with `digits` decimals (`NaN` spelled out).
pub fn f(x: f64, digits: usize) -> String {
    if x.is_nan() {
        "NaN".into()
    } else {
        format!("{x:.digits$}")
    }
}

/// An optional float with `digits` decimals, `–` when absent.
pub fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("–".into(), |x| f(x, digits))
}

/// The anchor GitHub gives a heading: lower case, spaces to `-`, every character that is not
/// alphanumeric, `-`, `_` or a space dropped.
pub fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}
