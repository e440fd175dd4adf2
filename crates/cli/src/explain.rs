//! `explain`: where a request would go now and why, without sending it.

use std::path::Path;

use anyhow::{Context as _, bail};
use serde_json::Value;

use crate::client::{Answer, Gateway};
use crate::render::{ms, percent, run_wait, table, text};

/// Asks the gateway to route the request `explain_body` builds, on `route`.
pub(crate) async fn explain(
    gw: Gateway<'_>,
    prompt: Option<&str>,
    file: Option<&Path>,
    route: &str,
    model: Option<&str>,
) -> anyhow::Result<Answer> {
    let body = explain_body(prompt, file, route, model)?;
    let path = format!("/admin/explain/{}", route.trim_start_matches('/'));
    let (status, body) = gw.post(&path, body).await?;
    Ok(Answer {
        status,
        body,
        render: explain_text,
    })
}

/// The body `explain` sends: the file as given, or a chat (or completion) around `prompt`.
pub(crate) fn explain_body(
    prompt: Option<&str>,
    file: Option<&Path>,
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
