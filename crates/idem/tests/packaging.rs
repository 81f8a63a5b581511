//! Every crate that is not `publish = false` can go to crates.io as it
//! stands: the metadata crates.io shows (description, license, readme,
//! keywords, categories), the license files inside the crate directory
//! (cargo packages nothing from outside it), no placeholder URL, and a
//! version on every dependency on another workspace crate (cargo refuses to
//! package a path dependency without one, except a dev-dependency, which it
//! drops). It reads the manifests only; `cargo package` itself is too slow
//! for the test suite (docs/decisions.md, *Crate names and packaging*).
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

/// The crates.io category slugs the crates may use: a subset of
/// <https://crates.io/category_slugs>. crates.io ignores an unknown slug
/// with only a warning, so a typo would go unnoticed without this.
const CATEGORY_SLUGS: &[&str] = &[
    "asynchronous",
    "caching",
    "command-line-utilities",
    "database",
    "database-implementations",
    "development-tools::testing",
    "network-programming",
    "web-programming",
    "web-programming::http-client",
    "web-programming::http-server",
];

/// The license files each packaged crate carries; the workspace's
/// `license` names both.
const LICENSE_FILES: [&str; 2] = ["LICENSE-MIT", "LICENSE-APACHE"];

/// The dependency tables of a manifest that can name a workspace crate.
const DEPENDENCY_TABLES: [&str; 3] = ["dependencies", "dev-dependencies", "build-dependencies"];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse(path: &Path) -> Table {
    toml::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The table at `path` (one key per level) in `table`, if there is one.
fn table<'a>(table: &'a Table, path: &[&str]) -> Option<&'a Table> {
    let mut at = table;
    for key in path {
        at = at.get(*key)?.as_table()?;
    }
    Some(at)
}

/// One workspace member, as its manifest declares it.
struct Member {
    dir: PathBuf,
    manifest: Table,
    text: String,
}

impl Member {
    fn package(&self) -> &Table {
        table(&self.manifest, &["package"]).unwrap()
    }

    fn name(&self) -> &str {
        self.package()["name"].as_str().unwrap()
    }

    fn publishable(&self) -> bool {
        self.package().get("publish") != Some(&Value::Boolean(false))
    }

    /// A `[package]` field, with `field.workspace = true` read from
    /// `[workspace.package]`.
    fn field<'a>(&'a self, workspace: &'a Table, field: &str) -> Option<&'a Value> {
        let value = self.package().get(field)?;
        match value.as_table().and_then(|t| t.get("workspace")) {
            Some(Value::Boolean(true)) => table(workspace, &["workspace", "package"])?.get(field),
            _ => Some(value),
        }
    }
}

struct Workspace {
    root: Table,
    root_text: String,
    members: BTreeMap<String, Member>,
}

impl Workspace {
    fn load() -> Workspace {
        let root_dir = workspace_root();
        let root_path = root_dir.join("Cargo.toml");
        let mut members = BTreeMap::new();
        for entry in std::fs::read_dir(root_dir.join("crates")).unwrap() {
            let dir = entry.unwrap().path();
            let path = dir.join("Cargo.toml");
            if !path.is_file() {
                continue;
            }
            let member = Member {
                manifest: parse(&path),
                text: read(&path),
                dir,
            };
            members.insert(member.name().to_owned(), member);
        }
        Workspace {
            root: parse(&root_path),
            root_text: read(&root_path),
            members,
        }
    }

    fn version(&self) -> &str {
        table(&self.root, &["workspace", "package"]).unwrap()["version"]
            .as_str()
            .unwrap()
    }

    fn publishable(&self) -> impl Iterator<Item = &Member> {
        self.members.values().filter(|m| m.publishable())
    }
}

