//! The bodies the intake reads for a connection's handlers, and a handler's claim on one.

use std::cell::RefCell;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use actix_web::HttpRequest;
use bytes::Bytes;

use super::BODY_TOKEN;

/// How far a body's handler has got with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// No handler yet: nothing of the body is read past what came with its head
    /// (actix-http is still on the head).
    Unclaimed,
    /// Its handler holds it ([`BodyClaim::hold`]) and waits for admission: up to `PARKED`
    /// of it is read, so that a client that leaves meanwhile is seen.
    Held,
    /// Asked for: read whole, straight into a buffer of its size.
    Wanted,
}

#[derive(Debug)]
pub(super) enum Entry {
    /// Not whole yet; a request waiting for admission holds no more of its body than
    /// actix-http would.
    Pending {
        waker: Option<Waker>,
        want: Want,
    },
    Ready(Bytes),
    /// The client went away (or failed) before the whole body came.
    Lost,
}

/// Bodies read for the handlers of one connection, by token.
#[derive(Debug, Default)]
pub(crate) struct Bodies {
    pub(super) entries: RefCell<Vec<(u64, Entry)>>,
}

impl Bodies {
    /// A body taken for `token`, not read yet.
    pub(super) fn open(&self, token: u64) {
        self.entries.borrow_mut().push((
            token,
            Entry::Pending {
                waker: None,
                want: Want::Unclaimed,
            },
        ));
    }

    pub(super) fn set(&self, token: u64, to: Entry) {
        let mut entries = self.entries.borrow_mut();
        if let Some((_, e)) = entries.iter_mut().find(|(t, _)| *t == token)
            && let Entry::Pending { waker, .. } = std::mem::replace(e, to)
            && let Some(w) = waker
        {
            w.wake();
        }
    }

    fn contains(&self, token: u64) -> bool {
        self.entries.borrow().iter().any(|(t, _)| *t == token)
    }

    /// How far `token`'s handler has got with its body; `None` once it let it go.
    pub(super) fn want(&self, token: u64) -> Option<Want> {
        self.entries
            .borrow()
            .iter()
            .find(|(t, _)| *t == token)
            .map(|(_, e)| match e {
                Entry::Pending { want, .. } => *want,
                Entry::Ready(_) | Entry::Lost => Want::Wanted,
            })
    }

    /// Moves `token` on to `to` (never back), waking the connection's task so that the
    /// intake reads on.
    fn advance_to(&self, token: u64, to: Want, cx: &mut Context<'_>) {
        let mut entries = self.entries.borrow_mut();
        if let Some((_, Entry::Pending { want, .. })) =
            entries.iter_mut().find(|(t, _)| *t == token)
            && *want != Want::Wanted
            && *want != to
        {
            *want = to;
            cx.waker().wake_by_ref();
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.borrow().is_empty()
    }
}

/// A handler's claim on its request's body; dropped unread (the request was refused
/// before its body was needed), the body goes with it.
#[derive(Debug)]
pub(crate) struct BodyClaim {
    pub(super) bodies: Rc<Bodies>,
    pub(super) token: u64,
}

/// The client closed its connection, or it failed, before its body had come whole.
#[derive(Debug, thiserror::Error)]
#[error("the connection ended before the body had come whole")]
pub(crate) struct BodyLost;

/// The claim on `req`'s body when [`Intake`](super::Intake) read it; `None` when the body
/// is actix-http's payload as usual.
pub(crate) fn claim(req: &HttpRequest) -> Option<BodyClaim> {
    let token: u64 = req
        .headers()
        .get(&BODY_TOKEN)?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    let bodies = req.conn_data::<Rc<Bodies>>()?;
    bodies.contains(token).then(|| BodyClaim {
        bodies: bodies.clone(),
        token,
    })
}

impl BodyClaim {
    /// Says the handler holds the body: until [`body`](Self::body) asks for it, the intake
    /// reads a little of it, enough to see a client that leaves.
    pub(crate) async fn hold(&self) {
        poll_fn(|cx| {
            self.bodies.advance_to(self.token, Want::Held, cx);
            Poll::Ready(())
        })
        .await;
    }

    /// The whole body, once it has come.
    pub(crate) async fn body(self) -> Result<Bytes, BodyLost> {
        poll_fn(|cx| {
            self.bodies.advance_to(self.token, Want::Wanted, cx);
            let mut entries = self.bodies.entries.borrow_mut();
            let Some(i) = entries.iter().position(|(t, _)| *t == self.token) else {
                return Poll::Ready(Err(BodyLost));
            };
            match &mut entries[i].1 {
                Entry::Pending { waker, .. } => {
                    *waker = Some(cx.waker().clone());
                    Poll::Pending
                }
                Entry::Ready(_) | Entry::Lost => match entries.swap_remove(i).1 {
                    Entry::Ready(b) => Poll::Ready(Ok(b)),
                    _ => Poll::Ready(Err(BodyLost)),
                },
            }
        })
        .await
    }
}

impl Drop for BodyClaim {
    fn drop(&mut self) {
        self.bodies
            .entries
            .borrow_mut()
            .retain(|(t, _)| *t != self.token);
    }
}
