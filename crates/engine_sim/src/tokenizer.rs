//! The simulator's deterministic, prefix-stable stand-in tokenizers and its chat template,
//! public so a benchmark can compute ideal hit rates with the very tokens the engines see.
//!
//! [`Tokenizer::WordPieces`] pre-splits text into pieces (a run of ASCII letters and digits
//! with at most one leading space; every other character a piece of its own) and gives each
//! piece one token, or more for long or "rare" pieces (decided by a hash of the piece), so
//! the token count of a text varies with its content the way a real BPE's does and a
//! gateway's bytes-per-token is only an estimate. Token ids are a hash of the token's bytes.
//! [`Tokenizer::FourBytes`] is one token per 4 bytes, for tests that want exact counts.
//!
//! Both are prefix-stable: texts that share a prefix share their tokens up to the last whole
//! piece before they differ. Generated tokens are common words that encode as exactly one
//! token each, so an answer re-sent as text in a later turn re-tokenizes to the generated ids.
//!
//! ```
//! use kvgate_engine_sim::tokenizer::{encode, render_chat};
//! use kvgate_engine_sim::Tokenizer;
//!
//! let text = render_chat([("user", "hi")]);
//! assert_eq!(text, "<|user|>\nhi\n<|assistant|>\n");
//! assert_eq!(encode(Tokenizer::FourBytes, &text).len(), text.len().div_ceil(4));
//! assert!(!encode(Tokenizer::WordPieces, &text).is_empty());
//! ```

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Token ids are below this.
pub(crate) const VOCAB: u32 = 32_000;

/// How the simulator turns text into tokens (`SimConfig::tokenizer`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum Tokenizer {
    /// Word pieces whose count varies with the text (see the module docs).
    #[default]
    WordPieces,
    /// One token per 4 bytes of UTF-8; the last partial chunk is one token.
    FourBytes,
}

/// Generated words of [`Tokenizer::WordPieces`]: each is one whole piece and one token.
const WORDS: [&str; 24] = [
    " the", " kv", " of", " and", " to", " in", " a", " is", " it", " on", " for", " by", " at",
    " as", " we", " or", " be", " an", " no", " so", " up", " if", " do", " go",
];

/// Generated pieces of [`Tokenizer::FourBytes`]: 4 bytes each, so one token each.
const CHUNKS: [&str; 16] = [
    " the", " kv ", " of ", " and", " to ", " in ", " a  ", " is ", " it ", " on ", " for", " by ",
    " at ", " as ", " we ", " or ",
];

impl Tokenizer {
    /// Tokens of `text`.
    pub fn encode(self, text: &str) -> Vec<u32> {
        match self {
            Tokenizer::WordPieces => {
                let mut out = Vec::with_capacity(text.len() / 3 + 1);
                for piece in pieces(text) {
                    piece_tokens(piece, &mut out);
                }
                out
            }
            Tokenizer::FourBytes => text.as_bytes().chunks(4).map(token_id).collect(),
        }
    }

    /// How many distinct tokens the engine generates.
    pub(crate) fn generated_len(self) -> usize {
        match self {
            Tokenizer::WordPieces => WORDS.len(),
            Tokenizer::FourBytes => CHUNKS.len(),
        }
    }

    /// The `i`-th generated token (modulo [`Self::generated_len`]): its id and its text, which
    /// encodes as exactly that one token.
    pub(crate) fn generated(self, i: usize) -> (u32, &'static str) {
        let text = match self {
            Tokenizer::WordPieces => WORDS[i % WORDS.len()],
            Tokenizer::FourBytes => CHUNKS[i % CHUNKS.len()],
        };
        (token_id(text.as_bytes()), text)
    }
}

/// Tokens of `text` under `kind`.
pub fn encode(kind: Tokenizer, text: &str) -> Vec<u32> {
    kind.encode(text)
}

/// Renders a chat as `<|role|>\ncontent\n` per message, then the assistant's header.
pub fn render_chat<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
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

fn token_id(bytes: &[u8]) -> u32 {
    (xxh3_64(bytes) % u64::from(VOCAB)) as u32
}

/// The pre-split pieces of `text`, in order; they concatenate back to `text`.
fn pieces(text: &str) -> impl Iterator<Item = &[u8]> {
    let bytes = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = i;
        let first = *bytes.get(i)?;
        let word = first.is_ascii_alphanumeric()
            || (first == b' ' && bytes.get(i + 1).is_some_and(u8::is_ascii_alphanumeric));
        if word {
            i += 1;
            while bytes.get(i).is_some_and(u8::is_ascii_alphanumeric) {
                i += 1;
            }
        } else {
            // `i` is always on a character boundary: runs stop at ASCII bytes.
            i += text[i..].chars().next().map_or(1, char::len_utf8);
        }
        Some(&bytes[start..i])
    })
}

/// Appends the tokens of one piece: common words and most short pieces are one token, a
/// quarter of short pieces (by hash) two; longer ones one per 4-byte chunk, a quarter of the
/// chunks split in two.
fn piece_tokens(piece: &[u8], out: &mut Vec<u32>) {
    if WORDS.iter().any(|w| w.as_bytes() == piece) {
        out.push(token_id(piece));
        return;
    }
    let hash = xxh3_64(piece);
    if piece.len() <= 4 {
        push_maybe_split(piece, hash, out);
        return;
    }
    for (k, chunk) in piece.chunks(4).enumerate() {
        push_maybe_split(chunk, xxh3_64_with_seed(chunk, hash ^ k as u64), out);
    }
}

