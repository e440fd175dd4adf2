//! Pushed load, as SGLang's `--load-publish-endpoint` sends it: per data-parallel rank a PUB
//! socket on `port_base + rank` sending `[topic, seq, LoadStat]` (seq from 0, one per
//! message) every `load_publish_every_steps` scheduler steps, and at least once per
//! `load_heartbeat` even when the rank is idle. The figures are `/v1/loads`' for the same
//! instant ([`load::load_stat`]).
//!
//! The scheduler hands a step's snapshot to the rank's task through an unbounded channel,
//! so a step never waits on a socket; the task takes a snapshot itself when the heartbeat
//! comes due with nothing sent.

use std::io;
use std::sync::Arc;

use bytes::Bytes;
use kvgate_kv_events::encode_load_message;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use zeromq::{PubSocket, SocketSend, ZmqMessage};

use crate::SimConfig;
use crate::events::bind_ranks;
use crate::load;
use crate::scheduler::{Rank, Snapshot};

/// Binds every rank's load socket on `host`, wires each rank to its publisher and spawns
/// the publishers on the current (actix) runtime; returns the port base bound, `None` when
/// pushed load is off.
pub(crate) async fn start(
    host: &str,
    cfg: &Arc<SimConfig>,
    ranks: &[Arc<Rank>],
) -> io::Result<Option<u16>> {
    let Some(base) = cfg.load_publish_port else {
        return Ok(None);
    };
    let (port, sockets) = bind_ranks::<PubSocket>(host, base, ranks.len()).await?;
    let topic = Bytes::from(cfg.load_topic.clone().into_bytes());
    for (index, (rank, socket)) in ranks.iter().zip(sockets).enumerate() {
        let (tx, rx) = unbounded_channel();
        rank.set_load_publisher(tx);
        #[expect(
            clippy::disallowed_methods,
            reason = "a simulated engine's tasks run on its own runtime, which stops with the fleet"
        )]
        actix_rt::spawn(publish(
            index,
            Arc::clone(cfg),
            Arc::clone(rank),
            topic.clone(),
            socket,
            rx,
        ));
    }
    Ok(Some(port))
}

/// Publishes each snapshot the scheduler hands over, and a fresh one whenever a heartbeat
/// passes with nothing sent, numbering the messages from 0.
async fn publish(
    index: usize,
    cfg: Arc<SimConfig>,
    rank: Arc<Rank>,
    topic: Bytes,
    mut socket: PubSocket,
    mut rx: UnboundedReceiver<Snapshot>,
) {
    let mut seq = 0u64;
    loop {
        let snapshot = match tokio::time::timeout(cfg.load_heartbeat, rx.recv()).await {
            Ok(Some(snapshot)) => snapshot,
            // The rank is gone: the engine is stopping.
            Ok(None) => return,
            Err(_) => rank.snapshot(),
        };
        let stat = load::load_stat(&cfg, index, &snapshot);
        let [_, seq_frame, payload] = encode_load_message(&topic, seq, &stat);
        let mut msg = ZmqMessage::from(topic.clone());
        msg.push_back(seq_frame.into());
        msg.push_back(payload.into());
        // PUB drops for slow or absent subscribers; an error here is the socket closing.
        if let Err(e) = socket.send(msg).await {
            tracing::warn!(rank = index, seq, error = %e, "load publish failed");
        }
        seq += 1;
    }
}
