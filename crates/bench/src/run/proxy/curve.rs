//! `kvgate-bench proxy --sweep-kib ...`: the proxy run at each prompt size, and the cost
//! curve drawn from it, req/s and added p50 against the body's size, one line per target.

use std::fmt::Write as _;

use kvgate_bench::escape;
use serde::Serialize;

use super::ProxyRow;

/// One size's run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CurvePoint {
    pub kib: usize,
    pub body_bytes: usize,
    pub rows: Vec<ProxyRow>,
}

const W: f64 = 420.0;
const H: f64 = 360.0;
const LEFT: f64 = 60.0;
const TOP: f64 = 60.0;
const PLOT_W: f64 = 320.0;
const PLOT_H: f64 = 230.0;
const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

/// The targets in the order they first appear, `direct` left out (it is what "added" is
/// measured against).
pub(crate) fn targets(points: &[CurvePoint]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in points.iter().flat_map(|p| &p.rows) {
        if r.target != "direct" && !out.contains(&r.target) {
            out.push(r.target.clone());
        }
    }
    out
}

/// A log-scaled axis over `[lo, hi]`, widened to whole decades.
struct LogAxis {
    lo: f64,
    hi: f64,
}

impl LogAxis {
    fn over(values: impl Iterator<Item = f64>) -> Self {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for v in values.filter(|v| *v > 0.0 && v.is_finite()) {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !lo.is_finite() {
            (lo, hi) = (1.0, 10.0);
        }
        let lo = 10f64.powf(lo.log10().floor());
        let hi = 10f64.powf(hi.log10().ceil()).max(lo * 10.0);
        Self { lo, hi }
    }

    /// Where `v` falls, 0 at `lo` and 1 at `hi`.
    fn at(&self, v: f64) -> f64 {
        (v.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
    }

    /// 1, 2 and 5 of each decade.
    fn ticks(&self) -> Vec<f64> {
        let mut out = Vec::new();
        let mut decade = self.lo;
        while decade <= self.hi * 1.0001 {
            for m in [1.0, 2.0, 5.0] {
                let v = decade * m;
                if v <= self.hi * 1.0001 {
                    out.push(v);
                }
            }
            decade *= 10.0;
        }
        out
    }
}

fn label(v: f64) -> String {
    if v >= 1000.0 {
        format!("{}k", v / 1000.0)
    } else {
        format!("{v}")
    }
}

/// One panel: `metric` of every target against the body size.
fn panel(
    s: &mut String,
    x0: f64,
    title: &str,
    points: &[CurvePoint],
    names: &[String],
    metric: fn(&ProxyRow) -> Option<f64>,
) {
    let sizes = LogAxis::over(points.iter().map(|p| p.kib as f64));
    let values = LogAxis::over(points.iter().flat_map(|p| &p.rows).filter_map(metric));
    let (left, base) = (x0 + LEFT, TOP + PLOT_H);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" font-weight="bold">{}</text>"#,
        left,
        TOP - 12.0,
        escape(title)
    );
    for v in values.ticks() {
        let y = base - values.at(v) * PLOT_H;
        let _ = writeln!(
            s,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{}</text>"##,
            left + PLOT_W,
            left - 4.0,
            y + 4.0,
            label(v)
        );
    }
    for p in points {
        let x = left + sizes.at(p.kib as f64) * PLOT_W;
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{base}" stroke="#eee"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            base + 14.0,
            p.kib
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">prompt body, KiB (log scale)</text>"##,
        left + PLOT_W / 2.0,
        base + 30.0
    );
    for (i, name) in names.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| {
                let r = p.rows.iter().find(|r| &r.target == name)?;
                let v = metric(r).filter(|v| *v > 0.0)?;
                Some((
                    left + sizes.at(p.kib as f64) * PLOT_W,
                    base - values.at(v) * PLOT_H,
                ))
            })
            .collect();
        let path: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for (x, y) in pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
            );
        }
        let ly = base + 48.0 + 14.0 * (i / 2) as f64;
        let lx = left + (i % 2) as f64 * PLOT_W / 2.0;
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{:.1}" width="10" height="10" fill="{colour}"/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
            ly - 9.0,
            lx + 14.0,
            escape(name)
        );
    }
}

