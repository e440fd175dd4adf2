//! The idle keep-alive connections of one HTTP thread, per worker: taken by a request,
//! given back by its body once read to the end, swept when they outlive the keep-alive.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::tls::Conn;

/// Idle connections kept per worker and thread; more are closed.
const MAX_IDLE: usize = 256;

struct Idle {
    conn: Conn,
    since: Instant,
}

struct Shared {
    idle: RefCell<HashMap<String, Vec<Idle>, foldhash::fast::RandomState>>,
    keep_alive: Duration,
}

/// The idle connections, by worker origin (`scheme://host:port`); cloning shares them.
#[derive(Clone)]
pub(super) struct IdleConns(Rc<Shared>);

impl IdleConns {
    pub(super) fn new(keep_alive: Duration) -> IdleConns {
        IdleConns(Rc::new(Shared {
            idle: RefCell::new(HashMap::default()),
            keep_alive,
        }))
    }

    pub(super) fn keep_alive(&self) -> Duration {
        self.0.keep_alive
    }

    /// Idle connections held in all.
    pub(super) fn len(&self) -> usize {
        self.0.idle.borrow().values().map(Vec::len).sum()
    }

    /// Idle connections held for the worker at `origin`.
    #[cfg(test)]
    pub(super) fn count(&self, origin: &str) -> usize {
        self.0.idle.borrow().get(origin).map_or(0, Vec::len)
    }

    /// Workers with an idle-connection list.
    #[cfg(test)]
    pub(super) fn workers(&self) -> usize {
        self.0.idle.borrow().len()
    }

    /// A live idle connection, newest first; expired or closed ones are dropped.
    pub(super) fn checkout(&self, origin: &str) -> Option<Conn> {
        let mut idle = self.0.idle.borrow_mut();
        let list = idle.get_mut(origin)?;
        prune(list, self.0.keep_alive);
        while let Some(Idle { mut conn, .. }) = list.pop() {
            if conn.idle_alive() {
                return Some(conn);
            }
        }
        None
    }

    /// Expired connections are left to the next checkout or sweep.
    pub(super) fn checkin(&self, origin: &str, conn: Conn) {
        let mut idle = self.0.idle.borrow_mut();
        let entry = Idle {
            conn,
            since: Instant::now(),
        };
        // Looked up first: the key is allocated only for a worker's first connection.
        match idle.get_mut(origin) {
            Some(list) if list.len() >= MAX_IDLE => {}
            Some(list) => list.push(entry),
            None => {
                idle.insert(origin.to_owned(), vec![entry]);
            }
        }
    }

    /// Closes every connection idle past the keep-alive and forgets workers with none left.
    pub(super) fn sweep(&self) {
        let mut idle = self.0.idle.borrow_mut();
        idle.retain(|_, list| {
            prune(list, self.0.keep_alive);
            !list.is_empty()
        });
    }

    /// Sweeps every keep-alive period on this thread's runtime, so connections to a
    /// worker that gets no more traffic (or was removed) are closed too; the task holds
    /// the connections weakly and ends with them. Must be called on an actix or tokio
    /// local runtime.
    pub(super) fn spawn_sweeper(&self) {
        let idle = Rc::downgrade(&self.0);
        let every = self.0.keep_alive.max(Duration::from_millis(10));
        #[expect(
            clippy::disallowed_methods,
            reason = "the sweeper holds the connections weakly and ends with them"
        )]
        actix_rt::spawn(async move {
            loop {
                actix_rt::time::sleep(every).await;
                match idle.upgrade() {
                    Some(shared) => IdleConns(shared).sweep(),
                    None => return,
                }
            }
        });
    }
}

/// Drops the connections idle past `keep_alive`: the oldest, at the front.
fn prune(list: &mut Vec<Idle>, keep_alive: Duration) {
    let now = Instant::now();
    let expired = list.partition_point(|i| now.duration_since(i.since) >= keep_alive);
    list.drain(..expired);
}
