//! Every dependency must build with rustc 1.94 (Yocto wrynose ships 1.94.1), and this machine's
//! compiler may be newer. Cargo records each package's declared `rust-version` in its metadata:
//! none may be newer than ours.

use std::process::Command;

use laya_topics::Value;
use laya_topics::json::{ParseOptions, parse};

fn version(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

#[test]
fn no_dependency_declares_a_newer_rust_version_than_the_workspace() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .args(["--filter-platform", "x86_64-unknown-linux-gnu", "--filter-platform", "aarch64-unknown-linux-gnu"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let meta = parse(&out.stdout, ParseOptions { max_depth: 1000 }).expect("metadata is JSON");
    let ours = version(env!("CARGO_PKG_RUST_VERSION"));
    assert_eq!(ours, [1, 94]);
    let packages = meta.get("packages").and_then(Value::as_array).expect("packages");
    assert!(packages.len() > 20);
    let too_new: Vec<String> = packages
        .iter()
        .filter_map(|p| {
            let rv = p.get("rust_version").and_then(Value::as_str)?;
            let name = p.get("name").and_then(Value::as_str).unwrap_or("?");
            let v = p.get("version").and_then(Value::as_str).unwrap_or("?");
            (version(rv) > ours).then(|| format!("{name} {v} needs {rv}"))
        })
        .collect();
    assert!(too_new.is_empty(), "dependencies newer than rust-version 1.94: {too_new:?}");
}
