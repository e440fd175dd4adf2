//! Test builds only (feature `fault-injection`): a message whose handler panics, to show
//! the supervisor restarts the actors beside the routing ones.

use actix::prelude::*;
use kvgate_poller::LoadPoller;

use crate::actors::events::EventsActor;
use crate::actors::registry::RegistryActor;
use crate::actors::tokenizers::TokenizerActor;

/// Makes the receiving actor's handler panic.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ActorCrash;

macro_rules! crashes {
    ($($actor:ty),*) => {$(
        impl Handler<ActorCrash> for $actor {
            type Result = ();

            fn handle(&mut self, _: ActorCrash, _: &mut Context<Self>) {
                panic!("injected panic in a {} handler", stringify!($actor));
            }
        }
    )*};
}

crashes!(RegistryActor, LoadPoller, EventsActor, TokenizerActor);
