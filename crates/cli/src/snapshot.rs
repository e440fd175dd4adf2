//! `snapshot inspect`: what the store under a data dir holds, read offline (sled allows one
//! process at a time, so the gateway must be stopped).

use std::path::Path;

use anyhow::Context as _;

use crate::render::table;

pub(crate) fn inspect(data_dir: &Path, json: bool) -> anyhow::Result<()> {
    let s = kvgate_store::inspect(data_dir)
        .with_context(|| format!("reading the store under {}", data_dir.display()))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", inspect_text(&s));
    }
    Ok(())
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
