//! A hand-written SVG bar chart: side-by-side panels, one bar per policy in each.

use std::fmt::Write as _;

/// One bar; `None` draws as "n/a" (no completed requests, or an engine that got none).
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub value: Option<f64>,
}

/// One panel: a metric compared across policies, with an optional dashed target line.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: String,
    pub bars: Vec<Bar>,
    pub target: Option<(f64, String)>,
}

const PANEL_W: f64 = 320.0;
const PANEL_H: f64 = 340.0;
const TOP: f64 = 60.0;
const PLOT_H: f64 = 190.0;
const LEFT: f64 = 50.0;
/// Room left of the first panel for its rotated labels.
const PAD: f64 = 50.0;
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

/// The whole chart as an SVG document.
pub fn chart(title: &str, subtitle: &str, panels: &[Panel]) -> String {
    let width = PAD + PANEL_W * panels.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{PANEL_H}" viewBox="0 0 {width} {PANEL_H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="34" fill="#555">{}</text>"##,
        escape(subtitle)
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut s, PAD + i as f64 * PANEL_W, p);
    }
    s.push_str("</svg>\n");
    s
}

fn panel(s: &mut String, x0: f64, p: &Panel) {
    let plot_w = PANEL_W - LEFT - 20.0;
    let base = TOP + PLOT_H;
    let top_value = p
        .bars
        .iter()
        .filter_map(|b| b.value)
        .chain(p.target.as_ref().map(|t| t.0))
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let scale_max = if top_value > 0.0 {
        top_value * 1.15
    } else {
        1.0
    };
    let y_of = |v: f64| base - (v / scale_max).clamp(0.0, 1.0) * PLOT_H;

    // The target's name goes by the title, where no bar label can cover it.
    let title = match &p.target {
        Some((_, label)) => format!("{} (dashed: {label})", p.title),
        None => p.title.clone(),
    };
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" font-weight="bold">{}</text>"#,
        x0 + LEFT - 30.0,
        TOP - 12.0,
        escape(&title)
    );
    // Axes and a mid gridline with its value.
    let _ = writeln!(
        s,
        r#"<line x1="{:.1}" y1="{TOP:.1}" x2="{:.1}" y2="{base:.1}" stroke="black"/>"#,
        x0 + LEFT,
        x0 + LEFT
    );
    let _ = writeln!(
        s,
        r#"<line x1="{:.1}" y1="{base:.1}" x2="{:.1}" y2="{base:.1}" stroke="black"/>"#,
        x0 + LEFT,
        x0 + LEFT + plot_w
    );
    for frac in [0.5, 1.0] {
        let v = scale_max * frac;
        let y = y_of(v);
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
            x0 + LEFT,
            x0 + LEFT + plot_w
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            x0 + LEFT - 4.0,
            y + 4.0,
            number(v)
        );
    }
    let n = p.bars.len().max(1) as f64;
    let slot = plot_w / n;
    let bar_w = (slot * 0.7).min(40.0);
    for (i, b) in p.bars.iter().enumerate() {
        let cx = x0 + LEFT + slot * (i as f64 + 0.5);
        let color = PALETTE[i % PALETTE.len()];
        match b.value.filter(|v| v.is_finite()) {
            Some(v) => {
                let y = y_of(v);
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{y:.1}" width="{bar_w:.1}" height="{:.1}" fill="{color}"/>"#,
                    cx - bar_w / 2.0,
                    base - y
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                    y - 3.0,
                    number(v)
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    r##"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" fill="#999">n/a</text>"##,
                    base - 4.0
                );
            }
        }
        let _ = writeln!(
            s,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="end" transform="rotate(-35 {cx:.1} {:.1})">{}</text>"#,
            base + 14.0,
            base + 14.0,
            escape(&b.label)
        );
    }
    if let Some((v, _)) = &p.target {
        let y = y_of(*v);
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#c00" stroke-dasharray="4 3"/>"##,
            x0 + LEFT,
            x0 + LEFT + plot_w
        );
    }
}

/// A short human number: 3 significant digits, no exponent.
fn number(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Text as XML character data or an attribute value.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}
