//! The targets of `kvgate-bench proxy`, started and ready: kvgate (a child process, or
//! in-process without a release binary), nginx in its two configurations, and smg.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use kvgate_gateway::{Gateway, GatewayConfig};
use kvgate_policies::{PolicyConfig, PolicyKind};

use super::{ProxySettings, Up};
use crate::run::child::{ChildServer, free_port};

/// kvgate: the release binary as a child when there is one, else in-process.
pub(super) fn start_kvgate(
    name: String,
    policy: PolicyKind,
    bin: Option<&Path>,
    s: &ProxySettings,
    upstream: &str,
    tmp: &Path,
) -> anyhow::Result<Up> {
    let data = tmp.join("kvgate-data");
    match bin {
        Some(bin) => {
            let port = free_port()?;
            let mut args: Vec<String> = [
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--worker-urls",
                upstream,
                "--policy",
                &policy.to_string(),
                "--data-dir",
                &data.display().to_string(),
                "--log-level",
                "warn",
            ]
            .map(String::from)
            .to_vec();
            if let Some(n) = s.max_tree_size {
                args.extend(["--max-tree-size".into(), n.to_string()]);
            }
            let log = s.out.join(format!("{name}-proxy.log"));
            let mut c =
                ChildServer::spawn(&name, bin, &args, &log, format!("http://127.0.0.1:{port}"))?;
            c.wait_ready(&["/readiness", "/health"], Duration::from_secs(30))?;
            Ok(Up {
                name,
                how: format!("--policy {policy}, child process {}", bin.display()),
                url: c.url().to_owned(),
                pid: Some(c.pid()),
                _guard: Box::new(c),
            })
        }
        None => {
            let mut policy = PolicyConfig::with_kind(policy);
            if let Some(n) = s.max_tree_size {
                policy.max_tree_size = usize::try_from(n).unwrap_or(usize::MAX);
            }
            let cfg = GatewayConfig {
                port: 0,
                worker_urls: vec![upstream.to_owned()],
                data_dir: data,
                policy,
                ..GatewayConfig::default()
            };
            let gw = Gateway::start(cfg).context("starting kvgate in-process")?;
            Ok(Up {
                name,
                how: "in-process (no release binary found)".into(),
                url: gw.url(),
                pid: None,
                _guard: Box::new(gw),
            })
        }
    }
}

/// nginx as a reverse proxy: `in_memory` sizes its body buffer to hold the whole request
/// (the floor, `nginx`); otherwise its stock 16 KiB buffer sends longer bodies through a
/// temporary file, as a default install does (`nginx-stock`).
pub(super) fn start_nginx(
    s: &ProxySettings,
    bin: &Path,
    upstream: &str,
    tmp: &Path,
    in_memory: bool,
) -> anyhow::Result<Up> {
    let name = if in_memory { "nginx" } else { "nginx-stock" };
    let dir = tmp.join(name);
    std::fs::create_dir_all(&dir)?;
    let port = free_port()?;
    let buffer = in_memory.then(|| s.body.len());
    let conf = nginx_conf(&dir, port, upstream, buffer)?;
    let args = [
        "-p".into(),
        dir.display().to_string(),
        "-c".into(),
        conf.display().to_string(),
    ];
    let log = s.out.join(format!("{name}.log"));
    let mut c = ChildServer::spawn(name, bin, &args, &log, format!("http://127.0.0.1:{port}"))?;
    c.wait_ready(&["/health"], Duration::from_secs(10))?;
    Ok(Up {
        name: name.into(),
        how: if in_memory {
            "worker_processes auto, upstream keepalive 64, bodies buffered in memory".into()
        } else {
            "the same with nginx's stock 16 KiB body buffer (longer bodies via a temp file)".into()
        },
        url: c.url().to_owned(),
        pid: Some(c.pid()),
        _guard: Box::new(c),
    })
}

pub(super) fn start_smg(s: &ProxySettings, bin: &Path, upstream: &str) -> anyhow::Result<Up> {
    let port = free_port()?;
    let args: Vec<String> = [
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--worker-urls",
        upstream,
        "--policy",
        "round_robin",
        "--log-level",
        "warn",
    ]
    .map(String::from)
    .to_vec();
    let log = s.out.join("smg-proxy.log");
    let mut c = ChildServer::spawn("smg", bin, &args, &log, format!("http://127.0.0.1:{port}"))?;
    c.wait_ready(&["/readiness", "/health"], Duration::from_secs(60))?;
    Ok(Up {
        name: "smg".into(),
        how: "smg 1.13.0 launch --policy round_robin".into(),
        url: c.url().to_owned(),
        pid: Some(c.pid()),
        _guard: Box::new(c),
    })
}

/// A foreground nginx that reverse-proxies to `upstream` with keep-alive connections. With
/// `body`, its body buffer holds a whole request of that size, so no body goes through a
/// temporary file: the floor is nginx at its fastest.
fn nginx_conf(
    dir: &Path,
    port: u16,
    upstream: &str,
    body: Option<usize>,
) -> anyhow::Result<PathBuf> {
    let up = upstream.trim_start_matches("http://");
    let d = dir.display();
    let buffer = body.map_or(String::new(), |b| {
        format!("client_body_buffer_size {}k;\n  ", b / 1024 + 64)
    });
    let conf = format!(
        "worker_processes auto;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  keepalive_requests 100000000;\n  keepalive_timeout 300s;\n  client_max_body_size 0;\n  {buffer}client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         upstream sim {{ server {up}; keepalive 64; keepalive_requests 100000000; }}\n\
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://sim;\n\
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n    }}\n  }}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).context("writing nginx.conf")?;
    Ok(path)
}
