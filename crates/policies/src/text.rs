//! A prompt's routing text, kept as runs: long stretches of the request body are borrowed
//! from it rather than copied, so a 1 MiB message costs the gateway no second megabyte.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Borrowed strings shorter than this are copied: a run costs more than a short copy.
const BORROW_MIN: usize = 256;

/// Text in runs, each either a slice of the request body it came in or a part of its own
/// (roles, separators, short strings, strings unescaped). Every run is whole UTF-8, so the text
/// is too. Built with [`push_str`](Self::push_str) and [`push_body_str`](Self::push_body_str);
/// read with [`run`](Self::run) or as one string with [`to_cow`](Self::to_cow).
#[derive(Clone, Default)]
pub struct PromptText {
    body: Bytes,
    own: String,
    /// (offset in the text, in the body or not, start in its source, length); empty while
    /// the text is `own` alone.
    runs: Vec<Run>,
    len: usize,
}

#[derive(Clone, Copy, Debug)]
struct Run {
    at: usize,
    body: bool,
    start: usize,
    len: usize,
}

impl PromptText {
    /// An empty text whose [`push_body_str`](Self::push_body_str) may borrow from `body`.
    pub fn over(body: Bytes) -> Self {
        PromptText {
            body,
            // Room for a few roles and separators without regrowing.
            own: String::with_capacity(64),
            ..PromptText::default()
        }
    }

    /// Bytes in the text.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends a copy of `s`.
    pub fn push_str(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        let start = self.own.len();
        self.own.push_str(s);
        if !self.runs.is_empty() {
            match self.runs.last_mut() {
                Some(r) if !r.body && r.start + r.len == start => r.len += s.len(),
                _ => self.runs.push(Run {
                    at: self.len,
                    body: false,
                    start,
                    len: s.len(),
                }),
            }
        }
        self.len += s.len();
    }

    /// Appends `s`, borrowed when it lies inside the body given to [`over`](Self::over)
    /// and is long enough to be worth a run; copied otherwise.
    pub fn push_body_str(&mut self, s: &str) {
        let base = self.body.as_ptr() as usize;
        let at = (s.as_ptr() as usize).wrapping_sub(base);
        if s.len() < BORROW_MIN || at > self.body.len() || self.body.len() - at < s.len() {
            self.push_str(s);
            return;
        }
        if self.runs.is_empty() && !self.own.is_empty() {
            self.runs.push(Run {
                at: 0,
                body: false,
                start: 0,
                len: self.own.len(),
            });
        }
        self.runs.push(Run {
            at: self.len,
            body: true,
            start: at,
            len: s.len(),
        });
        self.len += s.len();
    }

    /// Lets go of the body when no run borrows from it, so that a text of short strings
    /// does not keep a large request (an image's base64, say) alive while it is routed.
    pub fn seal(mut self) -> Self {
        if !self.runs.iter().any(|r| r.body) {
            self.body = Bytes::new();
        }
        self
    }

    /// The bytes from `pos` to the end of the run holding it; empty at or past the end.
    pub fn run(&self, pos: usize) -> &[u8] {
        if self.runs.is_empty() {
            return self.own.as_bytes().get(pos..).unwrap_or_default();
        }
        let i = self.runs.partition_point(|r| r.at <= pos);
        let Some(r) = i.checked_sub(1).and_then(|i| self.runs.get(i)) else {
            return &[];
        };
        let src = if r.body {
            &self.body[..]
        } else {
            self.own.as_bytes()
        };
        let off = pos - r.at;
        if off >= r.len {
            return &[];
        }
        &src[r.start + off..r.start + r.len]
    }

    /// Each run in order.
    pub fn runs(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut pos = 0;
        std::iter::from_fn(move || {
            let r = self.run(pos);
            pos += r.len();
            (!r.is_empty()).then_some(r)
        })
    }

    /// The text as one string: borrowed when it is one run, joined otherwise.
    pub fn to_cow(&self) -> Cow<'_, str> {
        if self.runs.is_empty() {
            return Cow::Borrowed(&self.own);
        }
        let mut out = Vec::with_capacity(self.len);
        for r in self.runs() {
            out.extend_from_slice(r);
        }
        // Runs are whole UTF-8 strings, so their concatenation is too.
        match String::from_utf8(out) {
            Ok(s) => Cow::Owned(s),
            Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
        }
    }

    /// The longest head of at most `n` bytes that ends on a character boundary.
    pub fn head(&self, n: usize) -> Cow<'_, str> {
        let first = self.run(0);
        let n = n.min(self.len);
        let bytes: Cow<'_, [u8]> = if first.len() >= n {
            Cow::Borrowed(&first[..n])
        } else {
            let mut out = Vec::with_capacity(n);
            for r in self.runs() {
                let take = r.len().min(n - out.len());
                out.extend_from_slice(&r[..take]);
                if out.len() == n {
                    break;
                }
            }
            Cow::Owned(out)
        };
        let valid = match std::str::from_utf8(&bytes) {
            Ok(_) => bytes.len(),
            Err(e) => e.valid_up_to(),
        };
        match bytes {
            Cow::Borrowed(b) => String::from_utf8_lossy(&b[..valid]),
            Cow::Owned(mut v) => {
                v.truncate(valid);
                Cow::Owned(String::from_utf8_lossy(&v).into_owned())
            }
        }
    }

    /// Whether the first `n` bytes of both texts exist and are equal.
    pub fn shares_head(&self, other: &PromptText, n: usize) -> bool {
        if self.len < n || other.len < n {
            return false;
        }
        let mut pos = 0;
        while pos < n {
            let (a, b) = (self.run(pos), other.run(pos));
            let k = a.len().min(b.len()).min(n - pos);
            if k == 0 || a[..k] != b[..k] {
                return false;
            }
            pos += k;
        }
        true
    }
}

