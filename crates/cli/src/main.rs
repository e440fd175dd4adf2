//! `kvgatectl`: reads a running gateway's admin API and prints it for people (tables) or
//! machines (`--json`).

use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(name = "kvgatectl", version, about = "Inspect a kvgate gateway")]
struct Cli {
    /// The gateway's base URL.
    #[arg(
        long,
        global = true,
        default_value = "http://127.0.0.1:30000",
        env = "KVGATE_URL"
    )]
    url: String,
    /// Print the gateway's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// The gateway's admin key (`--control-plane-api-keys`), sent as a bearer token.
    #[arg(long, global = true, env = "KVGATE_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The workers, their health and in-flight requests.
    Workers,
    /// The models the fleet serves.
    Models,
    /// Liveness and readiness.
    Health,
    /// Register a worker.
    Add { worker_url: String },
    /// Remove a worker, by id or URL.
    Remove { worker: String },
    /// Stored state (offline: stop the gateway first, sled allows one process at a time).
    Snapshot {
        #[command(subcommand)]
        cmd: SnapshotCmd,
    },
}

#[derive(Debug, Subcommand)]
enum SnapshotCmd {
    /// What the store under a data dir holds: format, age, entries per model and worker,
    /// the registry.
    Inspect {
        #[arg(long, default_value = "./kvgate-data")]
        data_dir: std::path::PathBuf,
    },
}

fn inspect_text(s: &kvgate_store::StoreSummary) -> String {
    let mut out = format!(
        "store:           {}\nformat version:  {}\n",
        s.path, s.format_version
    );
    match (s.written_at, s.generation) {
        (Some(at), Some(g)) => {
            let age = kvgate_store::unix_now() - at;
            out.push_str(&format!(
                "written:         {at:.0} (unix), {age:.0}s ago, generation {g}\n"
            ));
        }
        _ => out.push_str("written:         never (no snapshot yet)\n"),
    }
    out.push_str(&format!("size on disk:    {} bytes\n", s.size_on_disk));
    for m in &s.models {
        out.push_str(&format!("\nmodel {:?}\n", m.model));
        let rows: Vec<Vec<String>> = m
            .workers
            .iter()
            .map(|w| {
                vec![
                    w.worker.clone(),
                    w.url.clone().unwrap_or_else(|| "-".into()),
                    w.entries.to_string(),
                    w.units.to_string(),
                    w.startup_time
                        .map_or_else(|| "-".into(), |t| format!("{t:.3}")),
                ]
            })
            .collect();
        out.push_str(&table(
            &["WORKER", "URL", "ENTRIES", "UNITS", "STARTUP-TIME"],
            &rows,
        ));
    }
    out.push_str(&format!(
        "\nregistry: added through the API: {}; removed through the API: {}\n",
        if s.registry.added.is_empty() {
            "-".to_owned()
        } else {
            s.registry.added.join(" ")
        },
        if s.registry.removed.is_empty() {
            "-".to_owned()
        } else {
            s.registry.removed.join(" ")
        },
    ));
    out
}

