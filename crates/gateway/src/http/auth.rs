//! Who may call what: client keys on the inference routes, admin keys on the control
//! plane, and the allow-list of workers the admin API may add.

use actix_web::HttpRequest;
use actix_web::http::header::AUTHORIZATION;
use kvgate_core::Secret;

pub(crate) use crate::actors::registry::AllowList;
use crate::config::AccessConfig;
use crate::http::error::ApiError;

/// The configured keys.
#[derive(Clone, Default)]
pub(crate) struct Keys {
    client: Vec<Secret>,
    admin: Vec<Secret>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("client", &self.client.len())
            .field("admin", &self.admin.len())
            .finish()
    }
}

/// The bearer token of a request, if it has one.
fn bearer(req: &HttpRequest) -> Option<&[u8]> {
    let v = req.headers().get(AUTHORIZATION)?.as_bytes();
    let scheme = v.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| v[7..].trim_ascii())
}

impl Keys {
    pub(crate) fn new(cfg: &AccessConfig) -> Keys {
        Keys {
            client: cfg.api_keys.clone(),
            admin: cfg.admin_keys(),
        }
    }

    fn matches(keys: &[Secret], token: &[u8]) -> bool {
        // Every key is compared, so the time says nothing about which one matched.
        keys.iter().fold(false, |hit, k| hit | k.matches(token))
    }

    /// The client key on inference routes and `/v1/models` (401 without it).
    pub(crate) fn client(&self, req: &HttpRequest) -> Result<(), ApiError> {
        if self.client.is_empty() {
            return Ok(());
        }
        match bearer(req) {
            Some(t) if Self::matches(&self.client, t) => Ok(()),
            // An admin key may call what a client may.
            Some(t) if Self::matches(&self.admin, t) => Ok(()),
            Some(_) => Err(ApiError::Unauthorized("the API key is not valid")),
            None => Err(ApiError::Unauthorized(
                "an API key is required (Authorization: Bearer <key>)",
            )),
        }
    }

    /// The admin key on the control plane: 401 without a valid key, 403 for a client key.
    pub(crate) fn admin(&self, req: &HttpRequest) -> Result<(), ApiError> {
        if self.admin.is_empty() {
            return Ok(());
        }
        match bearer(req) {
            Some(t) if Self::matches(&self.admin, t) => Ok(()),
            Some(t) if Self::matches(&self.client, t) => {
                Err(ApiError::Forbidden("this key may not use the admin routes"))
            }
            Some(_) => Err(ApiError::Unauthorized("the admin key is not valid")),
            None => Err(ApiError::Unauthorized(
                "an admin key is required (Authorization: Bearer <key>)",
            )),
        }
    }

    /// Whether the gateway checks any key at all.
    pub(crate) fn any(&self) -> bool {
        !self.client.is_empty() || !self.admin.is_empty()
    }

    /// The key a rate limit counts a request under: its bearer token when keys are set.
    pub(crate) fn client_id(&self, req: &HttpRequest) -> Option<String> {
        if self.client.is_empty() {
            return None;
        }
        bearer(req).map(|t| String::from_utf8_lossy(t).into_owned())
    }
}
