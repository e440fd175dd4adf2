//! What every proxied request sends: a small chat completion, or one whose user message is
//! N KiB of text, the same each time or different on every request.

/// The request every target proxies by default: a small non-streaming chat completion.
pub(super) const BODY: &str = r#"{"model":"kvgate-sim-model","messages":[{"role":"user","content":"Hello!"}],"max_tokens":1}"#;

const HEAD: &str = r#"{"model":"kvgate-sim-model","messages":[{"role":"user","content":""#;
const TAIL: &str = r#""}],"max_tokens":1}"#;
/// Bytes at the start of a unique prompt that tell it apart: a letter and nine digits.
const TAG: usize = 11;

/// The body of each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BodySpec {
    /// The user message's size in KiB; `None` sends [`BODY`].
    pub kib: Option<usize>,
    /// Each request's message starts with its own tag, so every request inserts into the
    /// prefix tree instead of matching the last one.
    pub unique: bool,
}

impl BodySpec {
    /// The same body every time.
    #[cfg(test)]
    pub(crate) fn fixed(kib: Option<usize>) -> Self {
        Self { kib, unique: false }
    }

    fn text(kib: usize) -> String {
        const WORDS: &str = "the quick brown fox jumps over the lazy dog ";
        WORDS.chars().cycle().take(kib * 1024).collect()
    }

    /// The body of request `n` of the sender named by `lane` (one letter): unique bodies of
    /// two senders never coincide.
    pub(crate) fn make(&self, lane: char, n: u64) -> String {
        let Some(kib) = self.kib else {
            return BODY.to_owned();
        };
        let mut text = Self::text(kib);
        if self.unique {
            let tag = format!("{lane}{:09} ", n % 1_000_000_000);
            text.replace_range(..TAG.min(text.len()), &tag[..TAG.min(text.len())]);
        }
        format!("{HEAD}{text}{TAIL}")
    }

    /// A wrk script that POSTs this body: one fixed string, or a Lua `request` function
    /// that puts its own tag in front of each request's text.
    pub(crate) fn wrk_script(&self) -> String {
        match self.kib {
            Some(kib) if self.unique && kib * 1024 >= TAG => {
                let text = Self::text(kib);
                format!(
                    "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n\
                     local head = {}\nlocal tail = {}\nlocal n = 0\n\
                     request = function()\n  n = n + 1\n  \
                     return wrk.format(nil, nil, nil, head .. string.format(\"w%09d \", n % 1000000000) .. tail)\nend\n",
                    kvgate_bench::lua_string(HEAD),
                    kvgate_bench::lua_string(&format!("{}{TAIL}", &text[TAG..])),
                )
            }
            _ => kvgate_bench::post_script(&self.make('w', 0)),
        }
    }

    /// The body's size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.make('x', 0).len()
    }

    /// "91 B", "256 KiB", "256 KiB, unique".
    pub(crate) fn describe(&self) -> String {
        match self.kib {
            None => format!("{} B", BODY.len()),
            Some(k) if self.unique => format!("{k} KiB, unique"),
            Some(k) => format!("{k} KiB"),
        }
    }
}

/// One sender's bodies: the same string every time, or a new unique one each request.
pub(super) struct Sender<'a> {
    spec: &'a BodySpec,
    lane: char,
    n: u64,
    fixed: Option<String>,
}

impl<'a> Sender<'a> {
    pub(super) fn new(spec: &'a BodySpec, lane: char) -> Self {
        let fixed = (!spec.unique).then(|| spec.make(lane, 0));
        Self {
            spec,
            lane,
            n: 0,
            fixed,
        }
    }

    pub(super) fn next(&mut self) -> std::borrow::Cow<'_, str> {
        self.n += 1;
        match &self.fixed {
            Some(b) => b.as_str().into(),
            None => self.spec.make(self.lane, self.n).into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_body_is_unchanged_and_a_sized_one_is_a_chat_completion() {
        assert_eq!(BodySpec::fixed(None).make('r', 7), BODY);
        let body = BodySpec::fixed(Some(256)).make('r', 7);
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        let text = v["messages"][0]["content"].as_str().expect("content");
        assert_eq!(text.len(), 256 * 1024);
        assert_eq!(v["model"], "kvgate-sim-model");
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(
            body,
            BodySpec::fixed(Some(256)).make('w', 8),
            "fixed is fixed"
        );
    }

    #[test]
    fn unique_bodies_differ_at_the_start_and_keep_their_size() {
        let spec = BodySpec {
            kib: Some(4),
            unique: true,
        };
        let (a, b, c) = (spec.make('r', 1), spec.make('r', 2), spec.make('w', 1));
        assert!(a != b && a != c && b != c);
        assert_eq!(a.len(), BodySpec::fixed(Some(4)).len());
        let v: serde_json::Value = serde_json::from_str(&a).expect("json");
        let text = v["messages"][0]["content"].as_str().expect("content");
        assert!(text.starts_with("r000000001 rown fox"), "{}", &text[..20]);
        let script = spec.wrk_script();
        assert!(script.contains("request = function()"), "{script}");
        assert!(script.contains("w%09d "), "{script}");
    }
}
