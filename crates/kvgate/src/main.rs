//! The `kvgate` binary: flags on top of env on top of the config file, onto
//! `kvgate-gateway`; the log subscriber, the signals, and `--demo`'s simulated engines.
//! The library links none of these (clap, anyhow, tracing-subscriber, the simulator).

use std::collections::HashMap;

use anyhow::Context as _;
use kvgate_gateway::{Gateway, GatewayConfig};
use tracing_subscriber::EnvFilter;

mod cli;

/// The log filter: `RUST_LOG` when set, else `--log-level`, refused by name when it is
/// not a filter.
fn log_filter(cfg: &GatewayConfig) -> anyhow::Result<EnvFilter> {
    if let Ok(f) = EnvFilter::try_from_env("RUST_LOG") {
        return Ok(f);
    }
    EnvFilter::try_new(&cfg.log_level)
        .map_err(|e| anyhow::anyhow!("config: invalid value for 'log_level': {e}"))?;
    // The HTTP server's own start/stop lines are noise at info.
    Ok(
        EnvFilter::try_new(format!("{},actix_server=warn", cfg.log_level))
            .unwrap_or_else(|_| EnvFilter::new("info")),
    )
}

fn init_logging(cfg: &GatewayConfig, filter: EnvFilter) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    // `--log-dir`: the log goes to `kvgate.log` there (appended), as the reference
    // gateway's does, instead of stdout.
    if let Some(dir) = &cfg.log_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("--log-dir {}", dir.display()))?;
        let path = dir.join("kvgate.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let builder = builder
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file));
        if cfg.log_json {
            builder.json().flatten_event(true).init();
        } else {
            builder.init();
        }
        return Ok(());
    }
    let builder = builder.with_ansi(std::io::stdout().is_terminal());
    if cfg.log_json {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
    Ok(())
}

fn wait_for_signal() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    rt.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("SIGTERM handler")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("SIGINT handler")?,
            _ = term.recv() => {}
        }
        Ok(())
    })
}

fn main() -> anyhow::Result<()> {
    kvgate_gateway::keep_freed_memory();
    let args: Vec<String> = std::env::args().collect();
    if let Some(line) = cli::no_equivalent(&args) {
        eprintln!("error: {line}");
        std::process::exit(2);
    }
    let matches = cli::command().get_matches_from(args);
    if matches.get_flag("print-example-config") {
        print!("{}", cli::example_toml());
        return Ok(());
    }
    let (file, overrides) = cli::parse(&matches);
    let env: HashMap<String, String> = std::env::vars().collect();
    let mut cfg = GatewayConfig::load(file.as_deref(), &env, overrides)?;
    let filter = log_filter(&cfg)?;
    init_logging(&cfg, filter)?;
    for note in cli::notes(&matches) {
        tracing::info!("{note}");
    }

    let fleet = demo_fleet(&mut cfg)?;

    let gw = Gateway::start(cfg.clone())?;
    if fleet.is_some() {
        print_demo(&gw, &cfg);
    }
    wait_for_signal()?;
    tracing::info!(
        in_flight = gw.in_flight(),
        delay_secs = cfg.shutdown_delay.as_secs_f64(),
        grace_secs = cfg.shutdown_grace_period.as_secs_f64(),
        "shutting down: readiness is 503, still accepting for the delay, then in-flight requests finish"
    );
    gw.drain_after(cfg.shutdown_delay, cfg.shutdown_grace_period);
    if let Some(f) = fleet {
        f.stop();
    }
    Ok(())
}

/// The simulated engines of `--demo`, added to the configured workers.
fn demo_fleet(cfg: &mut GatewayConfig) -> anyhow::Result<Option<kvgate_engine_sim::SimFleet>> {
    if !cfg.demo {
        return Ok(None);
    }
    // They report cached tokens, as SGLang does with `--enable-cache-report`, so the fleet
    // page's predicted-against-reported figure is real from the first hits.
    let sim = kvgate_engine_sim::SimConfig {
        enable_cache_report: true,
        ..kvgate_engine_sim::SimConfig::default()
    };
    let fleet = kvgate_engine_sim::SimFleet::start(cfg.demo_engines, sim)
        .context("starting the simulated engines")?;
    cfg.worker_urls.extend(fleet.urls());
    Ok(Some(fleet))
}

fn print_demo(gw: &Gateway, cfg: &GatewayConfig) {
    let url = gw.url();
    println!();
    println!(
        "kvgate demo: {} simulated SGLang engines behind {url}",
        cfg.demo_engines
    );
    println!("  workers:  {}", cfg.worker_urls.join(" "));
    println!(
        "  policy:   {}    state: {}",
        cfg.policy.kind,
        cfg.data_dir.display()
    );
    println!();
    println!("Try it:");
    println!(
        "  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"kvgate-sim-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'"
    );
    println!("  curl -s {url}/workers");
    println!();
    println!(
        "OpenAI client settings:  base_url=\"{url}/v1\"  api_key=\"none\"  model=\"kvgate-sim-model\""
    );
    println!("Ctrl-C stops it.");
}
