//! KV events on the wire, as SGLang 0.5.23's ZMQ publisher sends them: per data-parallel
//! rank a PUB socket on `port_base + rank` sending `[topic, seq, payload]` (seq from 0, one
//! per batch), and with replay a ROUTER on `replay_port_base + rank` that answers
//! `[identity, b"", start_seq]` with every buffered batch from `start_seq`, then the end
//! marker. Both run as tasks on the engine's runtime; the scheduler hands them batches
//! through an unbounded channel, so publishing never blocks a step. The vLLM flavour sends
//! what vLLM's `ZmqEventPublisher` does: its payload form ([`encode_payload_vllm`], hashes
//! as unsigned integers or, with `kv_event_hash_bytes`, as bytes) and replay answers
//! without the topic frame (`[b"", seq, payload]`).

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use kvgate_kv_events::{
    EventBatch, KvEvent, VllmHashes, decode_replay_request, encode_message, encode_payload_vllm,
    encode_replay_batch, encode_replay_end,
};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::{Flavor, SimConfig};
use kvgate_core::clock::unix_now;

/// What a rank's scheduler hands its publisher.
#[derive(Debug)]
pub(crate) enum Publish {
    /// The events of one batch.
    Batch(Vec<KvEvent>),
    /// The engine process restarted: a new publisher numbers from 0 again, with nothing
    /// to replay from before.
    Restart,
}

/// Where a rank's scheduler sends what it publishes.
pub(crate) type Outbox = UnboundedSender<Publish>;

/// The port bases actually bound: what `/server_info` advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ports {
    pub(crate) events: u16,
    pub(crate) replay: Option<u16>,
    /// Pushed load's PUB base ([`crate::pushed_load`]), advertised here as SGLang does.
    pub(crate) load: Option<u16>,
}

impl Ports {
    /// The `kv_events` block of `/server_info`, in SGLang's shape.
    pub(crate) fn descriptor(&self, cfg: &SimConfig) -> Value {
        let mut d = json!({
            "publisher": "zmq",
            "endpoint_host": "*",
            "endpoint_port_base": self.events,
            "topic": cfg.kv_events_topic,
            // Events carry one page per block, as SGLang's radix cache publishes them.
            "block_size": cfg.page_size,
            "dp_size": cfg.dp_size,
        });
        if let Some(map) = d.as_object_mut() {
            if let Some(port) = self.replay {
                map.insert("replay_endpoint_port_base".to_owned(), port.into());
            }
            if let Some(port) = self.load {
                map.insert("load_endpoint_port_base".to_owned(), port.into());
                map.insert("load_topic".to_owned(), cfg.load_topic.clone().into());
            }
        }
        d
    }
}

/// Batches kept for replay, oldest first.
type Buffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// Faults of the publisher alone, for tests: the engine's HTTP side is untouched.
#[derive(Debug, Default)]
pub(crate) struct PublisherFaults {
    /// Silent: batches are numbered and kept for replay but not sent, and replay requests
    /// get no answer (a publisher thread that died while the engine serves on).
    pub(crate) muted: AtomicBool,
    /// This many next batches are numbered but neither sent nor kept: a gap replay
    /// cannot cover.
    pub(crate) lost: AtomicU64,
}

/// Binds every rank's sockets on `host` and spawns their tasks on the current (actix)
/// runtime; returns the ports bound and one outbox per rank. `None` when events are off.
pub(crate) async fn start(
    host: &str,
    cfg: &SimConfig,
    faults: &Arc<PublisherFaults>,
) -> io::Result<Option<(Ports, Vec<Outbox>)>> {
    let Some(base) = cfg.kv_events_port else {
        return Ok(None);
    };
    let n = cfg.dp_size;
    let (events, publishers) = bind_ranks::<PubSocket>(host, base, n).await?;
    let (replay, routers) = match cfg.kv_events_replay_port {
        Some(base) => {
            let (port, sockets) = bind_ranks::<RouterSocket>(host, base, n).await?;
            (Some(port), sockets.into_iter().map(Some).collect())
        }
        None => (None, (0..n).map(|_| None).collect::<Vec<_>>()),
    };
    let topic = Bytes::from(cfg.kv_events_topic.clone().into_bytes());
    let form = (cfg.flavor == Flavor::Vllm).then_some(if cfg.kv_event_hash_bytes {
        VllmHashes::Bytes
    } else {
        VllmHashes::Ints
    });
    let mut outboxes = Vec::with_capacity(n);
    for (rank, (socket, router)) in publishers.into_iter().zip(routers).enumerate() {
        let (tx, rx) = unbounded_channel();
        outboxes.push(tx);
        let buffer: Buffer = Arc::default();
        let keep = router.is_some().then_some(cfg.kv_events_replay_buffer);
        let rank = u32::try_from(rank).unwrap_or(u32::MAX);
        #[expect(
            clippy::disallowed_methods,
            reason = "a simulated engine's tasks run on its own runtime, which stops with the fleet"
        )]
        actix_rt::spawn(publish(
            Publisher {
                rank,
                topic: topic.clone(),
                socket,
                buffer: buffer.clone(),
                keep,
                faults: Arc::clone(faults),
                form,
            },
            rx,
        ));
        if let Some(router) = router {
            // vLLM's replay answers carry no topic frame.
            let topic = form.is_none().then(|| topic.clone());
            #[expect(
                clippy::disallowed_methods,
                reason = "a simulated engine's tasks run on its own runtime, which stops with the fleet"
            )]
            actix_rt::spawn(replay_loop(topic, router, buffer, Arc::clone(faults)));
        }
    }
    let ports = Ports {
        events,
        replay,
        load: None,
    };
    Ok(Some((ports, outboxes)))
}

