//! What the events actor answers between its feeds: each worker's event state, and the
//! chain index's holders of a token request.

use actix::prelude::*;
use kvgate_kv_index::ChainStats;
use kvgate_policies::{RequestFacts, RoutingText, WorkerId};
use std::collections::HashMap;
use std::sync::Arc;

use super::*;

/// Each worker's event state and counts.
#[derive(Message, Debug)]
#[rtype(result = "HashMap<WorkerId, WorkerEvents>")]
pub struct GetEventStates;

impl Handler<GetEventStates> for EventsActor {
    type Result = MessageResult<GetEventStates>;

    fn handle(&mut self, _: GetEventStates, _: &mut Context<Self>) -> Self::Result {
        let blocks: HashMap<WorkerId, usize> = self.index.blocks_per_worker().into_iter().collect();
        let mut out: HashMap<WorkerId, WorkerEvents> = self
            .workers
            .iter()
            .map(|(id, w)| {
                let state = if w.live() {
                    EventState::Live
                } else if w.ranks.values().any(|r| *r == RankState::Stalled) {
                    EventState::Stalled
                } else {
                    EventState::Connecting
                };
                (
                    *id,
                    WorkerEvents {
                        state,
                        block_size: w.desc.block_size,
                        blocks: blocks.get(id).copied().unwrap_or(0),
                        batches: w.batches,
                        malformed: w.malformed,
                        replays: w.replays,
                        resets: w.resets,
                        restarts: w.restarts,
                        reason: w.reason.clone(),
                        last_malformed: w.last_malformed.clone(),
                    },
                )
            })
            .collect();
        for (id, (state, why)) in &self.off {
            out.insert(
                *id,
                WorkerEvents {
                    state: *state,
                    block_size: None,
                    blocks: 0,
                    batches: 0,
                    malformed: 0,
                    replays: 0,
                    resets: 0,
                    restarts: 0,
                    reason: Some(why.clone()),
                    last_malformed: None,
                },
            );
        }
        MessageResult(out)
    }
}

/// Per live worker and rank, the leading blocks of `tokens` held, at the worker's block
/// size; only workers whose events are live on every rank.
#[derive(Message, Debug)]
#[rtype(result = "ChainAnswer")]
pub struct MatchChain {
    /// The request's facts, shared; a token request is matched on its tokens.
    pub facts: Arc<RequestFacts>,
}

/// A rank's load as its engine pushed it (SGLang `LoadStat`): fresher than a poll for
/// the running and waiting counts; the poll still brings `gen_throughput`.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct LoadPushed {
    pub worker: WorkerId,
    pub rank: u32,
    pub stat: kvgate_kv_events::LoadStat,
}

/// Whether any worker's KV events are live: token requests ask the events actor only
/// while one is.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct EventsLive(pub bool);

/// The answer to [`MatchChain`].
#[derive(Debug, Default)]
pub struct ChainAnswer {
    /// (worker, rank, whole blocks of the request held, the worker's block size), for
    /// every rank of every live worker.
    pub per_rank: Vec<(WorkerId, u32, usize, u32)>,
    pub stats: ChainStats,
}

impl Handler<MatchChain> for EventsActor {
    type Result = MessageResult<MatchChain>;

    fn handle(&mut self, msg: MatchChain, _: &mut Context<Self>) -> Self::Result {
        let mut per_rank = Vec::new();
        let RoutingText::Tokens(tokens) = &msg.facts.key else {
            return MessageResult(ChainAnswer {
                per_rank,
                stats: self.index.stats(),
            });
        };
        // One walk per block size in the fleet, not one per worker.
        let mut walks = Vec::new();
        for (id, w) in &self.workers {
            let Some(bs) = w.desc.block_size.filter(|b| *b > 0) else {
                continue;
            };
            if !w.live() {
                continue;
            }
            let at = match walks.iter().position(|(b, _)| *b == bs) {
                Some(i) => i,
                None => {
                    let ns = super::namespace(
                        msg.facts.adapter.as_deref(),
                        msg.facts.cache_salt.as_deref(),
                    );
                    walks.push((bs, self.index.match_tokens(tokens, bs as usize, ns)));
                    walks.len() - 1
                }
            };
            let m = &walks[at].1;
            for r in w.ranks.keys() {
                per_rank.push((*id, *r, m.matched_by(*id, *r), bs));
            }
        }
        per_rank.sort();
        MessageResult(ChainAnswer {
            per_rank,
            stats: self.index.stats(),
        })
    }
}
