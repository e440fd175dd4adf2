//! A deterministic, prefix-stable stand-in tokenizer and chat template.
//!
//! One token per 4 bytes of UTF-8, so prompts sharing a text prefix share a token prefix,
//! which is all the prefix cache and a cache-aware router need from a tokenizer.

use xxhash_rust::xxh3::xxh3_64;

pub(crate) const VOCAB: u32 = 32_000;
const BYTES_PER_TOKEN: usize = 4;

/// Tokens of `text`; the last partial chunk is one token.
pub(crate) fn encode(text: &str) -> Vec<u32> {
    text.as_bytes()
        .chunks(BYTES_PER_TOKEN)
        .map(|chunk| (xxh3_64(chunk) % u64::from(VOCAB)) as u32)
        .collect()
}

/// Renders a chat as `<|role|>\ncontent\n` per message, then the assistant's header.
pub(crate) fn render_chat<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (role, content) in messages {
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        out.push_str(content);
        out.push('\n');
    }
    out.push_str("<|assistant|>\n");
    out
}

/// Text of a generated token. Each piece is 4 bytes, so a reply fed back in a later turn
/// tokenizes to as many tokens as it was generated with.
pub(crate) fn piece(id: u32) -> &'static str {
    const PIECES: [&str; 16] = [
        " the", " kv ", " of ", " and", " to ", " in ", " a  ", " is ", " it ", " on ", " for",
        " by ", " at ", " as ", " we ", " or ",
    ];
    PIECES[id as usize % PIECES.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_text_prefix_gives_shared_token_prefix() {
        let a = encode("You are a helpful assistant. Question one?");
        let b = encode("You are a helpful assistant. Another question");
        assert_eq!(a.len(), 11);
        assert_eq!(a[..7], b[..7]);
        assert_ne!(a, b);
        assert_eq!(encode("abcde").len(), 2);
        assert!(encode("").is_empty());
    }

    #[test]
    fn chat_template_keeps_roles_and_order() {
        let text = render_chat([("system", "be brief"), ("user", "hi")]);
        assert_eq!(text, "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n");
    }

    #[test]
    fn pieces_round_trip_to_one_token_each() {
        for id in 0..16 {
            assert_eq!(encode(piece(id)).len(), 1);
        }
    }
}
