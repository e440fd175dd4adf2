//! `kvgatectl`: reads a running gateway's admin API and prints it for people (tables) or
//! machines (`--json`).

use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(name = "kvgatectl", version, about = "Inspect a kvgate gateway")]
struct Cli {
    /// The gateway's base URL (`--url` is an alias).
    #[arg(
        long = "gateway",
        visible_alias = "url",
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
    /// What the poller last saw of each worker, per worker (running, waiting, KV usage).
    Loads,
    /// Where a request would go now and why, without sending it.
    Explain {
        /// The user message of a chat request (or the prompt of a completion).
        #[arg(long, conflicts_with = "file")]
        prompt: Option<String>,
        /// A request body, exactly as a client would send it.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// chat, completions or generate (or their paths).
        #[arg(long, default_value = "chat")]
        route: String,
        #[arg(long)]
        model: Option<String>,
    },
    /// Recent routing decisions and what the engines reported for them.
    Decisions {
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Keep printing new decisions as they come (Ctrl-C stops).
        #[arg(long)]
        follow: bool,
    },
    /// The prefix index: units per model and worker.
    Index {
        #[arg(long)]
        model: Option<String>,
    },
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
            let age = kvgate_core::clock::unix_now() - at;
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
    if let Some(e) = &s.events {
        let age = kvgate_core::clock::unix_now() - e.written_at;
        out.push_str(&format!(
            "\nKV-event index: written {:.0} (unix), {age:.0}s ago, generation {}\n",
            e.written_at, e.generation
        ));
        let rows: Vec<Vec<String>> = e
            .ranks
            .iter()
            .map(|r| {
                vec![
                    r.url.clone(),
                    r.rank.to_string(),
                    r.blocks.to_string(),
                    r.next_seq.to_string(),
                    r.startup_time
                        .map_or_else(|| "-".into(), |t| format!("{t:.3}")),
                ]
            })
            .collect();
        out.push_str(&table(
            &["URL", "RANK", "BLOCKS", "NEXT-SEQ", "STARTUP-TIME"],
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

/// Widest output, so a table fits a 100-column terminal.
const WIDTH: u16 = 100;

/// An aligned table with a header row, at most [`WIDTH`] columns wide.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Dynamic)
        .set_width(WIDTH)
        .set_header(headers.iter().copied());
    for r in rows {
        t.add_row(r.iter().map(String::as_str));
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

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Array(a) => a.iter().map(text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn percent(v: &Value) -> String {
    num(v).map_or_else(|| "-".into(), |x| format!("{:.0}%", x * 100.0))
}

fn ms(v: &Value) -> String {
    num(v).map_or_else(|| "-".into(), |x| format!("{:.1}", x * 1000.0))
}

/// `running/waiting` from a load summary, `-` without a report.
fn run_wait(load: &Value) -> String {
    if load.is_null() {
        "-".into()
    } else {
        format!("{}/{}", text(&load["running"]), text(&load["waiting"]))
    }
}

/// Each worker's share of the prefix index's units, over all models, by worker id.
fn index_shares(index: &Value) -> std::collections::HashMap<String, f64> {
    let mut units: std::collections::HashMap<String, f64> = Default::default();
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

fn workers_table(v: &Value) -> String {
    let rows: Vec<Vec<String>> = v["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            vec![
                text(&w["id"]),
                text(&w["url"]),
                text(&w["models"]),
                text(&w["status"]),
                text(&w["in_flight"]),
                run_wait(&w["load"]),
                percent(&w["load"]["kv_usage"]),
                percent(&w["index_share"]),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "URL",
            "MODELS",
            "STATUS",
            "IN-FLIGHT",
            "RUN/WAIT",
            "KV",
            "INDEX",
        ],
        &rows,
    )
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

fn explain_text(v: &Value) -> String {
    let mut out = format!(
        "route:   {}\nmodel:   {}\nworker:  {}\npath:    {}{}\n",
        text(&v["route"]),
        text(&v["model"]),
        text(&v["worker"]),
        text(&v["path"]),
        match &v["rule"] {
            Value::Null => String::new(),
            r => format!(" (rule {})", text(r)),
        },
    );
    if let Some(n) = v["notes"].as_array().filter(|n| !n.is_empty()) {
        out.push_str(&format!("notes:   {}\n", text(&Value::Array(n.clone()))));
    }
    // Where the prompt's tokens came from, or why it was matched as text.
    let from = &v["prompt"]["tokens_from"];
    match from["source"].as_str() {
        Some("tokenizer") => out.push_str(&format!(
            "prompt:  {} tokens, from the tokenizer at {}\n",
            text(&v["prompt"]["tokens"]),
            text(&from["tokenizer"])
        )),
        Some("text") => out.push_str(&format!(
            "prompt:  text, on the approximate index: {}\n",
            text(&from["reason"])
        )),
        _ => {}
    }
    out.push_str(&format!("reason:  {}\n\n", text(&v["reason"])));
    let rows: Vec<Vec<String>> = v["candidates"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            vec![
                format!(
                    "{}{}",
                    if c["chosen"] == true { "* " } else { "  " },
                    text(&c["worker"])
                ),
                text(&c["matched"]),
                ms(&c["expected_wait"]),
                ms(&c["prefill"]),
                ms(&c["score"]),
                text(&c["in_flight"]),
                run_wait(&c["load"]),
                percent(&c["load"]["kv_usage"]),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "WORKER",
            "MATCHED",
            "WAIT MS",
            "PREFILL MS",
            "SCORE MS",
            "IN-FLIGHT",
            "RUN/WAIT",
            "KV",
        ],
        &rows,
    ));
    out
}

/// A worker URL without its scheme, for narrow columns.
fn host(v: &Value) -> String {
    let t = text(v);
    t.split_once("://").map_or(t.clone(), |(_, h)| h.to_owned())
}

/// The short name of an inference route.
fn route_name(v: &Value) -> String {
    match v.as_str() {
        Some("/v1/chat/completions") => "chat".into(),
        Some("/v1/completions") => "completions".into(),
        Some("/generate") => "generate".into(),
        _ => text(v),
    }
}

/// At most `n` characters, the cut marked.
fn clip(t: String, n: usize) -> String {
    if t.chars().count() <= n {
        t
    } else {
        let mut c: String = t.chars().take(n.saturating_sub(1)).collect();
        c.push('…');
        c
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

/// The body `explain` sends: the file as given, or a chat (or completion) around `prompt`.
fn explain_body(
    prompt: Option<&str>,
    file: Option<&std::path::Path>,
    route: &str,
    model: Option<&str>,
) -> anyhow::Result<Value> {
    let mut body = match (file, prompt) {
        (Some(f), _) => {
            let raw = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            serde_json::from_slice::<Value>(&raw)
                .with_context(|| format!("{} is not JSON", f.display()))?
        }
        (None, Some(p)) => match route.trim_start_matches('/') {
            "chat" | "v1/chat/completions" => {
                serde_json::json!({"messages": [{"role": "user", "content": p}]})
            }
            "generate" => serde_json::json!({"text": p}),
            _ => serde_json::json!({"prompt": p}),
        },
        (None, None) => bail!("explain needs --prompt TEXT or --file request.json"),
    };
    if let (Some(m), Value::Object(o)) = (model, &mut body) {
        o.insert("model".into(), Value::String(m.to_owned()));
    }
    Ok(body)
}

/// Prints decisions as they come, polling every half second.
async fn follow(base: &str, key: Option<&str>, limit: usize, json: bool) -> anyhow::Result<()> {
    let mut since: Option<u64> = None;
    let mut first = true;
    loop {
        let url = match since {
            Some(s) => format!("{base}/admin/decisions?since={s}&limit=1000"),
            None => format!("{base}/admin/decisions?limit={limit}"),
        };
        let (status, v) = call("GET", &url, key, None).await?;
        if !(200..300).contains(&status) {
            bail!("the gateway answered {status}: {}", error_message(&v));
        }
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

fn error_message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .map_or_else(|| v.to_string(), str::to_owned)
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
                let (s, mut v) = call("GET", &format!("{base}/workers"), key, None).await?;
                if (200..300).contains(&s) {
                    let (_, index) = call("GET", &format!("{base}/admin/index"), key, None).await?;
                    let shares = index_shares(&index);
                    for w in v["workers"].as_array_mut().into_iter().flatten() {
                        w["index_share"] = shares
                            .get(&text(&w["id"]))
                            .map_or(Value::Null, |s| serde_json::json!(s));
                    }
                }
                (s, v, workers_table)
            }
            Cmd::Loads => {
                let (s, v) = call("GET", &format!("{base}/workers"), key, None).await?;
                (s, v, loads_table)
            }
            Cmd::Explain {
                prompt,
                file,
                route,
                model,
            } => {
                let body =
                    explain_body(prompt.as_deref(), file.as_deref(), route, model.as_deref())?;
                let url = format!("{base}/admin/explain/{}", route.trim_start_matches('/'));
                let (s, v) = call("POST", &url, key, Some(body)).await?;
                (s, v, explain_text)
            }
            Cmd::Decisions {
                limit,
                follow: true,
            } => {
                follow(&base, key, *limit, cli.json).await?;
                return Ok(());
            }
            Cmd::Decisions { limit, .. } => {
                let url = format!("{base}/admin/decisions?limit={limit}");
                let (s, v) = call("GET", &url, key, None).await?;
                (s, v, decisions_table)
            }
            Cmd::Index { model } => {
                let (s, mut v) = call("GET", &format!("{base}/admin/index"), key, None).await?;
                if (200..300).contains(&s) {
                    let (_, workers) = call("GET", &format!("{base}/workers"), key, None).await?;
                    let urls: std::collections::HashMap<String, Value> = workers["workers"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|w| (text(&w["id"]), w["url"].clone()))
                        .collect();
                    if let Some(models) = v["models"].as_array_mut() {
                        if let Some(m) = model {
                            models.retain(|x| x["model"].as_str() == Some(m.as_str()));
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
                (s, v, index_table)
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
            bail!("the gateway answered {status}: {}", error_message(&v));
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

fn main() {
    // One line on stderr and a non-zero exit, whatever failed (a bad flag included).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!(
                "kvgatectl: {} (kvgatectl --help lists the commands and flags)",
                first.trim_start_matches("error: ")
            );
            std::process::exit(2);
        }
    };
    if let Err(e) = run(cli) {
        eprintln!("kvgatectl: {e:#}");
        std::process::exit(1);
    }
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
    fn tables_fit_a_hundred_columns() {
        let long = "x".repeat(300);
        let t = table(&["A", "B"], &[vec![long.clone(), long]]);
        assert!(t.lines().all(|l| l.chars().count() <= 100), "{t}");
    }

    #[test]
    fn renders_workers() {
        let v = serde_json::json!({"workers": [{"id": "ab", "url": "http://x:1", "status": "ready", "in_flight": 2, "models": ["m"],
            "load": {"running": 3, "waiting": 1, "kv_usage": 0.25}, "index_share": 0.5}]});
        let t = workers_table(&v);
        let row: Vec<&str> = t.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(
            row,
            ["ab", "http://x:1", "m", "ready", "2", "3/1", "25%", "50%"],
            "{t}"
        );
    }

    #[test]
    fn explain_bodies_follow_the_route() {
        let chat = explain_body(Some("hi"), None, "chat", Some("m")).unwrap();
        assert_eq!(
            chat,
            serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "model": "m"})
        );
        let gen_body = explain_body(Some("hi"), None, "/generate", None).unwrap();
        assert_eq!(gen_body, serde_json::json!({"text": "hi"}));
        let completion = explain_body(Some("hi"), None, "completions", None).unwrap();
        assert_eq!(completion, serde_json::json!({"prompt": "hi"}));
        assert!(explain_body(None, None, "chat", None).is_err());
    }

    #[test]
    fn narrow_cells() {
        assert_eq!(
            host(&serde_json::json!("http://10.0.0.1:8000")),
            "10.0.0.1:8000"
        );
        assert_eq!(
            route_name(&serde_json::json!("/v1/chat/completions")),
            "chat"
        );
        assert_eq!(clip("req-abcdefghijklmnop".into(), 8), "req-abc…");
        assert_eq!(clip("short".into(), 8), "short");
    }

    #[test]
    fn encodes_urls() {
        assert_eq!(percent_encode("http://a:8/x"), "http%3A%2F%2Fa%3A8%2Fx");
    }
}
