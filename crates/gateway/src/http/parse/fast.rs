//! A fast path for the common body shapes: one pass that validates the JSON and reads the
//! routing fields, with `memchr` over strings (where a long prompt's bytes are) instead of
//! serde's byte-wise string scan. It answers only when it is sure: anything unusual (an
//! error, a duplicate field, a struct written as an array, an empty prompt list) returns
//! `None` and serde decides, with its own error messages. So it must never accept a body
//! serde refuses, and must read the same facts from one it accepts (a proptest checks both).
//!
//! The body is already known to be UTF-8 and at most `MAX_JSON_DEPTH` deep.

use std::borrow::Cow;

use super::Prompt;

/// Not sure: let serde decide.
pub(super) struct Unsure;

type R<T> = Result<T, Unsure>;

/// One chat message: its role and the text of its content, in parts.
pub(super) struct FastMessage<'a> {
    pub role: Cow<'a, str>,
    pub content: Vec<Cow<'a, str>>,
}

/// The routing fields of a body.
#[derive(Default)]
pub(super) struct FastBody<'a> {
    pub model: Option<Cow<'a, str>>,
    pub stream: Option<bool>,
    pub messages: Option<Vec<FastMessage<'a>>>,
    pub prompt: Option<Prompt<'a>>,
    pub text: Option<Prompt<'a>>,
    pub input_ids: Option<Prompt<'a>>,
}

/// Which top-level fields the endpoint reads (the others are validated and skipped).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Chat,
    Completion,
    Generate,
}

struct Scan<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    /// Objects and arrays open; deep bodies are left to serde and its recursion limit.
    depth: usize,
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
        let start = self.i;
        let end = self.plain_run()?;
        if self.b[end] == b'"' {
            self.i = end + 1;
            return Ok(Cow::Borrowed(&self.s[start..end]));
        }
        // Escapes: unescape the rest into an owned string.
        let mut out = String::with_capacity(end - start + 16);
        out.push_str(&self.s[start..end]);
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
                b'u' => {
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
                    out.push(char::from_u32(ch).ok_or(Unsure)?);
                }
                _ => return Err(Unsure),
            }
            let start = self.i;
            let end = self.plain_run()?;
            out.push_str(&self.s[start..end]);
            self.i = end;
            if self.b[end] == b'"' {
                self.i = end + 1;
                return Ok(Cow::Owned(out));
            }
        }
    }

    /// From `self.i`, the index of the next quote or backslash; the bytes before it must
    /// hold no control character (JSON forbids them raw in strings).
    fn plain_run(&self) -> R<usize> {
        let rest = &self.b[self.i..];
        let k = memchr::memchr2(b'"', b'\\', rest).ok_or(Unsure)?;
        // Branch-free, so it vectorises: a long prompt is checked at memory speed.
        let controls = rest[..k]
            .iter()
            .fold(0u8, |acc, &b| acc | u8::from(b < 0x20));
        if controls != 0 {
            return Err(Unsure);
        }
        Ok(self.i + k)
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
        Ok(&self.s[start..self.i])
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
            b'"' => self.string().map(drop),
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
            b'"' => return self.string().map(Prompt::Text),
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
                    v.push(s.string()?);
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

    fn message(&mut self) -> R<FastMessage<'a>> {
        if self.peek()? != b'{' {
            return Err(Unsure);
        }
        let (mut role, mut content, mut seen_content) = (None, Vec::new(), false);
        self.object(|s, key| match key {
            "role" if role.is_none() => {
                role = Some(s.string()?);
                Ok(())
            }
            "content" if !seen_content => {
                seen_content = true;
                match s.peek()? {
                    b'n' => s.literal(b"null"),
                    b'"' => {
                        content.push(s.string()?);
                        Ok(())
                    }
                    b'[' => s.array(|s| {
                        if s.peek()? != b'{' {
                            return Err(Unsure);
                        }
                        let mut seen_text = false;
                        s.object(|s, key| match key {
                            "text" if !seen_text => {
                                seen_text = true;
                                if let Some(t) = s.opt_string()? {
                                    content.push(t);
                                }
                                Ok(())
                            }
                            "text" => Err(Unsure),
                            _ => s.skip(),
                        })
                    }),
                    _ => Err(Unsure),
                }
            }
            "role" | "content" => Err(Unsure),
            _ => s.skip(),
        })?;
        Ok(FastMessage {
            role: role.ok_or(Unsure)?,
            content,
        })
    }
}

/// The routing fields of `body` for `shape`, or `None` when serde should decide.
pub(super) fn scan(body: &str, shape: Shape) -> Option<FastBody<'_>> {
    let mut s = Scan {
        s: body,
        b: body.as_bytes(),
        i: 0,
        depth: 0,
    };
    let mut out = FastBody::default();
    let (mut seen_model, mut seen_stream) = (false, false);
    let (mut seen_text, mut seen_ids) = (false, false);
    s.object(|s, key| match (key, shape) {
        ("model", _) if !seen_model => {
            seen_model = true;
            out.model = s.opt_string()?;
            Ok(())
        }
        ("stream", _) if !seen_stream => {
            seen_stream = true;
            out.stream = s.opt_bool()?;
            Ok(())
        }
        ("messages", Shape::Chat) if out.messages.is_none() => {
            let mut v = Vec::new();
            s.array(|s| {
                v.push(s.message()?);
                Ok(())
            })?;
            out.messages = Some(v);
            Ok(())
        }
        ("prompt", Shape::Completion) if out.prompt.is_none() => {
            out.prompt = Some(s.prompt()?);
            Ok(())
        }
        ("text", Shape::Generate) if !seen_text => {
            seen_text = true;
            if !s.null()? {
                out.text = Some(s.prompt()?);
            }
            Ok(())
        }
        ("input_ids", Shape::Generate) if !seen_ids => {
            seen_ids = true;
            if !s.null()? {
                out.input_ids = Some(s.prompt()?);
            }
            Ok(())
        }
        ("model" | "stream", _)
        | ("messages", Shape::Chat)
        | ("prompt", Shape::Completion)
        | ("text" | "input_ids", Shape::Generate) => Err(Unsure),
        _ => s.skip(),
    })
    .ok()?;
    s.ws();
    (s.i == s.b.len()).then_some(out)
}
