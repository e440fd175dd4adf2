//! The prefix index's command: units per model and worker, with each worker's URL and its
//! share of all units.

use std::collections::HashMap;

use serde_json::Value;

use crate::client::{Answer, Gateway};
use crate::render::{num, table, text};

/// The index, `model`'s only when given, each worker named by its URL where the gateway
/// knows it.
pub(crate) async fn index(gw: Gateway<'_>, model: Option<&str>) -> anyhow::Result<Answer> {
    let (status, mut body) = gw.get("/admin/index").await?;
    if (200..300).contains(&status) {
        let (_, workers) = gw.get("/workers").await?;
        let urls: HashMap<String, Value> = workers["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| (text(&w["id"]), w["url"].clone()))
            .collect();
        if let Some(models) = body["models"].as_array_mut() {
            if let Some(m) = model {
                models.retain(|x| x["model"].as_str() == Some(m));
            }
            for w in models
                .iter_mut()
                .flat_map(|m| m["per_worker"].as_array_mut().into_iter().flatten())
            {
                w["url"] = urls
                    .get(&text(&w["worker"]))
                    .cloned()
                    .unwrap_or(Value::Null);
            }
        }
    }
    Ok(Answer {
        status,
        body,
        render: index_table,
    })
}

/// Each worker's share of the prefix index's units, over all models, by worker id.
pub(crate) fn index_shares(index: &Value) -> HashMap<String, f64> {
    let mut units: HashMap<String, f64> = Default::default();
    for m in index["models"].as_array().into_iter().flatten() {
        for w in m["per_worker"].as_array().into_iter().flatten() {
            *units.entry(text(&w["worker"])).or_default() += num(&w["units"]).unwrap_or(0.0);
        }
    }
    let total: f64 = units.values().sum();
    units
        .into_iter()
        .map(|(k, u)| (k, if total > 0.0 { u / total } else { 0.0 }))
        .collect()
}

fn index_table(v: &Value) -> String {
    let shares = index_shares(v);
    let rows: Vec<Vec<String>> = v["models"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| {
            let model = text(&m["model"]);
            let shares = &shares;
            m["per_worker"]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |w| {
                    let id = text(&w["worker"]);
                    vec![
                        model.clone(),
                        w["url"].as_str().map_or_else(|| id.clone(), str::to_owned),
                        text(&w["units"]),
                        shares
                            .get(&id)
                            .map_or_else(|| "-".into(), |s| format!("{:.0}%", s * 100.0)),
                    ]
                })
        })
        .collect();
    table(&["MODEL", "WORKER", "UNITS", "SHARE"], &rows)
}
