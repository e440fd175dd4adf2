//! Control routes: the engine's own cache and request controls, and the simulator's faults,
//! counters and restart.

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::ContentType;
use actix_web::web::{Bytes, Data};
use serde::Deserialize;
use serde_json::json;

use super::Answer;
use crate::Fault;
use crate::api;
use crate::engine::Engine;
use crate::error::ApiError;

pub(super) async fn flush_cache(e: Data<Engine>) -> HttpResponse {
    // SGLang's own text; it refuses while requests are in flight.
    const TEXT: &str = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n";
    let status = if e.flush() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    HttpResponse::build(status)
        .content_type(ContentType::plaintext())
        .body(TEXT)
}

#[derive(Deserialize)]
struct AbortBody {
    rid: String,
}

pub(super) async fn abort_request(e: Data<Engine>, body: Bytes) -> Answer {
    let b: AbortBody = api::json_body(&body)?;
    e.abort(&b.rid);
    Ok(HttpResponse::Ok().finish())
}

pub(super) async fn sim_stats(e: Data<Engine>) -> HttpResponse {
    HttpResponse::Ok().json(e.stats())
}

pub(super) async fn sim_fault(e: Data<Engine>, body: Bytes) -> Answer {
    let fault: Fault = api::json_body(&body)?;
    if let Fault::ErrorStatus { status, .. } = &fault
        && StatusCode::from_u16(*status).is_err()
    {
        return Err(ApiError::BadRequest(format!(
            "{status} is not an HTTP status"
        )));
    }
    e.set_fault(fault.clone());
    Ok(HttpResponse::Ok().json(fault))
}

pub(super) async fn sim_restart(e: Data<Engine>) -> HttpResponse {
    e.restart();
    HttpResponse::Ok().json(json!({"startup_time": e.startup_time()}))
}
