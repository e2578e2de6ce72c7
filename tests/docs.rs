//! The documentation, checked: every relative link of every Markdown file of the repository
//! names a file that exists and an anchor its headings make, and every test it cites as
//! `path.rs::name` exists in that file.

use std::path::{Path, PathBuf};

/// The Markdown files of the repository: those git tracks, or (without git) those found
/// outside `target/` and hidden folders.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let tracked = std::process::Command::new("git")
        .args(["ls-files", "-z", "*.md"])
        .current_dir(root)
        .output();
    if let Ok(out) = tracked
        && out.status.success()
        && !out.stdout.is_empty()
    {
        return out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| root.join(String::from_utf8_lossy(p).as_ref()))
            .filter(|p| p.exists())
            .collect();
    }
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    walk(&path, out);
                }
            } else if name.ends_with(".md") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, &mut out);
    out
}

/// A heading's anchor as GitHub makes it: lower case, punctuation but `-` and `_` dropped,
/// spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings (outside code blocks), repeats numbered.
fn anchors(text: &str) -> std::collections::HashSet<String> {
    let mut seen: std::collections::HashMap<String, usize> = Default::default();
    let mut out = std::collections::HashSet::new();
    let mut code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            code = !code;
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if code || hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The relative link targets of a Markdown text, outside code blocks and code spans.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut code = false;
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            code = !code;
            continue;
        }
        if code {
            continue;
        }
        // Drop code spans, whose brackets are not links.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://")
                && !target.starts_with("mailto:")
                && !target.contains(' ')
                && !target.is_empty()
            {
                out.push((number + 1, target.to_owned()));
            }
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_documentation_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = markdown_files(root);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")),
        "the Markdown files are found"
    );
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, target) in links(&text) {
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let shown = format!(
                "{}:{line}: {target}",
                file.strip_prefix(root).unwrap_or(file).display()
            );
            if !resolved.exists() {
                broken.push(format!("{shown} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor
                && resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&std::fs::read_to_string(&resolved).unwrap()).contains(anchor)
            {
                broken.push(format!("{shown} (no such heading)"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    let text = "# A `b` c\n## What? Yes!\n```\n# not a heading\n```\n## What? Yes!\n";
    let found = anchors(text);
    assert!(found.contains("a-b-c") && found.contains("what-yes") && found.contains("what-yes-1"));
    assert!(!found.contains("not-a-heading"));
    assert_eq!(
        links("see [x](a.md#b) and `[y](c.md)`"),
        [(1, "a.md#b".to_owned())]
    );
}

/// The tests a text cites, as `path/file.rs::name` or `path/file.rs::module::name` in code
/// spans: (line, file, test name).
fn cited_tests(text: &str) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (number, line) in text.lines().enumerate() {
        for span in line.split('`').skip(1).step_by(2) {
            let Some((file, path)) = span.split_once(".rs::") else {
                continue;
            };
            let top = ["tests/", "crates/", "src/", "benches/", "examples/"];
            if !top.iter().any(|t| file.starts_with(t)) || file.contains(' ') {
                continue;
            }
            let name = path.rsplit("::").next().unwrap_or(path);
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                out.push((number + 1, format!("{file}.rs"), name.to_owned()));
            }
        }
    }
    out
}

#[test]
fn every_test_the_documentation_cites_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cited = 0;
    let mut broken = Vec::new();
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, source, name) in cited_tests(&text) {
            cited += 1;
            let shown = format!(
                "{}:{line}: `{source}::{name}`",
                file.strip_prefix(root).unwrap_or(&file).display()
            );
            match std::fs::read_to_string(root.join(&source)) {
                Err(_) => broken.push(format!("{shown} (no such file)")),
                Ok(code) if !code.contains(&format!("fn {name}(")) => {
                    broken.push(format!("{shown} (no such test there)"))
                }
                Ok(_) => {}
            }
        }
    }
    assert!(cited > 0, "the documentation cites tests");
    assert!(
        broken.is_empty(),
        "cited tests not found:\n{}",
        broken.join("\n")
    );
}

#[test]
fn citations_are_read_from_code_spans() {
    assert_eq!(
        cited_tests(
            "see `tests/core/rules.rs::a_b` and `crates/x/src/y.rs::tests::c_d`, not tests/z.rs::e"
        ),
        [
            (1, "tests/core/rules.rs".to_owned(), "a_b".to_owned()),
            (1, "crates/x/src/y.rs".to_owned(), "c_d".to_owned())
        ]
    );
}
