//! The pick through the dispatch pipeline: the subset hint as the workers left out, one
//! attempt (the selector's decision, booked and logged like the HTTP door's), and the
//! endpoints Envoy gets, the pick first and then the decision's runners-up. When Envoy
//! reports that another endpoint of the list served, the booking moves there.

use kvgate_policies::WorkerId;
use tracing::warn;

use super::envoy::endpoint_of;
use crate::pipeline::{Attempt, Job, Outcome, Pipeline, Refusal, Target};

/// Endpoints after the pick in the fallback list: enough for a gateway's retries, few
/// enough that each is a worker the decision would still choose.
const FALLBACKS: usize = 3;

/// A request's pick: its attempt (booking and decision-log note) and what Envoy is told.
#[derive(Debug)]
pub(super) struct Pick {
    pub attempt: Attempt,
    /// `IP:PORT` of the picked worker.
    pub endpoint: String,
    /// The pick and its fallbacks, comma-separated.
    pub destinations: String,
}

/// 503: the subset hint names no endpoint kvgate can route to.
fn no_endpoint_in_subset() -> Refusal {
    Refusal {
        status: 503,
        kind: "service_unavailable",
        code: "no_available_workers",
        message: "no worker of the gateway's endpoint subset is available".into(),
        retry_after: Some(1),
    }
}

/// The workers outside `subset` (none without one); `None` when the subset leaves no
/// worker kvgate knows.
pub(super) fn outside(targets: &[Target], subset: Option<&[String]>) -> Option<Vec<WorkerId>> {
    let Some(subset) = subset else {
        return Some(Vec::new());
    };
    let (inside, out): (Vec<&Target>, Vec<&Target>) = targets
        .iter()
        .partition(|t| subset.contains(&endpoint_of(&t.url)));
    if inside.is_empty() {
        return None;
    }
    Some(out.into_iter().map(|t| t.worker).collect())
}

/// The pick first, then the runners-up that are ready and not left out, then other ready
/// workers in the selector's order, [`FALLBACKS`] at most after the pick.
pub(super) fn destinations(
    first: &str,
    runners_up: &[WorkerId],
    targets: &[Target],
    exclude: &[WorkerId],
) -> String {
    let usable = |t: &&Target| t.eligible && !exclude.contains(&t.worker);
    let ranked = runners_up
        .iter()
        .filter_map(|id| targets.iter().find(|t| t.id == *id))
        .filter(usable);
    let rest = targets.iter().filter(usable);
    let mut list = vec![first.to_owned()];
    for t in ranked.chain(rest) {
        if list.len() > FALLBACKS {
            break;
        }
        let e = endpoint_of(&t.url);
        if !list.contains(&e) {
            list.push(e);
        }
    }
    list.join(",")
}

/// The first attempt of `job` within `subset`.
pub(super) async fn pick(
    pipeline: &Pipeline,
    job: &Job,
    subset: Option<&[String]>,
) -> Result<Pick, Refusal> {
    let targets = pipeline
        .targets()
        .await
        .map_err(|e| Refusal::dispatch(&e))?;
    let exclude = outside(&targets, subset).ok_or_else(no_endpoint_in_subset)?;
    let attempt = pipeline
        .attempt(job, &exclude, 1)
        .await
        .map_err(|e| Refusal::dispatch(&e))?;
    let endpoint = endpoint_of(attempt.dispatch.url.as_str());
    let destinations = destinations(&endpoint, &attempt.runners_up, &targets, &exclude);
    Ok(Pick {
        attempt,
        endpoint,
        destinations,
    })
}

/// Envoy says `served` served the request, not the pick: the pick failed it (its circuit
/// hears so, its index record goes), and the request is booked, recorded and logged on
/// `served` as a further attempt. `None` when `served` is no worker kvgate routes to.
pub(super) async fn moved(
    pipeline: &Pipeline,
    job: &Job,
    mut first: Pick,
    served: &str,
) -> Option<Pick> {
    first.attempt.dispatch.booking.set_outcome(Outcome::Failure);
    first.attempt.note.failed();
    if let Some(r) = first.attempt.dispatch.recorded.take() {
        pipeline.forget(job, r);
    }
    let number = first.attempt.number + 1;
    // Released before the next booking: the worker that failed is not counted twice.
    drop(first);
    let targets = pipeline.targets().await.ok()?;
    let exclude: Vec<WorkerId> = targets
        .iter()
        .filter(|t| endpoint_of(&t.url) != served)
        .map(|t| t.worker)
        .collect();
    if exclude.len() == targets.len() {
        warn!(request_id = %job.request_id, served, "the served endpoint is no worker of kvgate's");
        return None;
    }
    match pipeline.attempt(job, &exclude, number).await {
        Ok(attempt) => Some(Pick {
            attempt,
            endpoint: served.to_owned(),
            destinations: served.to_owned(),
        }),
        Err(e) => {
            warn!(request_id = %job.request_id, served, error = %e, "cannot book the served endpoint");
            None
        }
    }
}