/// A dependency entry, with `workspace = true` resolved through
/// `[workspace.dependencies]`: the crate it names and its version, if any.
fn resolve(workspace: &Workspace, key: &str, entry: &Value) -> (String, Option<String>) {
    let local = entry.as_table();
    let inherited = local
        .and_then(|t| t.get("workspace"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let declared = if inherited {
        table(&workspace.root, &["workspace", "dependencies"])
            .and_then(|deps| deps.get(key))
            .unwrap_or_else(|| {
                panic!("{key}: `workspace = true` but not in [workspace.dependencies]")
            })
    } else {
        entry
    };
    let crate_name = declared
        .get("package")
        .and_then(Value::as_str)
        .unwrap_or(key)
        .to_owned();
    let version = match declared {
        Value::String(version) => Some(version.clone()),
        other => other
            .get("version")
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    (crate_name, version)
}

#[test]
fn every_publishable_crate_has_the_metadata_crates_io_shows() {
    let workspace = Workspace::load();
    let mut problems = Vec::new();
    let mut checked = 0;
    for member in workspace.publishable() {
        checked += 1;
        let name = member.name();
        let text = |field: &str| {
            member
                .field(&workspace.root, field)
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
        };
        let list = |field: &str| -> Vec<String> {
            member
                .field(&workspace.root, field)
                .and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        for field in [
            "description",
            "license",
            "version",
            "edition",
            "rust-version",
        ] {
            if text(field).is_none() {
                problems.push(format!("{name}: no {field}"));
            }
        }
        if let Some(license) = text("license") {
            for file in ["MIT", "Apache-2.0"] {
                if !license.contains(file) {
                    problems.push(format!("{name}: license {license:?} does not name {file}"));
                }
            }
        }
        match text("readme") {
            None => problems.push(format!("{name}: no readme")),
            Some(readme) => {
                let path = member.dir.join(readme);
                match std::fs::read_to_string(&path) {
                    Err(e) => problems.push(format!("{name}: readme {}: {e}", path.display())),
                    Ok(body) if !body.starts_with(&format!("# {name}\n")) => {
                        problems.push(format!("{name}: {readme} does not open with `# {name}`"));
                    }
                    Ok(_) => {}
                }
            }
        }
        let keywords = list("keywords");
        if keywords.is_empty() || keywords.len() > 5 {
            problems.push(format!("{name}: {} keywords (1 to 5)", keywords.len()));
        }
        for keyword in &keywords {
            let valid = keyword.len() <= 20
                && keyword.starts_with(|c: char| c.is_ascii_lowercase())
                && keyword
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
            if !valid {
                problems.push(format!(
                    "{name}: keyword {keyword:?} is not lowercase ASCII of at most 20 characters"
                ));
            }
        }
        let categories = list("categories");
        if categories.is_empty() || categories.len() > 5 {
            problems.push(format!("{name}: {} categories (1 to 5)", categories.len()));
        }
        for category in &categories {
            if !CATEGORY_SLUGS.contains(&category.as_str()) {
                problems.push(format!(
                    "{name}: category {category:?} is not a crates.io slug"
                ));
            }
        }
        if member.text.contains("example.invalid") {
            problems.push(format!("{name}: Cargo.toml names example.invalid"));
        }
    }
    if workspace.root_text.contains("example.invalid") {
        problems.push("Cargo.toml (workspace): names example.invalid".to_owned());
    }
    assert!(
        checked >= 2,
        "found only {checked} publishable crates under crates/"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_publishable_crate_carries_the_license_files() {
    let workspace = Workspace::load();
    let root = workspace_root();
    let mut problems = Vec::new();
    for file in LICENSE_FILES {
        let original = read(&root.join(file));
        assert!(
            original.contains("Copyright (c) 2026 the idem developers"),
            "{file}: no copyright line"
        );
        for member in workspace.publishable() {
            // A symlink to the root file; cargo packages its contents.
            match std::fs::read_to_string(member.dir.join(file)) {
                Ok(copy) if copy == original => {}
                Ok(_) => problems.push(format!(
                    "{}: {file} differs from the root one",
                    member.name()
                )),
                Err(e) => problems.push(format!("{}: {file}: {e}", member.name())),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn dependencies_between_workspace_crates_carry_the_workspace_version() {
    let workspace = Workspace::load();
    let mut problems = Vec::new();
    let mut seen = 0;
    for member in workspace.publishable() {
        let name = member.name();
        for kind in DEPENDENCY_TABLES {
            let Some(deps) = table(&member.manifest, &[kind]) else {
                continue;
            };
            for (key, entry) in deps {
                let (crate_name, version) = resolve(&workspace, key, entry);
                let Some(target) = workspace.members.get(&crate_name) else {
                    continue;
                };
                seen += 1;
                match (target.publishable(), kind, version) {
                    // Published together: the same version as the workspace.
                    (true, _, Some(v)) if v == workspace.version() => {}
                    (true, _, v) => problems.push(format!(
                        "{name}: [{kind}] {crate_name} has version {v:?}, not {:?}",
                        workspace.version()
                    )),
                    // An unpublished crate: only as a dev-dependency without
                    // a version, which `cargo package` drops.
                    (false, "dev-dependencies", None) => {}
                    (false, _, v) => problems.push(format!(
                        "{name}: [{kind}] {crate_name} is publish = false, so it can only be a \
                         dev-dependency without a version (has {v:?})"
                    )),
                }
            }
        }
    }
    assert!(
        seen >= 1,
        "no dependency between workspace crates found: the check saw nothing"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_library_doctests_its_readme() {
    let workspace = Workspace::load();
    let mut problems = Vec::new();
    for member in workspace.publishable() {
        let lib = member.dir.join("src/lib.rs");
        if lib.is_file() && !read(&lib).contains("include_str!(\"../README.md\")") {
            problems.push(format!(
                "{}: src/lib.rs does not include README.md as a doctest",
                member.name()
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The binary is `idem`, but the name `idem` on crates.io belongs to
/// another project: the package that builds it must be named otherwise.
#[test]
fn the_binary_idem_comes_from_a_package_of_another_name() {
    let workspace = Workspace::load();
    let packages: Vec<&str> = workspace
        .members
        .values()
        .filter(|m| {
            m.manifest
                .get("bin")
                .and_then(Value::as_array)
                .is_some_and(|bins| {
                    bins.iter()
                        .any(|b| b.get("name").and_then(Value::as_str) == Some("idem"))
                })
        })
        .map(Member::name)
        .collect();
    assert_eq!(
        packages.len(),
        1,
        "packages with a [[bin]] named idem: {packages:?}"
    );
    assert_ne!(packages[0], "idem", "the crates.io name `idem` is taken");
    assert!(workspace.members[packages[0]].publishable());
}

/// The dependency tree of `package` with `flags`, normal edges only.
fn normal_dependencies(package: &str, flags: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO"))
        .current_dir(workspace_root())
        .args([
            "tree",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
            "-p",
            package,
        ])
        .args(flags)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} {flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("cargo tree prints UTF-8")
}

/// The gateway library, and the binary without its default features,
/// link no broker client: only `idem demo --broker` needs one.
#[test]
fn the_gateway_links_no_broker_client() {
    for (package, flags) in [
        ("idem-gateway", &[][..]),
        ("idem-cli", &["--no-default-features"][..]),
    ] {
        let tree = normal_dependencies(package, flags);
        assert!(tree.lines().count() > 10, "{package}: {tree}");
        for client in ["lapin ", "async-nats ", "idem-consumer "] {
            assert!(
                !tree.lines().any(|l| l.starts_with(client)),
                "{package} {flags:?} links {client}"
            );
        }
    }
    // The check can fail: the default binary does link them.
    let full = normal_dependencies("idem-cli", &[]);
    assert!(full.lines().any(|l| l.starts_with("lapin ")));
}
