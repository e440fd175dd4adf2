//! The fleet's commands: workers (with their share of the index), loads, models, health,
//! and adding or removing a worker.

use serde_json::Value;

use crate::client::{Answer, Gateway, percent_encode};
use crate::index::index_shares;
use crate::render::{num, percent, run_wait, table, table_keeping, text};

/// The workers, each with its share of the prefix index's units.
pub(crate) async fn workers(gw: Gateway<'_>) -> anyhow::Result<Answer> {
    let (status, mut body) = gw.get("/workers").await?;
    if (200..300).contains(&status) {
        let (_, index) = gw.get("/admin/index").await?;
        let shares = index_shares(&index);
        for w in body["workers"].as_array_mut().into_iter().flatten() {
            w["index_share"] = shares
                .get(&text(&w["id"]))
                .map_or(Value::Null, |s| serde_json::json!(s));
        }
    }
    Ok(Answer {
        status,
        body,
        render: workers_table,
    })
}

pub(crate) async fn loads(gw: Gateway<'_>) -> anyhow::Result<Answer> {
    let (status, body) = gw.get("/workers").await?;
    Ok(Answer {
        status,
        body,
        render: loads_table,
    })
}

pub(crate) async fn models(gw: Gateway<'_>) -> anyhow::Result<Answer> {
    let (status, body) = gw.get("/v1/models").await?;
    Ok(Answer {
        status,
        body,
        render: |v| {
            let rows: Vec<Vec<String>> = v["data"]
                .as_array()
                .map(|d| {
                    d.iter()
                        .map(|m| vec![text(&m["id"]), text(&m["owned_by"])])
                        .collect()
                })
                .unwrap_or_default();
            table(&["MODEL", "OWNED-BY"], &rows)
        },
    })
}

pub(crate) async fn health(gw: Gateway<'_>) -> anyhow::Result<Answer> {
    let (status, body) = gw.get("/readiness").await?;
    Ok(Answer {
        status,
        body,
        render: |v| {
            format!(
                "{} ({} of {} workers healthy)\n",
                text(&v["status"]),
                text(&v["healthy_workers"]),
                text(&v["total_workers"])
            )
        },
    })
}

pub(crate) async fn add(gw: Gateway<'_>, worker_url: &str) -> anyhow::Result<Answer> {
    let (status, body) = gw
        .post("/workers", serde_json::json!({"url": worker_url}))
        .await?;
    Ok(Answer {
        status,
        body,
        render: |v| format!("added {} ({})\n", text(&v["url"]), text(&v["status"])),
    })
}

/// Removes a worker named by id or URL (a URL is one escaped path segment).
pub(crate) async fn remove(gw: Gateway<'_>, worker: &str) -> anyhow::Result<Answer> {
    let (status, body) = gw
        .delete(&format!("/workers/{}", percent_encode(worker)))
        .await?;
    Ok(Answer {
        status,
        body,
        render: |v| format!("removed {}\n", text(&v["worker"]["url"])),
    })
}

/// Where a worker came from: `config`, `api`, or, for a discovered one, its source and
/// pod (`kubernetes:ns/pod`).
fn source(w: &Value) -> String {
    match (w["namespace"].as_str(), w["pod"].as_str()) {
        (Some(ns), Some(pod)) => format!("{}:{ns}/{pod}", text(&w["source"])),
        _ => text(&w["source"]),
    }
}

/// The workers table; a `SOURCE` column (each worker's pod) only when some worker was
/// discovered, so the usual table keeps its width.
pub(crate) fn workers_table(v: &Value) -> String {
    let workers: Vec<&Value> = v["workers"].as_array().into_iter().flatten().collect();
    let pods = workers.iter().any(|w| w["pod"].is_string());
    let rows: Vec<Vec<String>> = (workers.iter())
        .map(|w| {
            let mut row = vec![
                text(&w["id"]),
                text(&w["url"]),
                text(&w["models"]),
                text(&w["status"]),
            ];
            if pods {
                row.push(source(w));
            }
            row.extend([
                text(&w["in_flight"]),
                run_wait(&w["load"]),
                percent(&w["load"]["kv_usage"]),
                percent(&w["index_share"]),
            ]);
            row
        })
        .collect();
    let mut headers = vec!["ID", "URL", "MODELS", "STATUS"];
    if pods {
        headers.push("SOURCE");
    }
    headers.extend(["IN-FLIGHT", "RUN/WAIT", "KV", "INDEX"]);
    table_keeping(&headers, &rows, &[0, 1])
}

fn loads_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let l = &w["load"];
            vec![
                text(&w["url"]),
                text(&l["ranks"]),
                text(&l["running"]),
                text(&l["waiting"]),
                percent(&l["kv_usage"]),
                num(&l["gen_throughput"]).map_or_else(|| "-".into(), |g| format!("{g:.1}")),
            ]
        })
        .collect();
    table(
        &["URL", "RANKS", "RUNNING", "WAITING", "KV", "GEN TOK/S"],
        &rows,
    )
}
