//! A publisher without replay that has gone quiet: silent while its engine reports running
//! requests or its cache changes, it is taken as dead (its rank stalled) until a batch
//! comes again. An idle
//! engine publishes nothing either, so silence alone says nothing.

use actix::prelude::*;
use kvgate_policies::WorkerId;
use tracing::warn;

use super::{EventsActor, RankState};

/// The engine reported running requests, or a change of its cache's used tokens, in a
/// load poll (`do_send` from the selector: best effort, a lost one only delays a stall).
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub(crate) struct EngineBusy(pub(crate) WorkerId);

impl Handler<EngineBusy> for EventsActor {
    type Result = ();

    fn handle(&mut self, EngineBusy(id): EngineBusy, _: &mut Context<Self>) {
        if let Some(w) = self.workers.get_mut(&id) {
            w.busy_at = Some(std::time::Instant::now());
        }
    }
}

impl EventsActor {
    /// A rank without replay sent nothing for `secs`: stalled when its engine still
    /// reported work a whole silence after its last batch (the requests that batch came
    /// from may still be running just after it).
    pub(super) fn silent(&mut self, worker: WorkerId, rank: u32, secs: f64) {
        let silence = self.silence;
        let Some(w) = self.workers.get_mut(&worker) else {
            return;
        };
        if w.busy_at.is_none_or(|b| b <= w.last_batch + silence) {
            return;
        }
        if w.ranks.insert(rank, RankState::Stalled) != Some(RankState::Stalled) {
            warn!(worker = %w.url, rank, "KV events: silent while the engine works; routing falls back to the approximate index");
        }
        w.reason = Some(format!(
            "no KV event for {secs} s while the engine reports running requests or cache changes"
        ));
    }
}
