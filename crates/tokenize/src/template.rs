//! The chat template, rendered as Hugging Face transformers renders it: Jinja with
//! `trim_blocks` and `lstrip_blocks`, loop controls, Python's string methods,
//! `raise_exception`, and a `tojson` that writes what Python's `json.dumps` writes.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::TokenizeError;

const NAME: &str = "chat";

/// A compiled chat template with the special-token strings it may refer to.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, … from `tokenizer_config.json`.
    tokens: Vec<(String, String)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    pub(crate) fn new(
        source: String,
        tokens: Vec<(String, String)>,
    ) -> Result<ChatTemplate, TokenizeError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        Ok(ChatTemplate { env, tokens })
    }

    /// Renders `messages` (with `tools` and the request's `chat_template_kwargs`, when
    /// given) with `add_generation_prompt` as the request says (an engine's default for a
    /// chat completion is true).
    pub(crate) fn render(
        &self,
        messages: Value,
        tools: Option<Value>,
        kwargs: Option<Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizeError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        let mut ctx: BTreeMap<String, Value> = self
            .tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        // The request's own kwargs first, so the fixed names below win over them.
        if let Some(kw) = kwargs.filter(|k| k.kind() == ValueKind::Map)
            && let Ok(keys) = kw.try_iter()
        {
            for k in keys {
                if let (Some(name), Ok(v)) = (k.as_str(), kw.get_item(&k)) {
                    ctx.insert(name.to_owned(), v);
                }
            }
        }
        ctx.insert("messages".into(), messages);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        if let Some(t) = tools.filter(|t| !t.is_none() && !t.is_undefined()) {
            ctx.insert("tools".into(), t);
        }
        let ctx = Value::from(ctx);
        tmpl.render(ctx)
            .map_err(|e| TokenizeError::Render(render_error(&e)))
    }
}

