//! LoRA adapters and cache salts: each (adapter, salt) pair gets its own KV cache, as an
//! engine keeps an adapter's cache apart from its base model's and a salted prompt's apart
//! from everyone else's.
//!
//! The cache is one radix tree; a scope's prompts are kept apart by carrying the scope's
//! number in the top byte of every token id (vocabularies stay far below 2^24), so the
//! same text under two scopes shares no page, and the engine hashes of its pages differ
//! too. What leaves the engine (KV events' `token_ids`) carries the plain ids and names
//! the scope in `lora_name`, `lora_id` and `cache_salt`.

use std::sync::Mutex;

use crate::error::ApiError;

const SHIFT: u32 = 24;
const MASK: u32 = (1 << SHIFT) - 1;
/// Scopes one engine keeps apart (the top byte, 0 being the base model unsalted).
const MAX_SCOPES: usize = 255;

/// An (adapter, salt) pair.
pub(crate) type Scope = (Option<String>, Option<String>);

/// The scopes an engine has seen, numbered from 1 in order of first use.
#[derive(Debug, Default)]
pub(crate) struct Scopes(Mutex<Vec<Scope>>);

impl Scopes {
    /// The number of `(adapter, salt)`: 0 for neither.
    pub(crate) fn id(&self, adapter: Option<&str>, salt: Option<&str>) -> Result<u32, ApiError> {
        if adapter.is_none() && salt.is_none() {
            return Ok(0);
        }
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = all
            .iter()
            .position(|(a, s)| a.as_deref() == adapter && s.as_deref() == salt);
        let at = match at {
            Some(i) => i,
            None if all.len() < MAX_SCOPES => {
                all.push((adapter.map(str::to_owned), salt.map(str::to_owned)));
                all.len() - 1
            }
            None => {
                return Err(ApiError::BadRequest(format!(
                    "the simulator keeps at most {MAX_SCOPES} adapter and salt pairs apart"
                )));
            }
        };
        Ok(at as u32 + 1)
    }

    /// The pair numbered `id`; `None` for 0 or an unknown number.
    pub(crate) fn get(&self, id: u32) -> Option<Scope> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.get((id as usize).checked_sub(1)?).cloned()
    }
}

/// `tokens` moved into scope `id`.
pub(crate) fn enter(tokens: &mut [u32], id: u32) {
    if id != 0 {
        for t in tokens {
            *t = (*t & MASK) | (id << SHIFT);
        }
    }
}

/// The scope a token id was moved into.
pub(crate) fn of(token: u32) -> u32 {
    token >> SHIFT
}

/// A token id as the model's vocabulary has it.
pub(crate) fn plain(token: u32) -> u32 {
    token & MASK
}

#[cfg(test)]
#[test]
fn scopes_are_numbered_apart_and_tokens_keep_their_ids() {
    let s = Scopes::default();
    assert_eq!(s.id(None, None).ok(), Some(0));
    assert_eq!(s.id(Some("sql"), None).ok(), Some(1));
    assert_eq!(s.id(None, Some("t1")).ok(), Some(2));
    assert_eq!(s.id(Some("sql"), None).ok(), Some(1));
    assert_eq!(s.get(2), Some((None, Some("t1".into()))));
    assert_eq!(s.get(0), None);
    let mut t = vec![5, 4095];
    enter(&mut t, 2);
    assert_ne!(t, [5, 4095]);
    assert_eq!(t.iter().map(|&x| of(x)).collect::<Vec<_>>(), [2, 2]);
    assert_eq!(t.iter().map(|&x| plain(x)).collect::<Vec<_>>(), [5, 4095]);
}
