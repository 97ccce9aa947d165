#!/usr/bin/env python3
"""Pin laya-edge_git.bb to a commit of this repository, or check the pin.

laya-edge_git.bb is the recipe bitbake builds by default; it builds one commit (SRCREV), so
that a parse needs no network and an image is reproducible (AUTOREV is opt-in: see the
meta-laya README). The crate list it fetches, laya-edge-crates.inc, is generated from the
working tree's Cargo.lock (tools/yocto/crates_inc.py), so the pinned commit's Cargo.lock must
give the same list, or the recipe's `cargo build --frozen` misses crates.

  python3 tools/yocto/pin_srcrev.py [COMMIT]   # pin (default HEAD): rewrite SRCREV and PV
  python3 tools/yocto/pin_srcrev.py --check    # what CI runs

Pinning writes SRCREV = the full commit hash and PV = "<workspace version at that commit>+git"
(bitbake appends the revision to the package version itself), after checking that the
commit's Cargo.lock gives laya-edge-crates.inc byte for byte. Commit the change; the pinned
commit is then the parent of that commit (pinning a commit to itself is impossible).

--check fails unless SRCREV is a full hash of a commit that is HEAD or an ancestor of HEAD
(`git merge-base --is-ancestor`), PV is that commit's version, and the crate list matches its
Cargo.lock. In a shallow clone the pinned commit may be missing although it is on main; then
the check cannot be made: it is skipped with a message telling how to fetch the history
(e.g. actions/checkout's fetch-depth: 0, or `git fetch --unshallow`); LAYA_PIN_SHALLOW=fail
makes it an error. Outside a git checkout (a source tarball) it is skipped too.

Python 3.11+ standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import crates_inc  # noqa: E402  (the generator of laya-edge-crates.inc, same directory)

REPO_ROOT = crates_inc.REPO_ROOT
RECIPE = REPO_ROOT / crates_inc.RECIPE_DIR / f"{crates_inc.PN}_git.bb"
INC = REPO_ROOT / crates_inc.INC_PATH
SRCREV_RE = re.compile(r'^SRCREV = "([^"]*)"$', re.MULTILINE)
PV_RE = re.compile(r'^PV = "([^"]*)"$', re.MULTILINE)


class PinError(Exception):
    pass


def git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True,
                          check=check)


def is_shallow() -> bool:
    return git("rev-parse", "--is-shallow-repository").stdout.strip() == "true"


def commit_exists(rev: str) -> bool:
    return git("cat-file", "-e", f"{rev}^{{commit}}", check=False).returncode == 0


def version_at(commit: str) -> str:
    toml = tomllib.loads(git("show", f"{commit}:Cargo.toml").stdout)
    version = toml.get("workspace", {}).get("package", {}).get("version")
    if not version:
        raise PinError(f"no [workspace.package] version in Cargo.toml at {commit}")
    return version


def crates_inc_at(commit: str) -> str:
    """laya-edge-crates.inc as crates_inc.py renders it for the tree of commit."""
    locks = [p for p in git("ls-tree", "-r", "--name-only", commit).stdout.splitlines()
             if Path(p).name == "Cargo.lock"]
    with tempfile.TemporaryDirectory() as tmp:
        for rel in locks:
            dest = Path(tmp, rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(subprocess.run(["git", "-C", str(REPO_ROOT), "show", f"{commit}:{rel}"],
                                            capture_output=True, check=True).stdout)
        # Not a git work tree: crates_inc finds the lock files by walking it, sorted.
        return crates_inc.render(Path(tmp))


def check_crates(commit: str) -> None:
    current = INC.read_text(encoding="utf-8")
    wanted = crates_inc_at(commit)
    if current != wanted:
        drift = crates_inc.summarize_drift(current, wanted)
        raise PinError(
            f"{crates_inc.INC_PATH} is not the crate list of Cargo.lock at {commit[:12]}; the pinned "
            "recipe would miss crates. Pin a commit whose Cargo.lock is the working tree's (usually "
            "HEAD after committing Cargo.lock), or regenerate the .inc. Crates the commit needs (+) "
            "or does not (-):\n" + "\n".join(drift[:20]))


def pinned() -> tuple[str, str]:
    text = RECIPE.read_text()
    srcrev, pv = SRCREV_RE.search(text), PV_RE.search(text)
    if not srcrev or not pv:
        raise PinError(f"{RECIPE.relative_to(REPO_ROOT)} has no SRCREV = \"...\" or PV = \"...\" line")
    return srcrev.group(1), pv.group(1)


def pin(rev: str) -> int:
    r = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if r.returncode != 0:
        raise PinError(f"{rev!r} is not a commit of this repository")
    commit = r.stdout.strip()
    check_crates(commit)
    pv = f"{version_at(commit)}+git"
    text = RECIPE.read_text()
    text = SRCREV_RE.sub(f'SRCREV = "{commit}"', text, count=1)
    text = PV_RE.sub(f'PV = "{pv}"', text, count=1)
    RECIPE.write_text(text)
    print(f"pin_srcrev: {RECIPE.relative_to(REPO_ROOT)}: SRCREV = {commit}, PV = {pv}")
    return 0


def in_git_checkout() -> bool:
    return git("rev-parse", "--git-dir", check=False).returncode == 0


def check() -> int:
    if not in_git_checkout():
        print("pin_srcrev: SKIPPED: not a git checkout (a source tarball): the pinned SRCREV cannot be "
              "checked against the history here.")
        return 0
    srcrev, pv = pinned()
    rel = RECIPE.relative_to(REPO_ROOT)
    if srcrev == "${AUTOREV}":
        raise PinError(f"{rel} follows AUTOREV: the default recipe must be pinned (AUTOREV is "
                       "opt-in from local.conf, see the meta-laya README)")
    if not re.fullmatch(r"[0-9a-f]{40}", srcrev):
        raise PinError(f"{rel}: SRCREV {srcrev!r} is not a full commit hash")
    if not commit_exists(srcrev) or git("merge-base", "--is-ancestor", srcrev, "HEAD",
                                        check=False).returncode != 0:
        if is_shallow():
            # A shallow CI clone cannot tell; LAYA_PIN_SHALLOW=fail makes it an error.
            mode = os.environ.get("LAYA_PIN_SHALLOW") or "skip"
            msg = (f"this is a shallow clone and SRCREV {srcrev[:12]} of {rel} is not in its "
                   "history, so whether it is a commit of this repository cannot be checked. Fetch "
                   "the whole history (actions/checkout: fetch-depth: 0; or git fetch --unshallow)")
            if mode == "skip":
                print(f"pin_srcrev: SKIPPED: {msg}.")
                return 0
            raise PinError(msg + "; LAYA_PIN_SHALLOW=skip skips this check.")
        if not commit_exists(srcrev):
            raise PinError(f"{rel}: SRCREV {srcrev} is not a commit of this repository")
        raise PinError(f"{rel}: SRCREV {srcrev[:12]} is not HEAD or an ancestor of HEAD (a commit "
                       "that is not on this branch: pin one that is, tools/yocto/pin_srcrev.py)")
    wanted_pv = f"{version_at(srcrev)}+git"
    if pv != wanted_pv:
        raise PinError(f"{rel}: PV is {pv!r}, the pinned commit's version gives {wanted_pv!r} "
                       "(tools/yocto/pin_srcrev.py sets both)")
    check_crates(srcrev)
    behind = git("rev-list", "--count", f"{srcrev}..HEAD").stdout.strip()
    print(f"pin_srcrev: {rel}: SRCREV {srcrev[:12]} is an ancestor of HEAD ({behind} commits "
          f"behind), PV {pv}, {crates_inc.INC_PATH.name} matches its Cargo.lock")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commit", nargs="?", default="HEAD", help="commit to pin (default HEAD)")
    parser.add_argument("--check", action="store_true", help="check the pin instead of writing it")
    args = parser.parse_args(argv)
    try:
        return check() if args.check else pin(args.commit)
    except (PinError, crates_inc.LockError) as e:
        print(f"pin_srcrev: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