impl From<String> for PromptText {
    fn from(own: String) -> Self {
        PromptText {
            len: own.len(),
            own,
            ..PromptText::default()
        }
    }
}

impl From<&str> for PromptText {
    fn from(s: &str) -> Self {
        PromptText::from(s.to_owned())
    }
}

impl PartialEq for PromptText {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.shares_head(other, self.len)
    }
}

impl Eq for PromptText {}

impl PartialEq<str> for PromptText {
    fn eq(&self, other: &str) -> bool {
        self.len == other.len() && self.runs().flatten().eq(other.as_bytes().iter())
    }
}

impl PartialEq<&str> for PromptText {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl fmt::Display for PromptText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for r in self.runs() {
            f.write_str(&String::from_utf8_lossy(r))?;
        }
        Ok(())
    }
}

impl fmt::Debug for PromptText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.to_cow(), f)
    }
}

impl Serialize for PromptText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_cow())
    }
}

impl<'de> Deserialize<'de> for PromptText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(PromptText::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body_str(body: &Bytes, from: usize, to: usize) -> &str {
        std::str::from_utf8(&body[from..to]).unwrap()
    }

    #[test]
    fn long_body_strings_are_borrowed_short_ones_and_strangers_copied() {
        let long = "é".repeat(200); // 400 bytes
        let body = Bytes::from(format!("{{\"c\":\"{long}\",\"d\":\"short\"}}"));
        let mut t = PromptText::over(body.clone());
        t.push_str("<|user|>\n");
        t.push_body_str(body_str(&body, 6, 406));
        t.push_str("\n");
        let short = 6 + 400 + 7;
        t.push_body_str(body_str(&body, short, short + 5)); // "short": copied
        t.push_body_str(
            "not in the body, and long enough to borrow were it in it "
                .repeat(9)
                .as_str(),
        );
        let want = format!(
            "<|user|>\n{long}\nshort{}",
            "not in the body, and long enough to borrow were it in it ".repeat(9)
        );
        assert_eq!(t, *want);
        assert_eq!(t.len(), want.len());
        assert_eq!(t.to_cow(), want);
        let runs: Vec<usize> = t.runs().map(<[u8]>::len).collect();
        assert_eq!(runs, vec![9, 400, 6 + 57 * 9], "own, borrowed, own");
        // A borrowed run points into the body: no copy of it was made.
        assert_eq!(t.run(9).as_ptr(), body[6..].as_ptr());
        assert_eq!(t.run(9 + 399), "é".as_bytes()[1..].as_ref());
        assert!(t.run(want.len()).is_empty());
        // Heads end on a character boundary, across runs too.
        assert_eq!(t.head(12), "<|user|>\né");
        assert_eq!(t.head(10), "<|user|>\n");
        assert_eq!(t.head(usize::MAX), want);
        assert_eq!(t.to_string(), want);
        assert_eq!(format!("{t:?}"), format!("{want:?}"));
    }

    #[test]
    fn a_sealed_text_keeps_the_body_only_while_a_run_borrows_from_it() {
        let body = Bytes::from(format!("{{\"a\":\"short\",\"b\":\"{}\"}}", "y".repeat(300)));
        let mut short = PromptText::over(body.clone());
        short.push_body_str(body_str(&body, 6, 11));
        let short = short.seal();
        let mut long = PromptText::over(body.clone());
        long.push_body_str(body_str(&body, 18, 318));
        let long = long.seal();
        assert_eq!(short, "short");
        assert_eq!(long.len(), 300);
        drop(long);
        assert!(body.is_unique(), "neither text holds the body now");
        let mut long = PromptText::over(body.clone());
        long.push_body_str(body_str(&body, 18, 318));
        let _long = long.seal();
        assert!(!body.is_unique(), "a borrowing text keeps it");
    }

    #[test]
    fn equal_texts_compare_equal_however_they_are_cut() {
        let text = "x".repeat(1000);
        let body = Bytes::from(text.clone());
        let mut cut = PromptText::over(body.clone());
        cut.push_body_str(body_str(&body, 0, 300));
        cut.push_body_str(body_str(&body, 300, 1000));
        let whole = PromptText::from(text.clone());
        assert_eq!(cut, whole);
        assert!(cut.shares_head(&whole, 1000));
        assert!(!cut.shares_head(&whole, 1001));
        let mut other = text.clone();
        other.replace_range(500..501, "y");
        let other = PromptText::from(other);
        assert_ne!(cut, other);
        assert!(cut.shares_head(&other, 500));
        assert!(!cut.shares_head(&other, 501));
        let json = serde_json::to_string(&cut).unwrap();
        assert_eq!(json, format!("\"{text}\""));
        let back: PromptText = serde_json::from_str(&json).unwrap();
        assert_eq!(back, cut);
    }
}