/// The error with its causes, on one line.
fn render_error(e: &Error) -> String {
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let _ = write!(s, ": {c}");
        cause = c.source();
    }
    s
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `strftime_now(format)`: the current UTC time (Llama 3.x templates print
/// today's date with it). The common directives; any other is kept as written.
fn strftime_now(format: String) -> String {
    let secs = kvgate_core::clock::unix_now() as u64;
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];

/// `format` at `secs` since the Unix epoch, UTC.
fn strftime(format: &str, secs: u64) -> String {
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let month_name = MONTHS[(month - 1) as usize];
    let weekday = DAYS[(days % 7) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => {
                let _ = write!(out, "{year}");
            }
            Some('y') => {
                let _ = write!(out, "{:02}", year.rem_euclid(100));
            }
            Some('m') => {
                let _ = write!(out, "{month:02}");
            }
            Some('d') => {
                let _ = write!(out, "{day:02}");
            }
            Some('e') => {
                let _ = write!(out, "{day:>2}");
            }
            Some('j') => {
                let _ = write!(out, "{yday:03}");
            }
            Some('H') => {
                let _ = write!(out, "{h:02}");
            }
            Some('M') => {
                let _ = write!(out, "{m:02}");
            }
            Some('S') => {
                let _ = write!(out, "{s:02}");
            }
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`. Templates print tool schemas with it, and
/// the engine's tokens follow its exact spacing.
fn tojson(v: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(i) if i.is_none() => None,
        Some(i) => match i.as_i64() {
            Some(n) => Some(" ".repeat(n.max(0) as usize)),
            None => Some(i.to_string()),
        },
    };
    let (item, key) = match separators {
        Some(s) if !s.is_none() => {
            let part = |n: usize| -> Result<String, Error> {
                let p = s.get_item(&Value::from(n))?;
                p.as_str().map(str::to_owned).ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "separators must be two strings",
                    )
                })
            };
            (part(0)?, part(1)?)
        }
        // Python's defaults: no trailing space after a comma when indenting.
        _ if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        _ => (", ".to_owned(), ": ".to_owned()),
    };
    let style = Style {
        indent,
        item,
        key,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    style.write(&mut out, v, 0)?;
    Ok(Value::from_safe_string(out))
}

struct Style {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
}

impl Style {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(i) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(i);
            }
        }
    }

    fn write(&self, out: &mut String, v: &Value, depth: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, v),
            ValueKind::String | ValueKind::Bytes => write_str(out, v.as_str().unwrap_or("")),
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Plain => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.container(out, '[', ']', items.len(), depth, |out, n, depth| {
                    self.write(out, &items[n], depth)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort_by_key(|k| k.to_string());
                }
                self.container(out, '{', '}', keys.len(), depth, |out, n, depth| {
                    let k = &keys[n];
                    match k.as_str() {
                        Some(s) => write_str(out, s),
                        None => write_str(out, &k.to_string()),
                    }
                    out.push_str(&self.key);
                    self.write(out, &v.get_item(k)?, depth)
                })?;
            }
            _ => write_str(out, &v.to_string()),
        }
        Ok(())
    }

    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        mut each: impl FnMut(&mut String, usize, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for n in 0..len {
            if n > 0 {
                out.push_str(&self.item);
            }
            self.newline(out, depth + 1);
            each(out, n, depth + 1)?;
        }
        self.newline(out, depth);
        out.push(close);
        Ok(())
    }
}

fn write_number(out: &mut String, v: &Value) {
    if v.is_integer() {
        let _ = write!(out, "{v}");
        return;
    }
    let Ok(f) = f64::try_from(v.clone()) else {
        let _ = write!(out, "{v}");
        return;
    };
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f == f.trunc() && f.abs() < 1e16 {
        // Python's repr of an integral float keeps its ".0".
        let _ = write!(out, "{f:.1}");
    } else {
        let _ = write!(out, "{f}");
    }
}

/// A JSON string as Python writes it with `ensure_ascii=False`.
fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, messages: &str) -> Result<String, TokenizeError> {
        let t = ChatTemplate::new(src.to_owned(), vec![("bos_token".into(), "<s>".into())])?;
        let m: Value =
            serde_json::from_str(messages).map_err(|e| TokenizeError::Body(e.to_string()))?;
        t.render(m, None, None, true)
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() -> Result<(), TokenizeError> {
        // Each expected string is Python 3.11's json.dumps(x, ensure_ascii=False, ...).
        let m = r#"[{"b": 1, "a": [1.0, 2.5, "é\n\"q\"", null, true], "c": {}}]"#;
        assert_eq!(
            render("{{ messages[0] | tojson }}", m)?,
            r#"{"b": 1, "a": [1.0, 2.5, "é\n\"q\"", null, true], "c": {}}"#
        );
        assert_eq!(
            render("{{ messages[0] | tojson(indent=2) }}", m)?,
            "{\n  \"b\": 1,\n  \"a\": [\n    1.0,\n    2.5,\n    \"é\\n\\\"q\\\"\",\n    null,\n    true\n  ],\n  \"c\": {}\n}"
        );
        assert_eq!(
            render("{{ messages[0] | tojson(sort_keys=true) }}", m)?,
            r#"{"a": [1.0, 2.5, "é\n\"q\"", null, true], "b": 1, "c": {}}"#
        );
        assert_eq!(
            render("{{ messages[0] | tojson(separators=[',', ':']) }}", m)?,
            r#"{"b":1,"a":[1.0,2.5,"é\n\"q\"",null,true],"c":{}}"#
        );
        Ok(())
    }

    #[test]
    fn strftime_writes_dates_as_python_does() {
        // Python: time.strftime(f, time.gmtime(t)) for each.
        let t = 1_796_428_800; // 2026-12-05 00:00:00 UTC, a Saturday
        assert_eq!(strftime("%d %b %Y", t), "05 Dec 2026");
        assert_eq!(
            strftime("%A %B %e, %y (%j) %H:%M:%S %%", t + 3723),
            "Saturday December  5, 26 (339) 01:02:03 %"
        );
        assert_eq!(strftime("%Y-%m-%d %a", 951_782_400), "2000-02-29 Tue");
        assert_eq!(strftime("%Y-%m-%d %a %j", 0), "1970-01-01 Thu 001");
        assert_eq!(strftime("%q", 0), "%q");
    }

    #[test]
    fn raise_exception_fails_the_render_with_its_message() {
        let e = render("{{ raise_exception('no system role here') }}", "[]");
        match e {
            Err(TokenizeError::Render(m)) => assert!(m.contains("no system role here"), "{m}"),
            other => panic!("expected a render error, got {other:?}"),
        }
    }

    #[test]
    fn python_string_methods_and_trimmed_blocks_render_as_in_jinja2() -> Result<(), TokenizeError> {
        let src = "{% for m in messages %}\n  {% if m.content.startswith('x') %}{{ m.content.strip() | upper }}{% endif %}\n{% endfor %}";
        assert_eq!(
            render(src, r#"[{"content": "x y "}, {"content": "z"}]"#)?,
            "X Y"
        );
        Ok(())
    }
}
