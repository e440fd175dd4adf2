//! Starting and stopping engines: each on its own thread with its own actix System, so a
//! fleet can be started from any runtime or none.

use std::io;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use actix_web::dev::ServerHandle;

use crate::engine::Engine;
use crate::{EngineStats, Fault, SimConfig, routes};

/// A running set of simulated engines. Dropping it stops them.
#[derive(Debug)]
pub struct SimFleet {
    engines: Vec<EngineHandle>,
    servers: Vec<(ServerHandle, Option<JoinHandle<()>>)>,
}

/// One running engine, as a test or the demo drives it. Cheap to call from any thread.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    url: String,
    engine: Arc<Engine>,
}

impl SimFleet {
    /// Starts `n` engines on 127.0.0.1, each on a port the OS picks.
    pub fn start(n: usize, cfg: SimConfig) -> io::Result<SimFleet> {
        Self::start_on("127.0.0.1", 0, n, cfg)
    }

    /// Starts `n` engines on `host`; `base_port` 0 lets the OS pick each port, `P > 0`
    /// takes ports `P, P+1, ...`. Fixed KV-event ports move by `dp_size` per engine (engine
    /// `i` publishes from `kv_events_port + i × dp_size`, replay and load likewise); ranges that
    /// clash fail to bind.
    pub fn start_on(host: &str, base_port: u16, n: usize, cfg: SimConfig) -> io::Result<SimFleet> {
        let cfgs = (0..n)
            .map(|i| nth_engine(&cfg, i))
            .collect::<io::Result<Vec<_>>>()?;
        Self::start_each(host, base_port, cfgs)
    }

    /// Starts one engine per config, in order (heterogeneous fleets, e.g. one slow engine).
    pub fn start_each(host: &str, base_port: u16, cfgs: Vec<SimConfig>) -> io::Result<SimFleet> {
        let mut fleet = SimFleet {
            engines: Vec::new(),
            servers: Vec::new(),
        };
        for (i, cfg) in cfgs.into_iter().enumerate() {
            cfg.validate()?;
            let port = match base_port {
                0 => 0,
                base => u16::try_from(i)
                    .ok()
                    .and_then(|i| base.checked_add(i))
                    .ok_or_else(|| {
                        io::Error::new(io::ErrorKind::InvalidInput, "ports run past 65535")
                    })?,
            };
            // On error `fleet` drops here and stops the engines already started.
            let (handle, server) = spawn_engine(i, host, port, cfg)?;
            fleet.engines.push(handle);
            fleet.servers.push(server);
        }
        Ok(fleet)
    }

    /// `http://HOST:PORT` of each engine, in start order, no trailing slash.
    pub fn urls(&self) -> Vec<String> {
        self.engines.iter().map(|e| e.url.clone()).collect()
    }

