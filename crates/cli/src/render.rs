//! Output for people: aligned tables that fit a 100-column terminal, and the cell formats
//! every command shares.

use serde_json::Value;

/// Widest output, so a table fits a 100-column terminal.
const WIDTH: u16 = 100;

/// An aligned table with a header row, at most [`WIDTH`] columns wide.
pub(crate) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    table_keeping(headers, rows, &[])
}

/// [`table`], the columns `whole` never wrapped (an id or a URL is copied from the
/// output): the others give up the width.
pub(crate) fn table_keeping(headers: &[&str], rows: &[Vec<String>], whole: &[usize]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
        .set_width(WIDTH)
        .set_header(headers.iter().copied());
    for r in rows {
        t.add_row(r.iter().map(String::as_str));
    }
    for &i in whole {
        if let Some(c) = t.column_mut(i) {
            c.set_constraint(comfy_table::ColumnConstraint::ContentWidth);
        }
    }
    // The preset pads every cell by one space on each side; lines keep no trailing blanks.
    let mut out: String = t
        .lines()
        .map(|l| {
            l.trim_end()
                .strip_prefix(' ')
                .unwrap_or(l.trim_end())
                .to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n");
    out.push('\n');
    out
}

/// A JSON value as a cell: strings bare, null as `-`, lists joined by commas.
pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Array(a) => a.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

pub(crate) fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// A fraction as a whole percentage, `-` when absent.
pub(crate) fn percent(v: &Value) -> String {
    num(v).map_or_else(|| "-".into(), |x| format!("{:.0}%", x * 100.0))
}

/// Seconds as milliseconds to a tenth, `-` when absent.
pub(crate) fn ms(v: &Value) -> String {
    num(v).map_or_else(|| "-".into(), |x| format!("{:.1}", x * 1000.0))
}

/// `running/waiting` from a load summary, `-` without a report.
pub(crate) fn run_wait(load: &Value) -> String {
    if load.is_null() {
        "-".into()
    } else {
        format!("{}/{}", text(&load["running"]), text(&load["waiting"]))
    }
}

/// A worker URL without its scheme, for narrow columns.
pub(crate) fn host(v: &Value) -> String {
    let t = text(v);
    t.split_once("://").map_or(t.clone(), |(_, h)| h.to_owned())
}

/// The short name of an inference route.
pub(crate) fn route_name(v: &Value) -> String {
    match v.as_str() {
        Some("/v1/chat/completions") => "chat".into(),
        Some("/v1/completions") => "completions".into(),
        Some("/generate") => "generate".into(),
        _ => text(v),
    }
}

/// At most `n` characters, the cut marked.
pub(crate) fn clip(t: String, n: usize) -> String {
    if t.chars().count() <= n {
        t
    } else {
        let mut c: String = t.chars().take(n.saturating_sub(1)).collect();
        c.push('…');
        c
    }
}
