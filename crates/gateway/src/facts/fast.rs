//! A fast path for the common body shapes: one pass that validates the JSON and reads the
//! routing fields, with strings (where a long prompt's bytes are) read a vector at a time
//! ([`plain`](super::plain)) instead of serde's byte-wise string scan. It answers only
//! when it is sure: anything unusual (an error, a duplicate field, a struct written as an
//! array, an empty prompt list) returns `None` and serde decides, with its own error
//! messages. So it must never accept a body serde refuses, and must read the same facts
//! from one it accepts (a proptest checks both).
//!
//! It also checks the body's UTF-8 on the way: outside strings it accepts only JSON's ASCII
//! grammar, and each string's runs are checked, so a body it accepts is UTF-8 throughout.
//! It reads at most `MAX_DEPTH` (32) levels of nesting; deeper bodies go to serde after the
//! depth check.

use std::borrow::Cow;

use super::{
    Body, ChatBody, CompletionBody, Content, Endpoint, GenerateBody, Loose, Message, Part, Prompt,
};

/// Not sure: let serde decide.
pub(super) struct Unsure;

type R<T> = Result<T, Unsure>;

/// The top-level fields read so far; assembled into the endpoint's body at the end.
#[derive(Default)]
struct Fields<'a> {
    model: Option<Cow<'a, str>>,
    stream: Option<bool>,
    messages: Option<Vec<Message<'a>>>,
    prompt: Option<Prompt<'a>>,
    text: Option<Prompt<'a>>,
    input_ids: Option<Prompt<'a>>,
    prompt_cache_key: Option<Cow<'a, str>>,
    lora_path: Option<Cow<'a, str>>,
    cache_salt: Option<Cow<'a, str>>,
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    /// Objects and arrays open; deep bodies are left to serde and its recursion limit.
    depth: usize,
    /// The prompt's text is kept; otherwise its strings are only checked (a policy that
    /// reads no prompt), which spares unescaping them.
    keep: bool,
}

/// Deepest nesting the fast path reads.
const MAX_DEPTH: usize = 32;

