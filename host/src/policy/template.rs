//! `edgeroute policy new NAME --lang rust|c|python|js|zig`: a ready-to-build policy
//! project (sources, build script, the WIT, a case file, a README), from
//! the templates in `templates/`, built into the binary so it works from
//! any folder. The test suite builds every template and runs `policy
//! check` and `policy test` on it.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    Rust,
    C,
    Python,
    Js,
    Zig,
}

const WIT: &str = include_str!("../../../wit/routing-0.2/policy.wit");

/// (path in the project, contents); `{{name}}` and `{{crate}}` are filled in.
fn files(lang: Lang) -> &'static [(&'static str, &'static str)] {
    match lang {
        Lang::Rust => &[
            (
                "Cargo.toml",
                include_str!("../../../templates/rust/Cargo.toml"),
            ),
            (
                "src/lib.rs",
                include_str!("../../../templates/rust/src/lib.rs"),
            ),
            ("build.sh", include_str!("../../../templates/rust/build.sh")),
            (
                "cases.jsonl",
                include_str!("../../../templates/rust/cases.jsonl"),
            ),
            (
                "README.md",
                include_str!("../../../templates/rust/README.md"),
            ),
        ],
        Lang::C => &[
            ("policy.c", include_str!("../../../templates/c/policy.c")),
            ("build.sh", include_str!("../../../templates/c/build.sh")),
            (
                "cases.jsonl",
                include_str!("../../../templates/c/cases.jsonl"),
            ),
            ("README.md", include_str!("../../../templates/c/README.md")),
        ],
        Lang::Python => &[
            ("app.py", include_str!("../../../templates/python/app.py")),
            (
                "build.sh",
                include_str!("../../../templates/python/build.sh"),
            ),
            (
                "cases.jsonl",
                include_str!("../../../templates/python/cases.jsonl"),
            ),
            (
                "README.md",
                include_str!("../../../templates/python/README.md"),
            ),
        ],
        Lang::Js => &[
            ("policy.js", include_str!("../../../templates/js/policy.js")),
            (
                "package.json",
                include_str!("../../../templates/js/package.json"),
            ),
            (
                "package-lock.json",
                include_str!("../../../templates/js/package-lock.json"),
            ),
            ("build.sh", include_str!("../../../templates/js/build.sh")),
            (
                "cases.jsonl",
                include_str!("../../../templates/js/cases.jsonl"),
            ),
            ("README.md", include_str!("../../../templates/js/README.md")),
        ],
        Lang::Zig => &[
            (
                "policy.zig",
                include_str!("../../../templates/zig/policy.zig"),
            ),
            ("build.sh", include_str!("../../../templates/zig/build.sh")),
            (
                "cases.jsonl",
                include_str!("../../../templates/zig/cases.jsonl"),
            ),
            (
                "README.md",
                include_str!("../../../templates/zig/README.md"),
            ),
        ],
    }
}

/// Write the project `name` under `parent`; returns its folder.
pub fn create(name: &str, lang: Lang, parent: &Path) -> anyhow::Result<PathBuf> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!(
            "'{name}' is not a usable policy name: use lower-case letters, digits, '-' and '_', starting with a letter"
        );
    }
    let dir = parent.join(name);
    if dir.exists() {
        bail!(
            "{} already exists; choose another name or folder",
            dir.display()
        );
    }
    let crate_name = name.replace('-', "_");
    let mut written = vec![("wit/policy.wit", WIT.to_string())];
    for (path, text) in files(lang) {
        let text = text
            .replace("{{name}}", name)
            .replace("{{crate}}", &crate_name);
        written.push((path, text));
    }
    for (path, text) in written {
        let file = dir.join(path);
        if let Some(folder) = file.parent() {
            std::fs::create_dir_all(folder)
                .with_context(|| format!("cannot create {}", folder.display()))?;
        }
        std::fs::write(&file, text).with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_every_file_and_refuses_bad_names_and_existing_folders() {
        let parent = std::env::temp_dir().join(format!("edgeroute-new-{}", std::process::id()));
        std::fs::remove_dir_all(&parent).ok();
        let dir = create("my-policy", Lang::Rust, &parent).unwrap();
        let cargo = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(cargo.contains("name = \"my-policy\""), "{cargo}");
        let build = std::fs::read_to_string(dir.join("build.sh")).unwrap();
        assert!(build.contains("release/my_policy.wasm"), "{build}");
        assert!(dir.join("wit/policy.wit").is_file() && dir.join("cases.jsonl").is_file());
        assert!(create("my-policy", Lang::C, &parent).is_err(), "exists");
        for bad in ["", "My", "1st", "a/b", "a b"] {
            assert!(create(bad, Lang::C, &parent).is_err(), "{bad:?}");
        }
        std::fs::remove_dir_all(&parent).ok();
    }
}
