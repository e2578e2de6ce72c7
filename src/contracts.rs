//! The folders' contracts, checked: each folder's `mod.rs` says what it must not reach, and
//! [`MUST_NOT_USE`] lists those as `crate::` paths. The test reads every source file of each
//! folder (code, attributes, doc comments and their links alike) and fails on any path of its
//! folder's list, so the prose stays true as the code changes.

/// Per folder of `src/`, the `crate::` paths it must not use (a path is used when it appears
/// followed by `::` or a non-identifier character, so `crate::app` does not match
/// `crate::apple`). Every folder's `mod.rs` lists the same.
pub const MUST_NOT_USE: &[(&str, &[&str])] = &[
    (
        "core",
        &[
            "crate::admin",
            "crate::app",
            "crate::certs",
            "crate::cli",
            "crate::cluster",
            "crate::explain",
            "crate::offline",
            "crate::watcher",
            "crate::webhook",
        ],
    ),
    (
        "cluster",
        &[
            "crate::admin",
            "crate::app",
            "crate::certs",
            "crate::cli",
            "crate::explain",
            "crate::offline",
            "crate::watcher",
            "crate::webhook",
        ],
    ),
    (
        "admin",
        &[
            "crate::app",
            "crate::certs",
            "crate::cli",
            "crate::cluster",
            "crate::explain",
            "crate::offline",
            "crate::watcher",
            "crate::webhook",
        ],
    ),
    (
        "certs",
        &[
            "crate::app",
            "crate::cli",
            "crate::explain",
            "crate::offline",
            "crate::watcher",
            "crate::webhook",
        ],
    ),
    (
        "webhook",
        &[
            "crate::app",
            "crate::cli",
            "crate::explain",
            "crate::offline",
            "crate::watcher",
        ],
    ),
    (
        "watcher",
        &[
            "crate::app",
            "crate::cli",
            "crate::explain",
            "crate::offline",
            "crate::webhook",
        ],
    ),
    (
        "explain",
        &[
            "crate::app",
            "crate::offline",
            "crate::watcher",
            "crate::webhook",
        ],
    ),
    (
        "offline",
        &[
            "crate::admin",
            "crate::app",
            "crate::certs",
            "crate::cluster",
            "crate::explain",
            "crate::watcher",
            "crate::webhook",
        ],
    ),
];

#[cfg(test)]
mod tests {
    use super::MUST_NOT_USE;
    use std::path::{Path, PathBuf};

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Where `path` is used in `text`: each line that names it as a whole path segment.
    fn uses(text: &str, path: &str) -> Vec<usize> {
        let mut lines = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find(path) {
                let after = rest[at + path.len()..].chars().next();
                if !after.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    lines.push(number + 1);
                    break;
                }
                rest = &rest[at + path.len()..];
            }
        }
        lines
    }

    /// `text` with the paragraph that lists the forbidden paths (in a `mod.rs`) blanked, line
    /// numbers kept.
    fn without_the_list(text: &str) -> String {
        let mut inside = false;
        let mut out = String::with_capacity(text.len());
        for line in text.lines() {
            if line.starts_with("//! As paths, checked by") {
                inside = true;
            } else if inside && (line.trim() == "//!" || !line.starts_with("//!")) {
                inside = false;
            }
            if !inside {
                out.push_str(line);
            }
            out.push('\n');
        }
        out
    }

    #[test]
    fn no_folder_uses_what_its_mod_rs_forbids() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut broken = Vec::new();
        for (folder, forbidden) in MUST_NOT_USE {
            let mut files = Vec::new();
            sources(&src.join(folder), &mut files);
            assert!(!files.is_empty(), "src/{folder} has sources");
            let module = std::fs::read_to_string(src.join(folder).join("mod.rs")).unwrap();
            for path in *forbidden {
                assert!(
                    module.contains(&format!("`{path}`")),
                    "src/{folder}/mod.rs does not list `{path}` among what it must not reach"
                );
                for file in &files {
                    let text = std::fs::read_to_string(file).unwrap();
                    let text = without_the_list(&text);
                    for line in uses(&text, path) {
                        broken.push(format!("{}:{line} uses {path}", file.display()));
                    }
                }
            }
        }
        assert!(broken.is_empty(), "{}", broken.join("\n"));
    }

    #[test]
    fn a_path_is_matched_as_a_whole_segment() {
        assert_eq!(uses("use crate::app::X;\ncrate::apple", "crate::app"), [1]);
        assert_eq!(uses("[`x`](crate::webhook)", "crate::webhook"), [1]);
        assert!(uses("crate::webhooks", "crate::webhook").is_empty());
    }
}
