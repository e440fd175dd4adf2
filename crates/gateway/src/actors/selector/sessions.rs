//! Where each session went last: a session's next request, sharing no prefix with its
//! earlier ones (an agent's tool results, a new document), follows it there unless load
//! says otherwise (the cost mode's `session` rule). The newest sessions are kept.

use std::collections::{HashMap, VecDeque};

use kvgate_policies::WorkerId;

/// Sessions remembered.
const MAX_SESSIONS: usize = 65_536;

#[derive(Debug, Default)]
pub(super) struct Sessions {
    last: HashMap<Box<str>, WorkerId, foldhash::fast::RandomState>,
    order: VecDeque<Box<str>>,
}

impl Sessions {
    /// The target `session` was last sent to.
    pub(super) fn holder(&self, session: &str) -> Option<WorkerId> {
        self.last.get(session).copied()
    }

    pub(super) fn sent(&mut self, session: &str, target: WorkerId) {
        match self.last.get_mut(session) {
            Some(t) => *t = target,
            None => {
                self.last.insert(session.into(), target);
                self.order.push_back(session.into());
                if self.order.len() > MAX_SESSIONS
                    && let Some(old) = self.order.pop_front()
                {
                    self.last.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{MAX_SESSIONS, Sessions};
    use kvgate_policies::WorkerId;

    #[test]
    fn the_last_target_is_kept_and_the_oldest_sessions_go() {
        let mut s = Sessions::default();
        s.sent("a", WorkerId(1));
        s.sent("a", WorkerId(2));
        assert_eq!(s.holder("a"), Some(WorkerId(2)));
        for i in 0..MAX_SESSIONS {
            s.sent(&format!("s{i}"), WorkerId(3));
        }
        assert_eq!(s.holder("a"), None);
        assert_eq!(
            s.holder(&format!("s{}", MAX_SESSIONS - 1)),
            Some(WorkerId(3))
        );
    }
}
