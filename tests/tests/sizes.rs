//! Size as a signal: a source file in `crates/*/src` over 600 lines says why in its opening
//! comment ("600 lines"), a function over 120 lines says why in the comment above it
//! ("120 lines"). Long is allowed where it reads better; unexplained long is not.

use std::path::{Path, PathBuf};

const FILE_LINES: usize = 600;
const FN_LINES: usize = 120;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A function's opening line: its indentation and name.
fn fn_start(line: &str) -> Option<(usize, &str)> {
    let indent = line.len() - line.trim_start().len();
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some((indent, &name[..end]))
}

/// What one file's text breaks of the two rules, by `name`.
fn size_errors(name: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut errors = Vec::new();
    let opening: String = lines
        .iter()
        .take_while(|l| l.starts_with("//!") || l.starts_with("#!") || l.trim().is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    if lines.len() > FILE_LINES && !opening.contains(&format!("{FILE_LINES} lines")) {
        errors.push(format!(
            "{name}: {} lines, and its opening comment does not say why",
            lines.len()
        ));
    }
    for (i, line) in lines.iter().enumerate() {
        let Some((indent, f)) = fn_start(line) else {
            continue;
        };
        if line.trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let Some(len) = lines[i + 1..].iter().position(|l| *l == close) else {
            continue;
        };
        let len = len + 2;
        if len <= FN_LINES {
            continue;
        }
        let said = lines[..i]
            .iter()
            .rev()
            .take_while(|l| {
                let t = l.trim_start();
                t.starts_with("//") || t.starts_with("#[")
            })
            .any(|l| l.contains(&format!("{FN_LINES} lines")));
        if !said {
            errors.push(format!(
                "{name}:{}: fn {f} is {len} lines, and the comment above it does not say why",
                i + 1
            ));
        }
    }
    errors
}

#[test]
fn long_files_and_functions_say_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut files = Vec::new();
    for c in std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .flatten()
    {
        rust_files(&c.path().join("src"), &mut files);
    }
    assert!(
        files.len() > 100,
        "{} files: the walk missed the tree",
        files.len()
    );
    let mut errors = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a source file");
        let name = f.strip_prefix(root).unwrap_or(f).display().to_string();
        errors.extend(size_errors(&name, &text));
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn the_size_check_sees_a_long_file_and_a_long_function() {
    let body = "    x();\n".repeat(FN_LINES);
    let long_fn = format!("//! Short.\n\nfn long() {{\n{body}}}\n");
    assert_eq!(size_errors("a.rs", &long_fn).len(), 1, "{long_fn}");
    let said =
        format!("//! Short.\n\n// Over {FN_LINES} lines: one table.\nfn long() {{\n{body}}}\n");
    assert!(size_errors("a.rs", &said).is_empty());
    let long_file = format!("//! Short.\n{}", "const A: u8 = 0;\n".repeat(FILE_LINES));
    assert_eq!(size_errors("b.rs", &long_file).len(), 1);
    let said = format!(
        "//! Over {FILE_LINES} lines: a table.\n{}",
        "const A: u8 = 0;\n".repeat(FILE_LINES)
    );
    assert!(size_errors("b.rs", &said).is_empty());
}