/// The cost curve as an SVG document: req/s and added p50 (one connection) against size.
pub(crate) fn chart(points: &[CurvePoint], subtitle: &str) -> String {
    let names = targets(points);
    let height = H + 14.0 * names.len().div_ceil(2) as f64;
    let width = 2.0 * W;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="14" font-weight="bold">Proxy cost against prompt size</text>"#
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="34" fill="#555">{}</text>"##,
        escape(subtitle)
    );
    panel(
        &mut s,
        0.0,
        "req/s at saturation (higher is better)",
        points,
        &names,
        |r| Some(r.req_per_sec),
    );
    panel(
        &mut s,
        W,
        "added p50 on one connection, ms (lower is better)",
        points,
        &names,
        |r| r.added_p50_ms,
    );
    s.push_str("</svg>\n");
    s
}

/// The stdout table of a sweep: each target's req/s and added p50 at each size, and
/// kvgate's req/s as a fraction of nginx's.
pub(crate) fn table(points: &[CurvePoint]) -> String {
    let names = targets(points);
    let mut s = String::new();
    let _ = write!(s, "{:>6}", "KiB");
    for n in &names {
        let _ = write!(s, " {:>24}", format!("{n} req/s (+p50 ms)"));
    }
    s.push('\n');
    for p in points {
        let _ = write!(s, "{:>6}", p.kib);
        let nginx = p
            .rows
            .iter()
            .find(|r| r.target == "nginx")
            .map(|r| r.req_per_sec);
        for n in &names {
            let cell = match p.rows.iter().find(|r| &r.target == n) {
                None => "-".to_owned(),
                Some(r) => {
                    let ratio = match nginx {
                        Some(f) if f > 0.0 && n != "nginx" => {
                            format!(" {:.2}x", r.req_per_sec / f)
                        }
                        _ => String::new(),
                    };
                    let added = r.added_p50_ms.map_or("-".into(), |a| format!("{a:+.3}"));
                    format!("{:.0}{ratio} ({added})", r.req_per_sec)
                }
            };
            let _ = write!(s, " {cell:>24}");
        }
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str, rps: f64, added: f64) -> ProxyRow {
        ProxyRow {
            target: target.into(),
            req_per_sec: rps,
            added_p50_ms: Some(added),
            ..ProxyRow::default()
        }
    }

    fn points() -> Vec<CurvePoint> {
        [(1, 20_000.0), (256, 900.0)]
            .into_iter()
            .map(|(kib, rps)| CurvePoint {
                kib,
                body_bytes: kib * 1024,
                rows: vec![
                    row("direct", rps * 2.0, 0.0),
                    row("kvgate", rps, 0.1),
                    row("nginx", rps * 1.25, 0.05),
                ],
            })
            .collect()
    }

    #[test]
    fn the_chart_draws_a_line_per_target_but_direct() {
        let svg = chart(&points(), "test");
        assert_eq!(svg.matches("<polyline").count(), 4, "2 targets × 2 panels");
        assert!(svg.contains(">kvgate<") && svg.contains(">nginx<"));
        assert!(!svg.contains(">direct<"));
    }

    #[test]
    fn the_table_gives_kvgate_against_the_floor() {
        let t = table(&points());
        assert!(t.contains("900 0.80x (+0.100)"), "{t}");
        assert!(t.contains("20000 0.80x (+0.100)"), "{t}");
    }

    #[test]
    fn log_axes_cover_whole_decades() {
        let a = LogAxis::over([3.0, 700.0].into_iter());
        assert_eq!((a.lo, a.hi), (1.0, 1000.0));
        assert!((a.at(10.0) - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(a.ticks().first(), Some(&1.0));
        assert_eq!(a.ticks().last(), Some(&1000.0));
    }
}
