//! The prefill hold: a request whose chosen worker is still computing the prefix it
//! would reuse, for a streamed request sent just before it, waits for that request's
//! first token instead of prefilling the same prefix beside it (an engine caches a prompt
//! only once its prefill ends). The selector owns the [`Holds`]; the dispatch pipeline
//! (`crate::pipeline`) is the caller's side, which waits out a hold and asks again.

use std::sync::Arc;
use std::time::Duration;

use kvgate_policies::{PolicyConfig, RequestFacts, RoutingText, WorkerId};
use tokio::sync::oneshot;

/// Wait, then ask again (holding again only within the same `max` in all). The chosen
/// worker is still computing the prefix this request would reuse, for a streamed request
/// sent just before it. The wait ends at that request's first token, its end, or `max`.
#[derive(Debug)]
pub struct Hold {
    pub ready: oneshot::Receiver<()>,
    pub max: Duration,
}

/// A streamed dispatch still in prefill on `worker`: it computes `key` past the `known`
/// units the worker already held for it.
#[derive(Debug)]
struct Warming {
    booking: u64,
    worker: WorkerId,
    /// The streamed request's facts: its key is what the worker is computing.
    facts: Arc<RequestFacts>,
    known: usize,
    waiters: Vec<oneshot::Sender<()>>,
}

/// The streamed dispatches whose prefill has not ended, with the requests holding on them.
#[derive(Debug)]
pub(super) struct Holds {
    /// Longest wait of a [`Hold`]; zero turns holds off.
    pub(super) max: Duration,
    /// Units of new prefix worth waiting for: the cost mode's floor on a useful match, in
    /// tokens and in bytes of text.
    gain_tokens: usize,
    gain_bytes: usize,
    warming: Vec<Warming>,
}

/// Whether two routing keys share at least their first `n` units. Slice equality stops at
/// the first difference, so an unrelated long prompt costs little.
fn shares_at_least(a: &RoutingText, b: &RoutingText, n: usize) -> bool {
    fn head<T: PartialEq>(a: &[T], b: &[T], n: usize) -> bool {
        a.len() >= n && b.len() >= n && a[..n] == b[..n]
    }
    match (a, b) {
        (RoutingText::Text(a), RoutingText::Text(b)) => a.shares_head(b, n),
        (RoutingText::Tokens(a), RoutingText::Tokens(b)) => head(a, b, n),
        _ => false,
    }
}

/// Units as the index counts them: bytes of text, tokens.
fn key_units(k: &RoutingText) -> usize {
    match k {
        RoutingText::Text(t) => t.len(),
        RoutingText::Tokens(t) => t.len(),
        RoutingText::Empty => 0,
    }
}

impl Holds {
    pub(super) fn new(max: Duration, policy: &PolicyConfig) -> Holds {
        let tokens = policy.min_match_tokens.max(1);
        Holds {
            max,
            gain_tokens: tokens,
            gain_bytes: (tokens as f64 * policy.bytes_per_token).ceil() as usize,
            warming: Vec::new(),
        }
    }

    fn gain(&self, key: &RoutingText) -> usize {
        match key {
            RoutingText::Text(_) => self.gain_bytes,
            _ => self.gain_tokens,
        }
    }

    /// A wait for a request bound for `worker`, if that worker is still prefilling a
    /// prefix the request shares past what it already held.
    pub(super) fn join(
        &mut self,
        worker: WorkerId,
        key: &RoutingText,
    ) -> Option<oneshot::Receiver<()>> {
        if self.max.is_zero() {
            return None;
        }
        let gain = self.gain(key);
        let w = self
            .warming
            .iter_mut()
            .find(|w| w.worker == worker && shares_at_least(key, &w.facts.key, w.known + gain))?;
        let (tx, rx) = oneshot::channel();
        w.waiters.push(tx);
        Some(rx)
    }

    /// Tracks a dispatch that may draw followers: only a streamed answer says when its
    /// prefill ends (its first chunk), and only a recorded prefix can be shared.
    pub(super) fn track(
        &mut self,
        booking: u64,
        worker: WorkerId,
        facts: &Arc<RequestFacts>,
        known: usize,
        recorded: bool,
    ) {
        let worth_it = key_units(&facts.key) >= known + self.gain(&facts.key);
        if !self.max.is_zero() && facts.stream && recorded && worth_it {
            self.warming.push(Warming {
                booking,
                worker,
                facts: facts.clone(),
                known,
                waiters: Vec::new(),
            });
        }
    }

    /// Lets every request holding on `booking` go.
    pub(super) fn warmed(&mut self, booking: u64) {
        if let Some(i) = self.warming.iter().position(|w| w.booking == booking) {
            for tx in self.warming.swap_remove(i).waiters {
                let _ = tx.send(());
            }
        }
    }

    /// A worker that left will not warm anything: its followers choose again.
    pub(super) fn forget_gone(&mut self, still_there: impl Fn(WorkerId) -> bool) {
        let gone: Vec<u64> = self
            .warming
            .iter()
            .filter(|w| !still_there(w.worker))
            .map(|w| w.booking)
            .collect();
        for b in gone {
            self.warmed(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_heads_are_compared_by_unit() {
        let t = |s: &str| RoutingText::Text(s.into());
        assert!(shares_at_least(
            &t("system prompt, question 1"),
            &t("system prompt, question 2"),
            23
        ));
        assert!(!shares_at_least(
            &t("system prompt, question 1"),
            &t("system prompt, question 2"),
            25
        ));
        assert!(!shares_at_least(&t("short"), &t("short"), 6));
        let k = |v: &[u32]| RoutingText::Tokens(v.to_vec());
        assert!(shares_at_least(&k(&[1, 2, 3]), &k(&[1, 2, 4]), 2));
        assert!(!shares_at_least(&k(&[1, 2, 3]), &k(&[1, 2, 4]), 3));
        // Text never matches tokens.
        assert!(!shares_at_least(&t("ab"), &k(&[97, 98]), 1));
    }
}
