//! Supervision of the gateway's actors: a panic anywhere in one (a handler, a timer, its
//! `started`) restarts it in place, on the same mailbox, as actix's `Supervisor` restarts
//! an actor that stopped; its `Supervised::restarting` rebuilds its state (the selector
//! from the registry's last fleet, the index from the last snapshot, the KV-event
//! subscriptions from the last fleet with a replay) and `started` arms its timers again
//! (health checks, load polls, snapshots). An actor that keeps panicking is given up on,
//! and `/liveness` then fails so that the process is replaced.

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
    guard(ctx, act, (name, MAX_RESTARTS), sup);
}

/// Runs `act` in `ctx` on the current arbiter, watched but never restarted: its first
/// panic fails liveness. For an actor whose state a restart cannot rebuild.
pub(crate) fn run_watched<A>(ctx: Context<A>, act: A, name: &'static str, sup: Arc<Supervision>)
where
    A: Actor<Context = Context<A>> + Supervised,
{
    guard(ctx, act, (name, 0), sup);
}

fn guard<A>(
    ctx: Context<A>,
    act: A,
    (name, max_restarts): (&'static str, usize),
    sup: Arc<Supervision>,
) where
    A: Actor<Context = Context<A>> + Supervised,
{
    let fut = Guarded {
        fut: ctx.into_future(act),
        name,
        sup,
        recent: VecDeque::new(),
        max_restarts,
    };
    #[expect(
        clippy::disallowed_methods,
        reason = "the actor's own future, as `Context::run` spawns it; it ends with its mailbox"
    )]
    actix_rt::spawn(fut);
}

/// Starts the actor `make` builds on `arbiter` under supervision, as `start_in_arbiter`
/// would start it unsupervised; its address at once.
pub(crate) fn start_supervised<A>(
    arbiter: &actix_rt::ArbiterHandle,
    name: &'static str,
    sup: Arc<Supervision>,
    make: impl FnOnce() -> A + Send + 'static,
) -> actix::Addr<A>
where
    A: Actor<Context = Context<A>> + Supervised,
{
    let (tx, rx) = actix::dev::channel::channel::<A>(16);
    let started = arbiter.spawn_fn(move || {
        run_supervised(Context::with_receiver(rx), make(), name, sup);
    });
    if !started {
        tracing::error!(
            actor = name,
            "its arbiter has stopped; the actor never runs"
        );
    }
    actix::Addr::new(tx)
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
    /// Panics within `WINDOW` it is restarted after.
    max_restarts: usize,
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
                    if this.recent.len() > this.max_restarts {
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

#[cfg(test)]
mod tests {
    use actix::prelude::*;

    use super::*;

    struct Boom;

    impl Actor for Boom {
        type Context = Context<Self>;
    }

    impl Supervised for Boom {}

    #[derive(Message)]
    #[rtype(result = "u32")]
    struct Go(bool);

    impl Handler<Go> for Boom {
        type Result = u32;

        fn handle(&mut self, go: Go, _: &mut Context<Self>) -> u32 {
            assert!(!go.0, "told to panic");
            7
        }
    }

    #[actix_rt::test]
    async fn a_supervised_actor_answers_after_its_panic() {
        let sup = Arc::new(Supervision::default());
        let ctx = Context::new();
        let addr = ctx.address();
        run_supervised(ctx, Boom, "boom", sup.clone());
        assert!(
            addr.send(Go(true)).await.is_err(),
            "the panic drops the reply"
        );
        assert_eq!(addr.send(Go(false)).await.ok(), Some(7));
        assert_eq!((sup.restarts(), sup.given_up().len()), (1, 0));
    }

    #[actix_rt::test]
    async fn a_watched_actor_is_given_up_at_its_first_panic() {
        let sup = Arc::new(Supervision::default());
        let ctx = Context::new();
        let addr = ctx.address();
        run_watched(ctx, Boom, "watched", sup.clone());
        assert_eq!(addr.send(Go(false)).await.ok(), Some(7));
        assert!(addr.send(Go(true)).await.is_err());
        assert!(addr.send(Go(false)).await.is_err(), "it is not restarted");
        assert_eq!((sup.restarts(), sup.given_up()), (0, vec!["watched"]));
    }
}