/// One rank's publishing side.
struct Publisher {
    rank: u32,
    topic: Bytes,
    socket: PubSocket,
    buffer: Buffer,
    keep: Option<usize>,
    faults: Arc<PublisherFaults>,
    /// vLLM's payload form, for that flavour; SGLang's otherwise.
    form: Option<VllmHashes>,
}

/// Publishes each batch the scheduler hands over, numbering them from 0.
async fn publish(p: Publisher, mut rx: UnboundedReceiver<Publish>) {
    let Publisher {
        rank,
        topic,
        mut socket,
        buffer,
        keep,
        faults,
        form,
    } = p;
    let mut seq = 0u64;
    while let Some(p) = rx.recv().await {
        let events = match p {
            Publish::Batch(events) => events,
            Publish::Restart => {
                seq = 0;
                buffer
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clear();
                continue;
            }
        };
        let batch = EventBatch {
            ts: unix_now(),
            events,
            attn_dp_rank: Some(rank),
            unknown_events: 0,
        };
        let [_, seq_frame, payload] = match form {
            None => encode_message(&topic, seq, &batch),
            Some(f) => [
                Vec::new(),
                seq.to_be_bytes().to_vec(),
                encode_payload_vllm(&batch, f),
            ],
        };
        let payload = Bytes::from(payload);
        let lost = faults
            .lost
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if lost {
            seq += 1;
            continue;
        }
        if let Some(keep) = keep {
            let mut b = buffer.lock().unwrap_or_else(PoisonError::into_inner);
            if b.len() == keep {
                b.pop_front();
            }
            b.push_back((seq, payload.clone()));
        }
        let mut msg = ZmqMessage::from(topic.clone());
        msg.push_back(seq_frame.into());
        msg.push_back(payload);
        if faults.muted.load(Ordering::Acquire) {
            seq += 1;
            continue;
        }
        // PUB drops for slow or absent subscribers; an error here is the socket closing.
        if let Err(e) = socket.send(msg).await {
            tracing::warn!(rank, seq, error = %e, "kv event publish failed");
        }
        seq += 1;
    }
}

/// Answers replay requests, one at a time, from the buffer.
/// `topic`: `None` answers as vLLM does, without the topic frame.
async fn replay_loop(
    topic: Option<Bytes>,
    mut socket: RouterSocket,
    buffer: Buffer,
    faults: Arc<PublisherFaults>,
) {
    loop {
        let request = match socket.recv().await {
            Ok(m) => m.into_vec(),
            Err(e) => {
                // The router reports an error only once it can never receive again.
                tracing::warn!(error = %e, "kv event replay socket closed");
                return;
            }
        };
        let Some((identity, rest)) = request.split_first() else {
            continue;
        };
        if faults.muted.load(Ordering::Acquire) {
            continue;
        }
        let start = match decode_replay_request(rest) {
            Ok(start) => start,
            Err(e) => {
                tracing::debug!(error = %e, "malformed kv event replay request ignored");
                continue;
            }
        };
        let batches: Vec<(u64, Bytes)> = buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        let answers = batches
            .iter()
            .map(|(seq, payload)| {
                encode_replay_batch(topic.as_deref().unwrap_or(b""), *seq, payload)
            })
            .chain(std::iter::once(encode_replay_end()))
            .map(|frames| {
                let mut frames = frames.to_vec();
                // `[b"", topic, seq, payload]`, or vLLM's `[b"", seq, payload]`.
                if topic.is_none() {
                    frames.remove(1);
                }
                frames
            });
        for frames in answers {
            let mut msg = ZmqMessage::from(identity.clone());
            for f in frames {
                msg.push_back(f.into());
            }
            if let Err(e) = socket.send(msg).await {
                // The client left; the next request starts afresh.
                tracing::debug!(error = %e, "kv event replay answer dropped");
                break;
            }
        }
    }
}

/// Binds `n` sockets on consecutive ports from `base`; from 0, on the first free run found.
pub(crate) async fn bind_ranks<S: Socket>(
    host: &str,
    base: u16,
    n: usize,
) -> io::Result<(u16, Vec<S>)> {
    // A free port for rank 0 does not promise free ones after it: try a few runs.
    let tries = if base == 0 { 20 } else { 1 };
    let mut last = io::Error::other("no port range tried");
    for _ in 0..tries {
        match bind_run(host, base, n).await {
            Ok(bound) => return Ok(bound),
            Err(e) => last = e,
        }
    }
    Err(last)
}

async fn bind_run<S: Socket>(host: &str, base: u16, n: usize) -> io::Result<(u16, Vec<S>)> {
    let mut sockets = Vec::with_capacity(n);
    let mut first = base;
    for r in 0..n {
        let port = match r {
            0 => base,
            r => u16::try_from(r)
                .ok()
                .and_then(|r| first.checked_add(r))
                .ok_or_else(|| io::Error::other("ZMQ ports run past 65535"))?,
        };
        let mut socket = S::new();
        let endpoint = socket
            .bind(&tcp(host, port))
            .await
            .map_err(|e| io::Error::other(format!("binding ZMQ on {host}:{port}: {e}")))?;
        if r == 0 {
            first = match endpoint {
                zeromq::Endpoint::Tcp(_, p) => p,
                other => return Err(io::Error::other(format!("bound {other}, not TCP"))),
            };
        }
        sockets.push(socket);
    }
    Ok((first, sockets))
}

/// `tcp://host:port`, an IPv6 literal in brackets.
fn tcp(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("tcp://[{host}]:{port}")
    } else {
        format!("tcp://{host}:{port}")
    }
}
