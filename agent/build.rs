//! Records the git commit the binary is built from (`laya-edge --version`), when it is built from
//! a git checkout with git installed; nothing otherwise (a release tarball, the Yocto recipe's
//! vendored source).

use std::process::Command;

fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // A checkout moves HEAD, a commit the branch HEAD names (not the index: rebuilding the
    // crate at every `git add` is too dear, so uncommitted changes are not marked).
    let head = root.join(".git/HEAD");
    if head.exists() {
        println!("cargo:rerun-if-changed={}", head.display());
        if let Some(branch) =
            std::fs::read_to_string(&head).ok().and_then(|h| h.strip_prefix("ref: ").map(|r| r.trim().to_owned()))
        {
            // A missing path would rerun this at every build: a packed ref lives in packed-refs.
            let loose = root.join(".git").join(branch);
            let file = if loose.exists() { loose } else { root.join(".git/packed-refs") };
            if file.exists() {
                println!("cargo:rerun-if-changed={}", file.display());
            }
        }
    }
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()));
    if let Some(c) = commit {
        println!("cargo:rustc-env=LAYA_EDGE_COMMIT={c}");
    }
}
