//! The models' tokenizers, for text requests to workers that publish KV events: their
//! blocks are keyed by token ids, so a text request matches them only once it is the
//! engine's own tokens. A tokenizer is loaded (off the actor threads) for each model one of
//! whose workers advertises `kv_events`: from `--tokenizer-path` when it names one for the
//! model (`MODEL=PATH`) or for every model, else from the worker's `tokenizer_path` when
//! that is a local path. The HTTP side reads the map.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use actix::prelude::*;
use kvgate_tokenize::ModelTokenizer;
use tracing::{info, warn};

use crate::actors::registry::{Fleet, FleetChanged, Runtime};
use crate::config::TokenizerPaths;

mod render;
pub(crate) use render::{RenderError, ask};

/// One model's tokenizer, as far as it got.
#[derive(Debug, Clone)]
pub(crate) enum Slot {
    Loading(PathBuf),
    Ready(Arc<ModelTokenizer>),
    Failed(String),
    /// No usable path: the reason.
    Missing(NoTokenizer),
    /// No tokenizer here, but the model's engines render prompts themselves (vLLM's
    /// `/v1/chat/completions/render` and `/v1/completions/render`): these ones.
    Render(Arc<[RenderTarget]>),
}

/// An engine asked to render prompts, with the key it expects.
#[derive(Debug, Clone)]
pub(crate) struct RenderTarget {
    pub url: kvgate_core::WorkerUrl,
    pub key: Option<kvgate_core::Secret>,
}

/// Why a model has no tokenizer to load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoTokenizer {
    #[error("the engine's tokenizer_path '{0}' is not a path on this host; give --tokenizer-path")]
    NotLocal(String),
    #[error("the engine names no tokenizer_path; give --tokenizer-path")]
    NotNamed,
    #[error("the engines serve no render route and name no local tokenizer; give --tokenizer-path")]
    NoRender,
}

/// What the HTTP side reads: per model, its slot.
#[derive(Debug)]
pub(crate) struct Tokenizers {
    configured: TokenizerPaths,
    models: RwLock<HashMap<String, Slot>>,
    /// Whether any model has a slot: until one does, requests skip the lock.
    any: AtomicBool,
    /// Engines' render answers by a hash of the prompt (see `facts::tokens`): a prompt
    /// asked again is rendered once.
    renders: Mutex<HashMap<u64, Arc<[u32]>>>,
    /// The actor that renders off the request path.
    later: OnceLock<Recipient<RenderLater>>,
    /// Adapter → base model, from the fleet's model cards.
    bases: RwLock<HashMap<String, String>>,
    /// Renders asked off the request path and not answered yet: a prompt is asked once.
    pending: Mutex<std::collections::HashSet<u64>>,
}

/// Render `body` at `route` on `target` and keep the answer under `key`: the whole of a
/// turn routed on an earlier turn's render.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub(crate) struct RenderLater {
    pub target: RenderTarget,
    pub route: &'static str,
    pub body: bytes::Bytes,
    pub key: u64,
}

/// Render answers kept; past it the cache starts over.
const RENDER_CACHE: usize = 4096;

/// The model's ready vLLM engines, which serve the render routes; `None` for none.
fn renderers(fleet: &Fleet, model: &str) -> Option<Arc<[RenderTarget]>> {
    let targets: Vec<RenderTarget> = fleet
        .iter()
        .filter(|w| {
            w.runtime == Runtime::Vllm && w.healthy() && w.models.iter().any(|m| m == model)
        })
        .map(|w| RenderTarget {
            url: w.url.clone(),
            key: w.api_key.clone(),
        })
        .collect();
    (!targets.is_empty()).then(|| targets.into())
}

