//! `decisions`: recent routing decisions and what the engines reported for them, once or
//! followed as they come.

use std::time::Duration;

use serde_json::Value;

use crate::client::{Answer, Gateway, ensure_ok};
use crate::render::{clip, host, num, route_name, table, text};

pub(crate) async fn decisions(gw: Gateway<'_>, limit: usize) -> anyhow::Result<Answer> {
    let (status, body) = gw.get(&format!("/admin/decisions?limit={limit}")).await?;
    Ok(Answer {
        status,
        body,
        render: decisions_table,
    })
}

/// Prints decisions as they come, polling every half second.
pub(crate) async fn follow(gw: Gateway<'_>, limit: usize, json: bool) -> anyhow::Result<()> {
    let mut since: Option<u64> = None;
    let mut first = true;
    loop {
        let path = match since {
            Some(s) => format!("/admin/decisions?since={s}&limit=1000"),
            None => format!("/admin/decisions?limit={limit}"),
        };
        let (status, v) = gw.get(&path).await?;
        ensure_ok(status, &v)?;
        if json {
            for d in v["decisions"].as_array().into_iter().flatten() {
                println!("{d}");
            }
        } else {
            let rows = decision_rows(&v);
            if !rows.is_empty() || first {
                let t = table(&DECISION_HEADERS, &rows);
                // The header once; later batches add rows.
                let skip = usize::from(!first);
                for line in t.lines().skip(skip) {
                    println!("{line}");
                }
                first = false;
            }
        }
        since = v["last_seq"].as_u64().or(since);
        actix_rt::time::sleep(Duration::from_millis(500)).await;
    }
}

fn decision_rows(v: &Value) -> Vec<Vec<String>> {
    v["decisions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            let a = &d["answer"];
            vec![
                text(&d["seq"]),
                clip(text(&d["request_id"]), 12),
                route_name(&d["route"]),
                host(&d["worker"]),
                text(&d["path"]),
                text(&d["predicted_cached_tokens"]),
                text(&a["reported_cached_tokens"]),
                num(&a["ttft_ms"]).map_or_else(|| "-".into(), |t| format!("{t:.1}")),
                text(&a["outcome"]),
            ]
        })
        .collect()
}

/// The time of each decision is in `--json`; the table keeps to 100 columns.
const DECISION_HEADERS: [&str; 9] = [
    "SEQ", "REQUEST", "ROUTE", "WORKER", "PATH", "PREDICT", "REPORT", "TTFT MS", "RESULT",
];

fn decisions_table(v: &Value) -> String {
    table(&DECISION_HEADERS, &decision_rows(v))
}