impl<'a> Scan<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> R<u8> {
        self.ws();
        self.b.get(self.i).copied().ok_or(Unsure)
    }

    fn eat(&mut self, c: u8) -> R<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(Unsure)
        }
    }

    /// A string, the opening quote next; borrowed when it has no escape.
    fn string(&mut self) -> R<Cow<'a, str>> {
        self.eat(b'"')?;
        let (run, end) = self.plain_run()?;
        if self.b[end] == b'"' {
            self.i = end + 1;
            return Ok(Cow::Borrowed(run));
        }
        // Escapes: unescape the rest into an owned string.
        let mut out = String::with_capacity(run.len() + 16);
        out.push_str(run);
        self.i = end;
        loop {
            // At a backslash.
            self.i += 1;
            let c = *self.b.get(self.i).ok_or(Unsure)?;
            self.i += 1;
            match c {
                b'"' => out.push('"'),
                b'\\' => out.push('\\'),
                b'/' => out.push('/'),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'n' => out.push('\n'),
                b'r' => out.push('\r'),
                b't' => out.push('\t'),
                b'u' => out.push(self.code_point()?),
                _ => return Err(Unsure),
            }
            let (run, end) = self.plain_run()?;
            out.push_str(run);
            self.i = end;
            if self.b[end] == b'"' {
                self.i = end + 1;
                return Ok(Cow::Owned(out));
            }
        }
    }

    /// A string checked as [`string`](Self::string) checks it, its text not kept. The
    /// escape letters are listed again rather than shared: an escape function returning the
    /// character cost `string` 7 % on source code (parse bench), even inlined.
    fn skip_string(&mut self) -> R<()> {
        self.eat(b'"')?;
        loop {
            let (_, end) = self.plain_run()?;
            self.i = end + 1;
            if self.b[end] == b'"' {
                return Ok(());
            }
            // After a backslash.
            match *self.b.get(self.i).ok_or(Unsure)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.i += 1,
                b'u' => {
                    self.i += 1;
                    self.code_point()?;
                }
                _ => return Err(Unsure),
            }
        }
    }

    /// A string of the prompt: read when kept, else only checked (and empty).
    fn text(&mut self) -> R<Cow<'a, str>> {
        if self.keep {
            self.string()
        } else {
            self.skip_string().map(|()| Cow::Borrowed(""))
        }
    }

    /// The character of a `\u` escape whose hex digits are next, with the low half of a
    /// surrogate pair.
    fn code_point(&mut self) -> R<char> {
        let hi = self.hex4()?;
        let ch = if (0xD800..0xDC00).contains(&hi) {
            if self.b.get(self.i..self.i + 2) != Some(b"\\u") {
                return Err(Unsure);
            }
            self.i += 2;
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(Unsure);
            }
            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
        } else if (0xDC00..0xE000).contains(&hi) {
            return Err(Unsure);
        } else {
            hi
        };
        char::from_u32(ch).ok_or(Unsure)
    }

    /// From `self.i`, the text up to the next quote or backslash and that quote's or
    /// backslash's index (see [`plain`](super::plain)).
    fn plain_run(&self) -> R<(&'a str, usize)> {
        let b: &'a [u8] = self.b;
        let (run, k) = super::plain::plain_run(&b[self.i..]).ok_or(Unsure)?;
        Ok((run, self.i + k))
    }

    fn hex4(&mut self) -> R<u32> {
        let h = self.b.get(self.i..self.i + 4).ok_or(Unsure)?;
        let mut v = 0u32;
        for &c in h {
            v = v * 16 + char::from(c).to_digit(16).ok_or(Unsure)?;
        }
        self.i += 4;
        Ok(v)
    }

    /// A JSON number, checked against the grammar; returns its text.
    fn number(&mut self) -> R<&'a str> {
        self.ws();
        let start = self.i;
        let digits = |s: &mut Self| {
            let from = s.i;
            while s.b.get(s.i).is_some_and(u8::is_ascii_digit) {
                s.i += 1;
            }
            s.i > from
        };
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(Unsure),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if !digits(self) {
                return Err(Unsure);
            }
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            if !digits(self) {
                return Err(Unsure);
            }
        }
        // Digits, signs, a point and an exponent: ASCII.
        std::str::from_utf8(&self.b[start..self.i]).map_err(|_| Unsure)
    }

    fn literal(&mut self, word: &[u8]) -> R<()> {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(Unsure)
        }
    }

    /// Any value, checked and skipped.
    fn skip(&mut self) -> R<()> {
        match self.peek()? {
            b'"' => self.skip_string(),
            b'{' => self.object(|s, _| s.skip()),
            b'[' => self.array(|s| s.skip()),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            _ => self.number().map(drop),
        }
    }

    fn open(&mut self, c: u8) -> R<()> {
        self.eat(c)?;
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Unsure);
        }
        Ok(())
    }

    /// An object, each member's value read by `field` (which must consume it).
    fn object(&mut self, mut field: impl FnMut(&mut Self, &str) -> R<()>) -> R<()> {
        self.open(b'{')?;
        if self.peek()? != b'}' {
            loop {
                let key = self.string()?;
                self.eat(b':')?;
                field(self, &key)?;
                match self.peek()? {
                    b',' => self.i += 1,
                    b'}' => break,
                    _ => return Err(Unsure),
                }
            }
        }
        self.i += 1;
        self.depth -= 1;
        Ok(())
    }

    fn array(&mut self, mut item: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        self.open(b'[')?;
        if self.peek()? != b']' {
            loop {
                item(self)?;
                match self.peek()? {
                    b',' => self.i += 1,
                    b']' => break,
                    _ => return Err(Unsure),
                }
            }
        }
        self.i += 1;
        self.depth -= 1;
        Ok(())
    }

    fn null(&mut self) -> R<bool> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn opt_string(&mut self) -> R<Option<Cow<'a, str>>> {
        if self.null()? {
            return Ok(None);
        }
        self.string().map(Some)
    }

    fn opt_bool(&mut self) -> R<Option<bool>> {
        match self.peek()? {
            b'n' => self.literal(b"null").map(|()| None),
            b't' => self.literal(b"true").map(|()| Some(true)),
            b'f' => self.literal(b"false").map(|()| Some(false)),
            _ => Err(Unsure),
        }
    }

    fn token(&mut self) -> R<u32> {
        let n = self.number()?;
        // serde reads a u32 only from a plain non-negative integer in range.
        if !n.bytes().all(|c| c.is_ascii_digit()) {
            return Err(Unsure);
        }
        n.parse().map_err(|_| Unsure)
    }

    fn tokens(&mut self) -> R<Vec<u32>> {
        let mut out = Vec::new();
        self.array(|s| {
            out.push(s.token()?);
            Ok(())
        })?;
        Ok(out)
    }

    /// A prompt in one of its four shapes; an empty or mixed list is left to serde.
    fn prompt(&mut self) -> R<Prompt<'a>> {
        match self.peek()? {
            b'"' => return self.text().map(Prompt::Text),
            b'[' => {}
            _ => return Err(Unsure),
        }
        let at = self.i;
        self.i += 1;
        let first = self.peek()?;
        self.i = at;
        let p = match first {
            b'"' => {
                let mut v = Vec::new();
                self.array(|s| {
                    v.push(s.text()?);
                    Ok(())
                })?;
                Prompt::Texts(v)
            }
            b'0'..=b'9' => Prompt::Tokens(self.tokens()?),
            b'[' => {
                let mut v = Vec::new();
                self.array(|s| {
                    v.push(s.tokens()?);
                    Ok(())
                })?;
                Prompt::TokenLists(v)
            }
            _ => return Err(Unsure),
        };
        Ok(p)
    }

    fn message(&mut self) -> R<Message<'a>> {
        if self.peek()? != b'{' {
            return Err(Unsure);
        }
        let (mut role, mut content, mut seen_content) = (None, None, false);
        self.object(|s, key| match key {
            "role" if role.is_none() => {
                role = Some(s.text()?);
                Ok(())
            }
            "content" if !seen_content => {
                seen_content = true;
                content = match s.peek()? {
                    b'n' => s.literal(b"null").map(|()| None)?,
                    b'"' => Some(Content::Text(s.text()?)),
                    b'[' => {
                        let mut parts = Vec::new();
                        s.array(|s| {
                            parts.push(s.part()?);
                            Ok(())
                        })?;
                        Some(Content::Parts(parts))
                    }
                    _ => return Err(Unsure),
                };
                Ok(())
            }
            "role" | "content" => Err(Unsure),
            _ => s.skip(),
        })?;
        Ok(Message {
            role: role.ok_or(Unsure)?,
            content,
        })
    }

    /// One part of a message's content: an object whose `text` (if any) is read.
    fn part(&mut self) -> R<Part<'a>> {
        if self.peek()? != b'{' {
            return Err(Unsure);
        }
        let (mut text, mut seen_text) = (None, false);
        self.object(|s, key| match key {
            "text" if !seen_text => {
                seen_text = true;
                text = if s.null()? { None } else { Some(s.text()?) };
                Ok(())
            }
            "text" => Err(Unsure),
            _ => s.skip(),
        })?;
        Ok(Part { text })
    }
}

