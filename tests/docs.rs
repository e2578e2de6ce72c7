//! The documentation's links, checked: every relative link of every Markdown file of the
//! repository names a file that exists, and an anchor its headings make.

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
