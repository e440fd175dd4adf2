//! The route table: every HTTP route and the request-id middleware, over the shared
//! `AppState` and one upstream `Pool` per HTTP thread.

use std::sync::Arc;

use actix_web::body::{BoxBody, EitherBody};
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::{Next, from_fn};
use actix_web::{App, HttpMessage, web};
use rand::RngCore;

use crate::http::error::{ApiError, ErrorBody, with_request_id};
use crate::http::inference;
use crate::http::inspect;
use crate::http::routes;
use crate::http::state::{AppState, RequestId, require_json};
use crate::upstream::Pool;
use kvgate_core::Endpoint;

static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

fn valid_request_id(v: &HeaderValue) -> Option<&str> {
    let s = v.to_str().ok()?;
    (!s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic())).then_some(s)
}

fn new_request_id() -> Arc<str> {
    const DIGITS: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    // Eight base-62 digits from each of three draws: a draw per character (Alphanumeric)
    // cost 1.6 times the instructions (callgrind). 2^64 is 84k times 62^8, so the digits
    // are uniform to within 1e-5. Written on the stack: the `Arc` is the one allocation.
    let mut rng = rand::thread_rng();
    let mut id = *b"req-000000000000000000000000";
    for draw in id[4..].chunks_exact_mut(8) {
        let mut x = rng.next_u64();
        for d in draw {
            *d = DIGITS[(x % 62) as usize];
            x /= 62;
        }
    }
    // Only ASCII digits and letters were written.
    Arc::from(std::str::from_utf8(&id).unwrap_or("req-"))
}

/// Every route, and the request-id middleware.
pub(crate) fn app(
    state: web::Data<AppState>,
    pool: Pool,
) -> App<
    impl actix_web::dev::ServiceFactory<
        actix_web::dev::ServiceRequest,
        Config = (),
        Response = actix_web::dev::ServiceResponse<actix_web::body::BoxBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let id_headers = state.request_id_headers.clone();
    App::new()
        .app_data(state)
        .app_data(web::Data::new(pool))
        .app_data(web::QueryConfig::default().error_handler(|e, _| {
            ApiError::BadRequest(format!("invalid query string: {e}")).into()
        }))
        .wrap_fn(move |req, srv| {
            let id: Arc<str> = (id_headers.iter())
                .find_map(|h| req.headers().get(h).and_then(valid_request_id))
                .map_or_else(new_request_id, Arc::from);
            req.extensions_mut().insert(RequestId(id.clone()));
            let fut = srv.call(req);
            async move {
                let mut res = fut.await?;
                if let Ok(v) = HeaderValue::from_str(&id) {
                    res.headers_mut().insert(X_REQUEST_ID.clone(), v);
                }
                // The gateway's own error bodies carry the id too (looked for only on an
                // error status, off the success path).
                if res.status().is_client_error() || res.status().is_server_error() {
                    let body = res.response_mut().extensions_mut().remove::<ErrorBody>();
                    if let Some(ErrorBody(mut b)) = body {
                        with_request_id(&mut b, &id);
                        let bytes = serde_json::to_vec(&b).unwrap_or_default();
                        res = res.map_body(|_, _| BoxBody::new(bytes));
                    }
                }
                Ok(res)
            }
        })
        .configure(|cfg| {
            for e in Endpoint::ALL.into_iter().filter(|e| *e != Endpoint::Other) {
                cfg.service(proxied(e));
            }
        })
        .service(get("/health", routes::health))
        .service(get("/liveness", routes::liveness))
        .service(get("/readiness", routes::readiness))
        .service(get("/v1/models", routes::models))
        .service(get("/v1/models/{id:.+}", routes::model))
        .service(
            web::resource("/workers")
                .route(web::get().to(routes::list_workers))
                .route(json_post(routes::post_worker))
                .default_service(web::to(routes::method_not_allowed)),
        )
        .service(
            web::resource("/workers/{key:.*}")
                .route(web::get().to(routes::get_worker))
                .route(web::delete().to(routes::delete_worker))
                .default_service(web::to(routes::method_not_allowed)),
        )
        .service(post("/flush_cache", routes::flush_cache))
        .service(get("/admin/index", routes::index_stats))
        .service(json_admin("/admin/explain", inspect::explain))
        .service(json_admin("/admin/explain/{route:.*}", inspect::explain))
        .service(get("/admin/decisions", inspect::decisions))
        .service(get("/metrics", inspect::metrics))
        .service(get("/admin/state", inspect::fleet_state))
        .service(get("/admin/history", inspect::history))
        .service(get("/dashboard", inspect::dashboard))
        .service(post("/add_worker", routes::legacy_add))
        .service(post("/remove_worker", routes::legacy_remove))
        .service(get("/list_workers", routes::legacy_list))
        .default_service(web::to(inference::passthrough))
}

/// An inference route, proxied.
fn proxied(endpoint: Endpoint) -> actix_web::Resource {
    web::resource(endpoint.path())
        .route(web::post().to(move |req, payload, state, client| {
            inference::inference(endpoint, req, payload, state, client)
        }))
        .default_service(web::to(routes::method_not_allowed))
}

fn post<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    only(path, web::post().to(handler))
}

/// An admin route that takes a JSON body.
fn json_admin<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    only(path, json_post(handler))
}

/// A resource answering `route` alone; any other method is 405.
fn only(path: &str, route: actix_web::Route) -> actix_web::Resource {
    web::resource(path)
        .route(route)
        .default_service(web::to(routes::method_not_allowed))
}

/// `POST` with a JSON body on an admin route: the admin check first (a client key is
/// still 403), then the declared type (415), before the handler reads anything.
fn json_post<F, Args>(handler: F) -> actix_web::Route
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::post().to(handler).wrap(from_fn(json_only))
}

async fn json_only(
    req: ServiceRequest,
    next: Next<BoxBody>,
) -> Result<ServiceResponse<EitherBody<BoxBody>>, actix_web::Error> {
    let admin = match req.app_data::<web::Data<AppState>>() {
        Some(state) => state.keys.admin(req.request()),
        None => Ok(()),
    };
    match admin.and_then(|()| require_json(req.request())) {
        Ok(()) => Ok(next.call(req).await?.map_into_left_body()),
        Err(e) => Ok(req.error_response(e).map_into_right_body()),
    }
}

fn get<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: actix_web::Handler<Args>,
    Args: actix_web::FromRequest + 'static,
    F::Output: actix_web::Responder + 'static,
{
    web::resource(path)
        .route(web::get().to(handler))
        .default_service(web::to(routes::method_not_allowed))
}
