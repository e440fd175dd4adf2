//! Whether a worker's `kv_events` descriptor may be used: how many ranks it asks the
//! gateway to follow, and where its endpoints are. A worker's answer is data, not an
//! instruction: without these bounds it could make the gateway open tens of thousands of
//! sockets, or connect them to any address it names.

use actix::prelude::*;
use kvgate_core::WorkerUrl;
use kvgate_kv_events::{KvEventsDescriptor, RankEndpoints, rank_endpoints};
use tracing::warn;

use super::{EventState, EventsActor};
use crate::actors::registry::WorkerRecord;

/// Most data-parallel ranks whose events are followed: two sockets and tasks each.
pub(super) const MAX_EVENT_RANKS: u32 = 1024;

/// Why a descriptor asks for too many ranks, if it does.
pub(super) fn too_many_ranks(desc: &KvEventsDescriptor) -> Option<String> {
    let n = desc.dp_size.unwrap_or(1);
    (n > MAX_EVENT_RANKS).then(|| {
        format!("dp_size {n} is over the {MAX_EVENT_RANKS} ranks whose KV events kvgate follows")
    })
}

/// The host the endpoints are at, when it is not the worker's own: that one must pass
/// the allow-list. Read from the endpoints themselves, so what is checked is what the
/// sockets connect to.
pub(super) fn foreign_host(worker: &WorkerUrl, endpoints: &[RankEndpoints]) -> Option<String> {
    let ep = endpoints.first()?;
    let authority = ep.events.strip_prefix("tcp://").unwrap_or(&ep.events);
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let bare = |h: &str| {
        h.trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase()
    };
    (bare(host) != bare(worker.host())).then(|| bare(host))
}

impl EventsActor {
    /// Starts a worker's subscriptions if its descriptor is within bounds; records why
    /// not otherwise. An endpoint host other than the worker's is checked first, which may
    /// mean a name lookup: the subscription starts when it passes.
    pub(super) fn admit(
        &mut self,
        ctx: &mut Context<Self>,
        w: &WorkerRecord,
        raw: &serde_json::Value,
    ) {
        let id = w.id;
        let desc = match serde_json::from_value::<KvEventsDescriptor>(raw.clone()) {
            Ok(d) => d,
            Err(e) => {
                let why = format!("kv_events unreadable: {e}");
                self.off.insert(id, (EventState::Off, why));
                return;
            }
        };
        if let Some(why) = too_many_ranks(&desc) {
            self.refuse(w, why);
            return;
        }
        let endpoints = match rank_endpoints(w.url.as_str(), &desc) {
            Ok(e) => e,
            Err(e) => {
                self.off.insert(id, (EventState::Off, e.to_string()));
                return;
            }
        };
        let Some(host) = foreign_host(&w.url, &endpoints) else {
            self.start_worker(ctx, w, desc, endpoints);
            return;
        };
        let (allow, port) = (self.allow.clone(), desc.endpoint_port_base);
        let w = w.clone();
        let check = async move {
            let verdict = allow.check(&host, port).await;
            verdict.map_err(|r| (host, r))
        };
        let h = ctx.spawn(check.into_actor(self).map(move |verdict, act, ctx| {
            if act.vetting.remove(&w.id).is_none() {
                return; // the worker went meanwhile
            }
            match verdict {
                Ok(()) => act.start_worker(ctx, &w, desc, endpoints),
                Err((host, r)) => act.refuse(&w, format!("KV-event endpoint host {host}: {r}")),
            }
        }));
        self.vetting.insert(id, h);
    }

    fn refuse(&mut self, w: &WorkerRecord, why: String) {
        // Said once: the descriptor is read again at every fleet change.
        if self.off.get(&w.id).is_none_or(|(_, said)| *said != why) {
            warn!(worker = %w.url, reason = %why, "KV events refused");
        }
        // Holdings restored from a snapshot for it will not be followed: they go.
        if self.persist.discard(w.id) {
            self.index.forget_worker(w.id);
        }
        self.off.insert(w.id, (EventState::Refused, why));
    }
}

#[cfg(test)]
mod tests;