async fn call(
    method: &str,
    url: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> anyhow::Result<(u16, Value)> {
    let client = awc::Client::builder()
        .timeout(Duration::from_secs(30))
        .finish();
    let req = match method {
        "POST" => client.post(url),
        "DELETE" => client.delete(url),
        _ => client.get(url),
    };
    let req = match key {
        Some(k) => req.bearer_auth(k),
        None => req,
    };
    let mut resp = match body {
        Some(b) => req.send_json(&b).await,
        None => req.send().await,
    }
    .map_err(|e| anyhow::anyhow!("{method} {url}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .body()
        .await
        .with_context(|| format!("{method} {url}: reading the body"))?;
    let v = match serde_json::from_slice::<Value>(&bytes) {
        Ok(v @ Value::Object(_)) => v,
        // A 2xx that is not a JSON object is not a kvgate answer: `--url` points elsewhere.
        _ if (200..300).contains(&status) => {
            let head = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
            anyhow::bail!("{method} {url}: not a kvgate answer (status {status}): {head:?}");
        }
        Ok(v) => v,
        Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
    };
    Ok((status, v))
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A plain text table with a header row.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = line(headers.to_vec());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Array(a) => a.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn workers_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["workers"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .map(|w| {
                    [
                        "id",
                        "url",
                        "status",
                        "in_flight",
                        "runtime",
                        "models",
                        "max_running_requests",
                    ]
                    .iter()
                    .map(|k| text(&w[*k]))
                    .collect()
                })
                .collect()
        })
        .unwrap_or_default();
    table(
        &[
            "ID",
            "URL",
            "STATUS",
            "IN-FLIGHT",
            "RUNTIME",
            "MODELS",
            "SLOTS",
        ],
        &rows,
    )
}

fn run(cli: Cli) -> anyhow::Result<()> {
    if let Cmd::Snapshot {
        cmd: SnapshotCmd::Inspect { data_dir },
    } = &cli.cmd
    {
        let s = kvgate_store::inspect(data_dir)
            .with_context(|| format!("reading the store under {}", data_dir.display()))?;
        if cli.json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            print!("{}", inspect_text(&s));
        }
        return Ok(());
    }
    let base = cli.url.trim_end_matches('/').to_owned();
    let key = cli.admin_key.clone();
    actix_rt::System::new().block_on(async move {
        let key = key.as_deref();
        let (status, v, render): (u16, Value, fn(&Value) -> String) = match &cli.cmd {
            Cmd::Workers => {
                let (s, v) = call("GET", &format!("{base}/workers"), key, None).await?;
                (s, v, workers_table)
            }
            Cmd::Models => {
                let (s, v) = call("GET", &format!("{base}/v1/models"), key, None).await?;
                (s, v, |v| {
                    let rows: Vec<Vec<String>> = v["data"]
                        .as_array()
                        .map(|d| {
                            d.iter()
                                .map(|m| vec![text(&m["id"]), text(&m["owned_by"])])
                                .collect()
                        })
                        .unwrap_or_default();
                    table(&["MODEL", "OWNED-BY"], &rows)
                })
            }
            Cmd::Health => {
                let (s, v) = call("GET", &format!("{base}/readiness"), key, None).await?;
                (s, v, |v| {
                    format!(
                        "{} ({} of {} workers healthy)\n",
                        text(&v["status"]),
                        text(&v["healthy_workers"]),
                        text(&v["total_workers"])
                    )
                })
            }
            Cmd::Add { worker_url } => {
                let (s, v) = call(
                    "POST",
                    &format!("{base}/workers"),
                    key,
                    Some(serde_json::json!({"url": worker_url})),
                )
                .await?;
                (s, v, |v| {
                    format!("added {} ({})\n", text(&v["url"]), text(&v["status"]))
                })
            }
            // Handled above, without a gateway.
            Cmd::Snapshot { .. } => bail!("snapshot commands read the store offline"),
            Cmd::Remove { worker } => {
                let (s, v) = call(
                    "DELETE",
                    &format!("{base}/workers/{}", percent_encode(worker)),
                    key,
                    None,
                )
                .await?;
                (s, v, |v| format!("removed {}\n", text(&v["worker"]["url"])))
            }
        };
        if !(200..300).contains(&status) && !matches!(cli.cmd, Cmd::Health) {
            let msg = v["error"]["message"]
                .as_str()
                .map_or_else(|| v.to_string(), str::to_owned);
            bail!("the gateway answered {status}: {msg}");
        }
        if cli.json {
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            print!("{}", render(&v));
        }
        if matches!(cli.cmd, Cmd::Health) && status != 200 {
            std::process::exit(1);
        }
        Ok(())
    })
}

fn main() -> anyhow::Result<()> {
    run(Cli::parse())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align() {
        let t = table(&["A", "LONG"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "A    LONG\nxyz  1\n");
    }

    #[test]
    fn renders_workers() {
        let v = serde_json::json!({"workers": [{"id": "ab", "url": "http://x:1", "status": "ready", "in_flight": 2, "runtime": "sglang", "models": ["m"], "max_running_requests": null}]});
        let t = workers_table(&v);
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .starts_with("ab  http://x:1  ready   2          sglang   m       -"),
            "{t}"
        );
    }

    #[test]
    fn encodes_urls() {
        assert_eq!(percent_encode("http://a:8/x"), "http%3A%2F%2Fa%3A8%2Fx");
    }
}
