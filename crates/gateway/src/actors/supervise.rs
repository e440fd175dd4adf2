//! Supervision of the routing actors: a panic anywhere in one (a handler, a timer, its
//! `started`) restarts it in place, on the same mailbox, as actix's `Supervisor` restarts
//! an actor that stopped; its `Supervised::restarting` rebuilds its state (the selector
//! from the registry's last fleet, the index from the last snapshot). An actor that keeps
//! panicking is given up on, and `/liveness` then fails so that the process is replaced.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use actix::dev::ContextFut;
use actix::{Actor, Context, Supervised};

/// More panics than this within `WINDOW` and the actor is not restarted again: it is
/// failing on every message, and a fresh process is the better cure.
const MAX_RESTARTS: usize = 10;
const WINDOW: Duration = Duration::from_secs(60);

/// What the supervisors know: the actors given up on, and the restarts so far.
#[derive(Debug, Default)]
pub(crate) struct Supervision {
    given_up: Mutex<Vec<&'static str>>,
    restarts: std::sync::atomic::AtomicU64,
}

impl Supervision {
    /// The actors that could not be restarted; empty while all run.
    pub(crate) fn given_up(&self) -> Vec<&'static str> {
        self.given_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Restarts after a panic since the gateway started.
    pub(crate) fn restarts(&self) -> u64 {
        self.restarts.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Runs `act` in `ctx` on the current arbiter under supervision.
pub(crate) fn run_supervised<A>(ctx: Context<A>, act: A, name: &'static str, sup: Arc<Supervision>)
where
    A: Actor<Context = Context<A>> + Supervised,
{
    let fut = Guarded {
        fut: ctx.into_future(act),
        name,
        sup,
        recent: VecDeque::new(),
    };
    #[expect(
        clippy::disallowed_methods,
        reason = "the actor's own future, as `Context::run` spawns it; it ends with its mailbox"
    )]
    actix_rt::spawn(fut);
}

/// An actor's context future, polled inside `catch_unwind`.
struct Guarded<A>
where
    A: Actor<Context = Context<A>>,
{
    fut: ContextFut<A, Context<A>>,
    name: &'static str,
    sup: Arc<Supervision>,
    /// When it panicked lately.
    recent: VecDeque<Instant>,
}

impl<A> Guarded<A>
where
    A: Actor<Context = Context<A>>,
{
    fn give_up(&self) {
        self.sup
            .given_up
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.name);
    }
}

impl<A> Future for Guarded<A>
where
    A: Actor<Context = Context<A>> + Supervised,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            let polled =
                std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(&mut this.fut).poll(cx)));
            match polled {
                Ok(Poll::Pending) => return Poll::Pending,
                // Stopped on purpose: restarted while anyone holds its address.
                Ok(Poll::Ready(())) => {
                    if !this.fut.restart() {
                        return Poll::Ready(());
                    }
                }
                Err(_) => {
                    let now = Instant::now();
                    this.recent.retain(|t| now.duration_since(*t) < WINDOW);
                    this.recent.push_back(now);
                    if this.recent.len() > MAX_RESTARTS {
                        tracing::error!(
                            actor = this.name,
                            "the actor keeps panicking; it is not restarted again (liveness fails)"
                        );
                        this.give_up();
                        return Poll::Ready(());
                    }
                    tracing::error!(
                        actor = this.name,
                        "the actor panicked; it restarts and rebuilds its state"
                    );
                    this.sup
                        .restarts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    // A rebuild that panics itself cannot be retried on the same state.
                    let fut = &mut this.fut;
                    match std::panic::catch_unwind(AssertUnwindSafe(|| fut.restart())) {
                        Ok(true) => {}
                        Ok(false) => return Poll::Ready(()),
                        Err(_) => {
                            tracing::error!(
                                actor = this.name,
                                "the actor's rebuild panicked; it is not restarted again (liveness fails)"
                            );
                            this.give_up();
                            return Poll::Ready(());
                        }
                    }
                }
            }
        }
    }
}
