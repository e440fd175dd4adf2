//! `kvgatectl`: reads a running gateway's admin API and prints it for people (tables) or
//! machines (`--json`).
//!
//! One module per command group (`fleet`, `index`, `explain`, `decisions`, `snapshot`), the
//! admin API's client in `client`, tables and cells in `render`.

mod client;
mod decisions;
mod explain;
mod fleet;
mod index;
mod render;
mod snapshot;
#[cfg(test)]
mod tests;

use clap::{Parser, Subcommand};

use crate::client::{Gateway, ensure_ok};

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
    /// PEM CA certificates an `https://` gateway is verified against, instead of the
    /// system's.
    #[arg(long, global = true)]
    ca_cert: Option<std::path::PathBuf>,
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

fn run(cli: Cli) -> anyhow::Result<()> {
    // Offline: the store is read without a gateway.
    if let Cmd::Snapshot {
        cmd: SnapshotCmd::Inspect { data_dir },
    } = &cli.cmd
    {
        return snapshot::inspect(data_dir, cli.json);
    }
    let base = cli.url.trim_end_matches('/');
    let tls = (base.get(..8))
        .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        .then(|| client::tls_config(cli.ca_cert.as_deref()))
        .transpose()?;
    let gw = Gateway {
        base,
        key: cli.admin_key.as_deref(),
        tls: tls.as_ref(),
    };
    actix_rt::System::new().block_on(async {
        let answer = match &cli.cmd {
            Cmd::Workers => fleet::workers(gw).await?,
            Cmd::Loads => fleet::loads(gw).await?,
            Cmd::Models => fleet::models(gw).await?,
            Cmd::Health => fleet::health(gw).await?,
            Cmd::Add { worker_url } => fleet::add(gw, worker_url).await?,
            Cmd::Remove { worker } => fleet::remove(gw, worker).await?,
            Cmd::Explain {
                prompt,
                file,
                route,
                model,
            } => {
                let (prompt, file, model) = (prompt.as_deref(), file.as_deref(), model.as_deref());
                explain::explain(gw, prompt, file, route, model).await?
            }
            Cmd::Decisions {
                limit,
                follow: true,
            } => return decisions::follow(gw, *limit, cli.json).await,
            Cmd::Decisions { limit, .. } => decisions::decisions(gw, *limit).await?,
            Cmd::Index { model } => index::index(gw, model.as_deref()).await?,
            Cmd::Snapshot { .. } => anyhow::bail!("snapshot commands read the store offline"),
        };
        // `health` prints an unready gateway's answer too, then fails.
        let health = matches!(cli.cmd, Cmd::Health);
        if !health {
            ensure_ok(answer.status, &answer.body)?;
        }
        if cli.json {
            println!("{}", serde_json::to_string_pretty(&answer.body)?);
        } else {
            print!("{}", (answer.render)(&answer.body));
        }
        if health && answer.status != 200 {
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
