//! A small parser for the Prometheus text exposition format (version 0.0.4).
//!
//! It keeps what load polling needs: each sample's name, labels, value and optional
//! timestamp. Comment lines (`# HELP`, `# TYPE`, any line starting with `#`) are skipped;
//! a malformed sample line fails the whole body, since a half-read scrape would
//! under-report load.

use crate::error::ParseError;

/// One sample line: `name{label="value",...} value [timestamp_ms]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    /// In the order written, escapes resolved.
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of label `name`, if the sample carries it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses a whole `/metrics` body.
pub fn parse_prometheus(text: &str) -> Result<Vec<Sample>, ParseError> {
    parse_prometheus_where(text, |_| true)
}

/// Parses the sample lines whose metric name `keep` accepts; the others are skipped
/// before anything is stored for them (an engine's scrape is mostly metrics load polling
/// does not read). Every kept line must be well formed.
pub fn parse_prometheus_where(
    text: &str,
    keep: impl Fn(&str) -> bool,
) -> Result<Vec<Sample>, ParseError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim_matches([' ', '\t']);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        if !keep(&line[..name_end]) {
            continue;
        }
        let sample = Cursor { rest: line }
            .sample()
            .map_err(|reason| ParseError::Prometheus {
                line: i + 1,
                reason,
            })?;
        out.push(sample);
    }
    Ok(out)
}

/// The unread part of one line.
struct Cursor<'a> {
    rest: &'a str,
}

type Step<T> = Result<T, &'static str>;

impl<'a> Cursor<'a> {
    fn sample(mut self) -> Step<Sample> {
        let name = self.take_while(|i, c| {
            c == '_' || c == ':' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())
        });
        if name.is_empty() {
            return Err("expected a metric name");
        }
        self.skip_ws();
        let labels = if self.eat('{') {
            self.labels()?
        } else {
            Vec::new()
        };
        self.skip_ws();
        let value = parse_value(self.token()).ok_or("expected a number")?;
        self.skip_ws();
        let timestamp_ms = match self.token() {
            "" => None,
            t => Some(
                t.parse::<i64>()
                    .map_err(|_| "expected an integer timestamp")?,
            ),
        };
        self.skip_ws();
        if !self.rest.is_empty() {
            return Err("unexpected text after the sample");
        }
        Ok(Sample {
            name: name.to_owned(),
            labels,
            value,
            timestamp_ms,
        })
    }

    /// After `{`: `name="value"` pairs separated by commas (a trailing one allowed), then `}`.
    fn labels(&mut self) -> Step<Vec<(String, String)>> {
        let mut labels = Vec::new();
        loop {
            self.skip_ws();
            if self.eat('}') {
                return Ok(labels);
            }
            let name = self.take_while(|i, c| {
                c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())
            });
            if name.is_empty() {
                return Err("expected a label name");
            }
            self.skip_ws();
            if !self.eat('=') {
                return Err("expected '=' after a label name");
            }
            self.skip_ws();
            if !self.eat('"') {
                return Err("expected a quoted label value");
            }
            let value = self.quoted()?;
            labels.push((name.to_owned(), value));
            self.skip_ws();
            if !self.eat(',') && !self.rest.starts_with('}') {
                return Err("expected ',' or '}' after a label");
            }
        }
    }

    /// After the opening quote: the value up to the closing quote, escapes resolved.
    fn quoted(&mut self) -> Step<String> {
        let mut out = String::new();
        let mut chars = self.rest.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = &self.rest[i + 1..];
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, '\\')) => out.push('\\'),
                    Some((_, '"')) => out.push('"'),
                    // Not an escape the format defines: keep it as written.
                    Some((_, other)) => {
                        out.push('\\');
                        out.push(other);
                    }
                    None => break,
                },
                c => out.push(c),
            }
        }
        Err("unterminated label value")
    }

    fn take_while(&mut self, mut ok: impl FnMut(usize, char) -> bool) -> &'a str {
        let end = self
            .rest
            .char_indices()
            .find(|&(i, c)| !ok(i, c))
            .map_or(self.rest.len(), |(i, _)| i);
        let (head, tail) = self.rest.split_at(end);
        self.rest = tail;
        head
    }

    fn token(&mut self) -> &'a str {
        self.take_while(|_, c| c != ' ' && c != '\t')
    }

    fn skip_ws(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t']);
    }

    fn eat(&mut self, c: char) -> bool {
        match self.rest.strip_prefix(c) {
            Some(tail) => {
                self.rest = tail;
                true
            }
            None => false,
        }
    }
}

/// A sample value: a float, `+Inf`, `-Inf` or `NaN`.
fn parse_value(t: &str) -> Option<f64> {
    match t {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        // Rust also reads "inf"/"nan" spellings; harmless leniency.
        t => t.parse::<f64>().ok(),
    }
}

#[cfg(test)]
mod tests;
