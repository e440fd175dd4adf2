//! A key or password: never printed, never serialized back, compared in constant time.

use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

/// A key or password. `Debug` and `Serialize` print `<redacted>`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this key; the time taken depends on the lengths only, not
    /// on where the bytes differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        self.0.as_bytes().ct_eq(presented).into()
    }

    /// Whether the key can travel in a header as it is: visible ASCII, no spaces or
    /// controls.
    pub fn is_usable(&self) -> bool {
        !self.0.is_empty() && self.0.bytes().all(|b| b.is_ascii_graphic())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::Secret;

    #[test]
    fn matches_only_the_whole_key_and_never_prints_it() {
        let k = Secret::new("abc");
        assert!(k.matches(b"abc"));
        for other in [&b"ab"[..], b"abcd", b"abd", b""] {
            assert!(!k.matches(other), "{other:?}");
        }
        assert_eq!(
            serde_json::to_string(&k).expect("serializes"),
            "\"<redacted>\""
        );
        assert!(k.is_usable());
        assert!(!Secret::new("a b").is_usable());
        assert!(!Secret::new("").is_usable());
    }
}