impl Tokenizers {
    pub(crate) fn new(configured: TokenizerPaths) -> Tokenizers {
        Tokenizers {
            configured,
            models: RwLock::new(HashMap::new()),
            any: AtomicBool::new(false),
            renders: Mutex::new(HashMap::new()),
            later: OnceLock::new(),
            bases: RwLock::new(HashMap::new()),
            pending: Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// The slot of `model`; a request that names none takes the only model's, when the
    /// fleet's workers with events serve one.
    pub(crate) fn lookup(&self, model: Option<&str>) -> Option<Slot> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let models = self.models.read().unwrap_or_else(PoisonError::into_inner);
        match model {
            // An adapter's prompts are its base model's tokens (read in place: this runs
            // for every text request).
            Some(m) => {
                let bases = self.bases.read().unwrap_or_else(PoisonError::into_inner);
                models.get(bases.get(m).map_or(m, String::as_str)).cloned()
            }
            None if models.len() == 1 => models.values().next().cloned(),
            None => None,
        }
    }

    /// The base model of adapter `m`, as the fleet lists it.
    fn base_of(&self, m: &str) -> Option<String> {
        let bases = self.bases.read().unwrap_or_else(PoisonError::into_inner);
        bases.get(m).cloned()
    }

    /// A model whose engines answered a render with 404 or 405: no render until the fleet
    /// changes.
    pub(crate) fn render_refused(&self, model: Option<&str>) {
        let base = model.and_then(|m| self.base_of(m));
        let mut models = self.models.write().unwrap_or_else(PoisonError::into_inner);
        // As `lookup` resolves it: the model's base, or the only model.
        let key = match (base, model) {
            (Some(b), _) => b,
            (None, Some(m)) => m.to_owned(),
            (None, None) if models.len() == 1 => models.keys().next().cloned().unwrap_or_default(),
            (None, None) => return,
        };
        if matches!(models.get(&key), Some(Slot::Render(_))) {
            models.insert(key, Slot::Missing(NoTokenizer::NoRender));
        }
    }

    /// Every model's slot, for inspection.
    pub(crate) fn all(&self) -> HashMap<String, Slot> {
        self.models
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Starts loading a tokenizer for each model newly served by a worker with events.
    fn sync(self: &Arc<Self>, fleet: &Fleet) {
        let bases: HashMap<String, String> = fleet
            .iter()
            .flat_map(|w| w.adapters.iter().map(|(a, b)| (a.clone(), b.clone())))
            .collect();
        *self.bases.write().unwrap_or_else(PoisonError::into_inner) = bases;
        for w in fleet.iter().filter(|w| w.kv_events.is_some()) {
            // An adapter has no tokenizer of its own: it shares its base model's slot.
            for model in w.models.iter().filter(|m| !w.adapters.contains_key(*m)) {
                let known = self
                    .models
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(model)
                    .is_some_and(|s| !matches!(s, Slot::Missing(_) | Slot::Render(_)));
                if known {
                    continue;
                }
                let slot = match self.path_for(model, w.tokenizer_path.as_deref()) {
                    Ok(path) => {
                        self.load(model.clone(), path.clone());
                        Slot::Loading(path)
                    }
                    Err(reason) => match renderers(fleet, model) {
                        Some(targets) => Slot::Render(targets),
                        None => Slot::Missing(reason),
                    },
                };
                let mut models = self.models.write().unwrap_or_else(PoisonError::into_inner);
                // A load may have finished already; it wins over Loading.
                if !matches!(models.get(model), Some(Slot::Ready(_) | Slot::Failed(_))) {
                    models.insert(model.clone(), slot);
                }
                self.any.store(true, Ordering::Relaxed);
            }
        }
    }

    /// A render answer kept for `key` (a hash of the route and body), if any.
    pub(crate) fn rendered(&self, key: u64) -> Option<Arc<[u32]>> {
        let r = self.renders.lock().unwrap_or_else(PoisonError::into_inner);
        r.get(&key).cloned()
    }

    /// Where renders off the request path are asked (the tokenizer actor).
    pub(crate) fn set_renderer(&self, r: Recipient<RenderLater>) {
        let _ = self.later.set(r);
    }

    /// Asks for a render off the request path; dropped when the actor's mailbox is full.
    pub(crate) fn render_later(&self, job: RenderLater) {
        let Some(r) = self.later.get() else {
            return;
        };
        let key = job.key;
        if !self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key)
        {
            return;
        }
        if r.try_send(job).is_err() {
            self.rendered_later(key);
        }
    }

    /// A render asked off the request path has ended, answered or not.
    fn rendered_later(&self, key: u64) {
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        p.remove(&key);
    }

    /// Keeps a render answer; the cache starts over when full.
    pub(crate) fn keep_rendered(&self, key: u64, ids: Arc<[u32]>) {
        let mut r = self.renders.lock().unwrap_or_else(PoisonError::into_inner);
        if r.len() >= RENDER_CACHE {
            r.clear();
        }
        r.insert(key, ids);
    }

    fn path_for(&self, model: &str, advertised: Option<&str>) -> Result<PathBuf, NoTokenizer> {
        if let Some(p) = self.configured.for_model(model) {
            return Ok(p.to_path_buf());
        }
        match advertised {
            Some(p) if Path::new(p).exists() => Ok(PathBuf::from(p)),
            Some(p) => Err(NoTokenizer::NotLocal(p.to_owned())),
            None => Err(NoTokenizer::NotNamed),
        }
    }

    /// Loads on a thread of its own: a large tokenizer.json takes a while to parse.
    fn load(self: &Arc<Self>, model: String, path: PathBuf) {
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("kvgate-tokenizer".into())
            .spawn(move || {
                let slot = match ModelTokenizer::from_path(&path) {
                    Ok(t) => {
                        info!(model, path = %path.display(), chat_template = t.has_chat_template(), segmented = t.segmented(), "tokenizer loaded");
                        Slot::Ready(Arc::new(t))
                    }
                    Err(e) => {
                        warn!(model, error = %e, "tokenizer not loaded; text requests use the approximate index");
                        Slot::Failed(e.to_string())
                    }
                };
                me.models
                    .write()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(model, slot);
            });
        if let Err(e) = spawned {
            warn!(error = %e, "no thread to load a tokenizer on");
        }
    }
}

/// Keeps [`Tokenizers`] in step with the fleet.
#[derive(Debug)]
pub(crate) struct TokenizerActor {
    pub tokenizers: Arc<Tokenizers>,
}

/// Its mailbox keeps the supervised default depth: it is told `FleetChanged` (`do_send`,
/// which never waits for room) and `RenderLater` (`try_send`: a render a full mailbox
/// drops costs the next turn a render on its request path); each load runs on a thread of
/// its own, each render as a task of its context.
impl Actor for TokenizerActor {
    type Context = Context<Self>;
}

/// Its state is the shared [`Tokenizers`], whose loads run on threads of their own.
impl Supervised for TokenizerActor {
    /// Renders in flight went with the old context: their prompts may be asked again.
    fn restarting(&mut self, _: &mut Context<Self>) {
        let mut p = (self.tokenizers.pending.lock()).unwrap_or_else(PoisonError::into_inner);
        p.clear();
    }
}

impl Handler<RenderLater> for TokenizerActor {
    type Result = ();

    fn handle(&mut self, job: RenderLater, ctx: &mut Context<Self>) {
        let key = job.key;
        let fut = async move { render::ask(&job.target, job.route, &job.body).await };
        ctx.spawn(fut.into_actor(self).map(move |done, act, _| {
            if let Ok(ids) = done {
                act.tokenizers.keep_rendered(key, ids.into());
            }
            act.tokenizers.rendered_later(key);
        }));
    }
}

impl Handler<FleetChanged> for TokenizerActor {
    type Result = ();

    fn handle(&mut self, msg: FleetChanged, _: &mut Context<Self>) {
        self.tokenizers.sync(&msg.0);
    }
}