/// `body` read as `endpoint`'s body, or `None` when serde should decide. Without `keep`
/// the prompt's strings (roles, contents, prompts) are checked but read as empty.
pub(super) fn scan(body: &[u8], endpoint: Endpoint, keep: bool) -> Option<Body<'_>> {
    use Endpoint::{Chat, Completions, Generate};
    if !matches!(endpoint, Chat | Completions | Generate) {
        return None;
    }
    let mut s = Scan {
        b: body,
        i: 0,
        depth: 0,
        keep,
    };
    let mut f = Fields::default();
    let (mut seen_model, mut seen_stream) = (false, false);
    let (mut seen_text, mut seen_ids, mut seen_cache_key) = (false, false, false);
    let (mut seen_lora, mut seen_salt) = (false, false);
    s.object(|s, key| match (key, endpoint) {
        // Only a string is read; any other shape is serde's (and the engine's) to judge.
        ("lora_path", _) if !seen_lora && s.peek()? == b'"' => {
            seen_lora = true;
            f.lora_path = s.opt_string()?;
            Ok(())
        }
        ("cache_salt", _) if !seen_salt && s.peek()? == b'"' => {
            seen_salt = true;
            f.cache_salt = s.opt_string()?;
            Ok(())
        }
        ("prompt_cache_key", _) if !seen_cache_key => {
            seen_cache_key = true;
            f.prompt_cache_key = s.opt_string()?;
            Ok(())
        }
        ("model", _) if !seen_model => {
            seen_model = true;
            f.model = s.opt_string()?;
            Ok(())
        }
        ("stream", _) if !seen_stream => {
            seen_stream = true;
            f.stream = s.opt_bool()?;
            Ok(())
        }
        ("messages", Chat) if f.messages.is_none() => {
            let mut v = Vec::new();
            s.array(|s| {
                v.push(s.message()?);
                Ok(())
            })?;
            f.messages = Some(v);
            Ok(())
        }
        ("prompt", Completions) if f.prompt.is_none() => {
            f.prompt = Some(s.prompt()?);
            Ok(())
        }
        ("text", Generate) if !seen_text => {
            seen_text = true;
            if !s.null()? {
                f.text = Some(s.prompt()?);
            }
            Ok(())
        }
        ("input_ids", Generate) if !seen_ids => {
            seen_ids = true;
            if !s.null()? {
                f.input_ids = Some(s.prompt()?);
            }
            Ok(())
        }
        ("model" | "stream" | "prompt_cache_key" | "lora_path" | "cache_salt", _)
        | ("messages", Chat)
        | ("prompt", Completions)
        | ("text" | "input_ids", Generate) => Err(Unsure),
        _ => s.skip(),
    })
    .ok()?;
    s.ws();
    if s.i != s.b.len() {
        return None;
    }
    let (model, stream, prompt_cache_key) = (f.model, f.stream, f.prompt_cache_key);
    let (lora_path, cache_salt) = (f.lora_path.map(Loose::Str), f.cache_salt.map(Loose::Str));
    // A required field missing is serde's to report.
    Some(match endpoint {
        Chat => Body::Chat(ChatBody {
            model,
            stream,
            prompt_cache_key,
            lora_path,
            cache_salt,
            messages: f.messages?,
        }),
        Completions => Body::Completion(CompletionBody {
            model,
            stream,
            prompt_cache_key,
            lora_path,
            cache_salt,
            prompt: f.prompt?,
        }),
        Generate => Body::Generate(GenerateBody {
            model,
            stream,
            prompt_cache_key,
            lora_path,
            cache_salt,
            text: f.text,
            input_ids: f.input_ids,
        }),
        _ => return None,
    })
}
