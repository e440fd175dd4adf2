//! What an engine says about itself: health and readiness, models, server and model info,
//! loads and metrics.

use actix_web::HttpResponse;
use actix_web::http::header::ContentType;
use actix_web::web::{self, Data};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Answer;
use crate::engine::Engine;
use crate::error::ApiError;
use crate::load::{self, SGLANG_VERSION};
use crate::{Fault, Flavor};

fn health_answer(e: &Engine) -> HttpResponse {
    if e.health_down() {
        HttpResponse::ServiceUnavailable().finish()
    } else {
        HttpResponse::Ok().finish()
    }
}

pub(super) async fn health(e: Data<Engine>) -> HttpResponse {
    health_answer(&e)
}

pub(super) async fn ready(e: Data<Engine>) -> HttpResponse {
    health_answer(&e)
}

pub(super) async fn health_generate(e: Data<Engine>) -> HttpResponse {
    if !e.health_down() {
        e.health_generate().await;
    }
    health_answer(&e)
}

pub(super) async fn models(e: Data<Engine>) -> HttpResponse {
    let owned_by = if e.cfg.flavor == Flavor::Vllm {
        "vllm"
    } else {
        "sglang"
    };
    let created = e.startup_time() as u64;
    let mut data = vec![json!({
        "id": e.cfg.model,
        "object": "model",
        "created": created,
        "owned_by": owned_by,
        "root": e.cfg.model,
        "parent": null,
        "max_model_len": e.cfg.context_length,
    })];
    // vLLM lists each adapter as a model whose parent is the base.
    for a in &e.cfg.lora_adapters {
        data.push(json!({
            "id": a,
            "object": "model",
            "created": created,
            "owned_by": owned_by,
            "root": format!("/adapters/{a}"),
            "parent": e.cfg.model,
            "max_model_len": e.cfg.context_length,
        }));
    }
    HttpResponse::Ok().json(json!({"object": "list", "data": data}))
}

pub(super) async fn server_info(e: Data<Engine>) -> HttpResponse {
    let c = &e.cfg;
    let internal_states: Vec<Value> = e
        .snapshots()
        .iter()
        .enumerate()
        .map(|(rank, s)| json!({"dp_rank": rank, "last_gen_throughput": s.gen_throughput}))
        .collect();
    HttpResponse::Ok().json(json!({
        "model_path": c.model,
        "tokenizer_path": tokenizer_path(c),
        "served_model_name": c.model,
        "tp_size": 1,
        "dp_size": c.dp_size,
        "page_size": c.page_size,
        "max_running_requests": c.max_running_requests,
        "max_total_num_tokens": c.cache_capacity_tokens,
        "context_length": c.context_length,
        "disaggregation_mode": "null",
        "startup_time": e.startup_time(),
        "internal_states": internal_states,
        "version": c.version.as_deref().unwrap_or(SGLANG_VERSION),
        "kv_events": e.kv_events().map(|p| p.descriptor(c)),
    }))
}

/// The configured tokenizer's path, else the model's name (as SGLang reports the model path
/// when no separate tokenizer was given).
fn tokenizer_path(c: &crate::SimConfig) -> Value {
    match &c.tokenizer_path {
        Some(p) => Value::from(p.to_string_lossy().into_owned()),
        None => Value::from(c.model.as_str()),
    }
}

pub(super) async fn model_info(e: Data<Engine>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "model_path": e.cfg.model,
        "tokenizer_path": tokenizer_path(&e.cfg),
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
    }))
}

#[derive(Deserialize)]
pub(super) struct LoadsQuery {
    /// Accepted; only the core section is served.
    #[serde(rename = "include")]
    _include: Option<String>,
    dp_rank: Option<usize>,
    format: Option<String>,
}

pub(super) async fn loads(
    e: Data<Engine>,
    q: Result<web::Query<LoadsQuery>, actix_web::Error>,
) -> Answer {
    hang_if_loads_hang(&e).await;
    let q = q.map_err(|err| ApiError::BadRequest(err.to_string()))?;
    if let Some(r) = q.dp_rank.filter(|r| *r >= e.ranks.len()) {
        return Err(ApiError::BadRequest(format!(
            "dp_rank {r} is out of range (dp_size {})",
            e.ranks.len()
        )));
    }
    let body = load::loads(&e.cfg, &e.snapshots(), q.dp_rank);
    Ok(match q.format.as_deref() {
        Some("prometheus") => HttpResponse::Ok()
            .content_type(ContentType::plaintext())
            .body(load::loads_prometheus(&body)),
        _ => HttpResponse::Ok().json(body),
    })
}

/// Dropped with the connection when the poller gives up.
async fn hang_if_loads_hang(e: &Engine) {
    if e.fault() == Fault::LoadsHang {
        std::future::pending::<()>().await;
    }
}

pub(super) async fn metrics(e: Data<Engine>) -> HttpResponse {
    hang_if_loads_hang(&e).await;
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(load::metrics(&e.cfg, &e.snapshots(), &e.scopes))
}