fn push_maybe_split(bytes: &[u8], hash: u64, out: &mut Vec<u32>) {
    if bytes.len() >= 2 && hash.is_multiple_of(4) {
        let (a, b) = bytes.split_at(bytes.len() / 2);
        out.push(token_id(a));
        out.push(token_id(b));
    } else {
        out.push(token_id(bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [Tokenizer; 2] = [Tokenizer::WordPieces, Tokenizer::FourBytes];

    #[test]
    fn pieces_split_words_with_one_leading_space_and_single_other_characters() {
        let got: Vec<&[u8]> = pieces("<|user|>\n  Hi there, é2x").collect();
        let want: Vec<&[u8]> = [
            "<", "|", "user", "|", ">", "\n", " ", " Hi", " there", ",", " ", "é", "2x",
        ]
        .iter()
        .map(|p| p.as_bytes())
        .collect();
        assert_eq!(got, want);
        assert_eq!(pieces("").count(), 0);
    }

    #[test]
    fn counts_vary_with_the_text_not_only_its_length() {
        let enc = |t: &str| Tokenizer::WordPieces.encode(t).len();
        // Same length, different words, different counts.
        let texts = [
            "the quick brown fox jumps over the lazy dog",
            "a small kvgate router balances engine loads",
            "pack my box with five dozen liquor jugs now",
            "routing prefixes onto warm caches saves cpu",
        ];
        assert!(texts.iter().all(|t| t.len() == texts[0].len()));
        let counts: Vec<usize> = texts.iter().map(|t| enc(t)).collect();
        assert!(
            counts.iter().any(|&c| c != counts[0]),
            "all the same: {counts:?}"
        );
        // Lowercase prose is not 4 bytes a token.
        let prose = "the engine keeps a prefix cache and reports its load to the gateway \
                     which sends each request where its prompt is already cached";
        assert_ne!(enc(prose), prose.len().div_ceil(4));
        assert_eq!(
            Tokenizer::FourBytes.encode(prose).len(),
            prose.len().div_ceil(4)
        );
        assert_eq!(Tokenizer::FourBytes.encode("abcde").len(), 2);
        for kind in KINDS {
            assert!(kind.encode("").is_empty());
        }
    }

    #[test]
    fn a_shared_text_prefix_gives_a_shared_token_prefix() {
        let a = "You are a helpful assistant. Question one?";
        let b = "You are a helpful assistant. Another question";
        let shared = "You are a helpful assistant.";
        for kind in KINDS {
            let (ta, tb, ts) = (kind.encode(a), kind.encode(b), kind.encode(shared));
            assert!(ts.len() > 4);
            assert_eq!(ta[..ts.len()], ts[..], "{kind:?}");
            assert_eq!(tb[..ts.len()], ts[..], "{kind:?}");
            assert_ne!(ta, tb);
        }
        // Up to the last whole piece: "assist" is not a prefix piece of "assistant".
        let cut = Tokenizer::WordPieces.encode("You are a helpful assist");
        let full = Tokenizer::WordPieces.encode(a);
        let whole = Tokenizer::WordPieces.encode("You are a helpful");
        assert_eq!(cut[..whole.len()], full[..whole.len()]);
    }

    #[test]
    fn every_generated_token_is_one_token_with_its_own_id() {
        for kind in KINDS {
            let mut ids = Vec::new();
            for i in 0..kind.generated_len() {
                let (id, text) = kind.generated(i);
                assert_eq!(kind.encode(text), vec![id], "{kind:?} {text:?}");
                assert!(id < VOCAB);
                ids.push(id);
            }
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), kind.generated_len(), "{kind:?}: ids collide");
        }
    }

    #[test]
    fn a_prompt_and_its_answer_re_sent_re_tokenize_to_both_ids() {
        // Four-byte chunks shift with the prompt's length, so only word pieces promise this.
        let kind = Tokenizer::WordPieces;
        let prompt = render_chat([("system", "be brief"), ("user", "what is kv?")]);
        let answer: Vec<(u32, &str)> = [3, 0, 7, 7, 12, 1].map(|i| kind.generated(i)).into();
        let answer_text: String = answer.iter().map(|(_, t)| *t).collect();
        let answer_ids: Vec<u32> = answer.iter().map(|(id, _)| *id).collect();
        let mut want = kind.encode(&prompt);
        want.extend(&answer_ids);
        assert_eq!(kind.encode(&format!("{prompt}{answer_text}")), want);
        // The next turn re-sends the answer inside the template, whose "\n" and
        // "<|...|>" separators keep its boundaries: turn 2 starts with turn 1's tokens.
        let next = render_chat([
            ("system", "be brief"),
            ("user", "what is kv?"),
            ("assistant", &answer_text),
            ("user", "more"),
        ]);
        assert_eq!(kind.encode(&next)[..want.len()], want[..]);
    }

    #[test]
    fn chat_template_keeps_roles_and_order() {
        let text = render_chat([("system", "be brief"), ("user", "hi")]);
        assert_eq!(text, "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n");
    }
}