    pub fn len(&self) -> usize {
        self.engines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    /// The `i`th engine; panics when `i >= len()`.
    pub fn engine(&self, i: usize) -> &EngineHandle {
        &self.engines[i]
    }

    /// Starts engine `i` again on its port, as a process restarted by its supervisor:
    /// a new `startup_time`, an empty cache, fresh counters, `gen_throughput` at 0 (the
    /// configured `initial_gen_throughput` stands for a first start only). Fails when the
    /// port was taken meanwhile.
    pub fn revive(&mut self, i: usize) -> io::Result<()> {
        let (Some(old), Some(server)) = (self.engines.get(i), self.servers.get_mut(i)) else {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no such engine"));
        };
        drop(server.0.stop(false));
        if let Some(t) = server.1.take() {
            let _ = t.join();
        }
        let port = old
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(|| io::Error::other("engine URL has no port"))?;
        let host = old
            .url
            .trim_start_matches("http://")
            .rsplit_once(':')
            .map_or("127.0.0.1", |(h, _)| h)
            .to_owned();
        // Free ports picked at the first start are kept, as a restarted engine's flags would.
        let ports = old.engine.kv_events();
        let old_cfg = &old.engine.cfg;
        let cfg = SimConfig {
            initial_gen_throughput: 0.0,
            kv_events_port: ports.map(|p| p.events).or(old_cfg.kv_events_port),
            kv_events_replay_port: ports
                .and_then(|p| p.replay)
                .or(old_cfg.kv_events_replay_port),
            load_publish_port: ports.and_then(|p| p.load).or(old_cfg.load_publish_port),
            ..(**old_cfg).clone()
        };
        let (handle, srv) = spawn_engine(i, &host, port, cfg)?;
        self.engines[i] = handle;
        self.servers[i] = srv;
        Ok(())
    }

    /// A handle on engine `i` that can outlive a borrow of the fleet: its faults, its
    /// counters, and killing it.
    ///
    /// # Panics
    /// If there is no engine `i`.
    pub fn handle(&self, i: usize) -> EngineControl {
        EngineControl {
            engine: self.engines[i].clone(),
            server: self.servers[i].0.clone(),
        }
    }

    /// Stops every engine gracefully (in-flight requests get up to a second) and waits.
    pub fn stop(self) {
        drop(self); // `Drop` does the work, so a forgotten `stop` still stops.
    }

    fn shutdown(&mut self) {
        for (handle, _) in &self.servers {
            // The stop command is sent eagerly; the returned future only awaits completion.
            drop(handle.stop(true));
        }
        for (_, thread) in &mut self.servers {
            if let Some(thread) = thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for SimFleet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// See [`SimFleet::handle`].
#[derive(Clone)]
pub struct EngineControl {
    engine: EngineHandle,
    server: ServerHandle,
}

impl std::fmt::Debug for EngineControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineControl")
            .field("url", &self.engine.url)
            .finish()
    }
}

impl EngineControl {
    pub fn set_fault(&self, fault: Fault) {
        self.engine.set_fault(fault);
    }

    pub fn stats(&self) -> EngineStats {
        self.engine.stats()
    }

    /// Kills the engine as a crash would: its listener and every connection close at once
    /// (clients see resets, then refused connections); nothing more is answered.
    pub async fn kill(&self) {
        self.server.stop(false).await;
    }
}

impl EngineHandle {
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Replaces the current fault; [`Fault::None`] clears it.
    pub fn set_fault(&self, fault: Fault) {
        self.engine.set_fault(fault);
    }

    pub fn stats(&self) -> EngineStats {
        self.engine.stats()
    }

    /// Silences the KV-event publisher (`true`) or brings it back: while silent it sends
    /// nothing and answers no replay request, but keeps its batches for replay, as a
    /// publisher whose thread died would look from outside; the engine serves on.
    pub fn mute_kv_events(&self, muted: bool) {
        self.engine
            .publisher_faults
            .muted
            .store(muted, std::sync::atomic::Ordering::Release);
    }

    /// The next `n` KV-event batches are numbered but neither sent nor kept for replay:
    /// a gap in the live stream that replay cannot cover.
    pub fn lose_kv_events(&self, n: u64) {
        self.engine
            .publisher_faults
            .lost
            .store(n, std::sync::atomic::Ordering::Release);
    }

    /// Simulates an engine restart: requests in flight are aborted, the cache is emptied,
    /// `gen_throughput` starts again at 0 and `startup_time` changes. Counters are kept.
    pub fn restart(&self) {
        self.engine.restart();
    }
}

/// Engine `i`'s config in a fleet of equal engines: fixed event ports shifted past the
/// ranks of the engines before it.
fn nth_engine(cfg: &SimConfig, i: usize) -> io::Result<SimConfig> {
    let shift = |port: Option<u16>| -> io::Result<Option<u16>> {
        match port {
            None | Some(0) => Ok(port),
            Some(p) => i
                .checked_mul(cfg.dp_size)
                .and_then(|d| u16::try_from(d).ok())
                .and_then(|d| p.checked_add(d))
                .map(Some)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "kv event or load ports run past 65535",
                    )
                }),
        }
    };
    Ok(SimConfig {
        kv_events_port: shift(cfg.kv_events_port)?,
        kv_events_replay_port: shift(cfg.kv_events_replay_port)?,
        load_publish_port: shift(cfg.load_publish_port)?,
        ..cfg.clone()
    })
}

type Started = (EngineHandle, (ServerHandle, Option<JoinHandle<()>>));

fn spawn_engine(index: usize, host: &str, port: u16, cfg: SimConfig) -> io::Result<Started> {
    let engine = Arc::new(Engine::new(index, cfg)?);
    let (tx, rx) = mpsc::channel();
    let (host, shared) = (host.to_owned(), Arc::clone(&engine));
    let thread = std::thread::Builder::new()
        .name(format!("kvgate-sim-{index}"))
        .spawn(move || {
            actix_rt::System::new().block_on(async move {
                if let Err(e) = shared.start_events(&host).await {
                    let _ = tx.send(Err(e));
                    return;
                }
                match routes::bind(Arc::clone(&shared), &host, port) {
                    Ok((server, addr)) => {
                        shared.start_schedulers();
                        let _ = tx.send(Ok((server.handle(), addr)));
                        let _ = server.await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })?;
    let bound = rx
        .recv()
        .map_err(|_| io::Error::other("engine thread exited before binding"));
    match bound.and_then(|b| b) {
        Ok((handle, addr)) => {
            let url = format!("http://{addr}");
            Ok((EngineHandle { url, engine }, (handle, Some(thread))))
        }
        Err(e) => {
            let _ = thread.join();
            Err(e)
        }
    }
}

#[cfg(test)]
#[test]
fn handles_can_be_shared_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<EngineHandle>();
    shareable::<SimFleet>();
}
