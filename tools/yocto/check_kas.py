#!/usr/bin/env python3
"""Check the kas files of yocto-layer/kas without a Yocto build.

Each top-level kas file is loaded the way `kas build` loads it, includes and all, which
validates every file against kas's configuration schema, and then checked for what this
layer needs of a board file: a machine, the layer itself among the repositories, wrynose
branches, and the local.conf lines that point LAYA_EDGE_REPO at the checkout. No repository
is cloned; the network is not used.

Needs kas (tools/yocto/requirements.txt); run from the repository root:
  python3 tools/yocto/check_kas.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
KAS_DIR = REPO_ROOT / "yocto-layer" / "kas"
RELEASE_BRANCH = "wrynose"
# bitbake's branch for wrynose, and meta-lts-mixins' branch naming.
OTHER_BRANCHES = {"bitbake": "2.18", "meta-lts-mixins": "wrynose/linux-firmware"}


def check(path: Path) -> list[str]:
    from kas.includehandler import IncludeHandler

    problems = []
    config, missing = IncludeHandler([str(path)], use_lock=False).get_config()
    if missing:
        problems.append(f"includes from repositories kas would have to clone: {missing}")
    if not config.get("machine"):
        problems.append("no machine")
    # A repository given with no keys at all (`name:`) loads as None.
    repos = {name: repo or {} for name, repo in config.get("repos", {}).items()}
    own = [name for name, repo in repos.items() if not repo.get("url") and not repo.get("path")]
    if own != ["laya-edge"] or "yocto-layer" not in repos["laya-edge"].get("layers", {}):
        problems.append("the laya-edge repository (this one) with layer yocto-layer is missing")
    default_branch = config.get("defaults", {}).get("repos", {}).get("branch")
    for name, repo in repos.items():
        if not repo.get("url"):
            continue
        branch = repo.get("branch", default_branch)
        wanted = OTHER_BRANCHES.get(name, RELEASE_BRANCH)
        if branch != wanted and not repo.get("commit"):
            problems.append(f"repository {name} is on branch {branch!r}, not {wanted!r}")
    local_conf = "\n".join(config.get("local_conf_header", {}).values())
    if "LAYA_EDGE_REPO" not in local_conf:
        problems.append("local.conf does not set LAYA_EDGE_REPO (the recipes would skip themselves)")
    if "packagegroup-laya" not in local_conf:
        problems.append("packagegroup-laya is not installed in the image")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path,
                        help="kas files (default: yocto-layer/kas/*.yml)")
    args = parser.parse_args(argv)
    files = args.files or sorted(KAS_DIR.glob("*.yml"))
    if not files:
        print("check_kas: no kas files found", file=sys.stderr)
        return 1

    from kas.context import create_global_context

    failed = False
    with tempfile.TemporaryDirectory() as work:
        # kas resolves its work and build directories from the environment at start-up;
        # nothing is written there by loading configuration.
        os.environ["KAS_WORK_DIR"] = work
        create_global_context(argparse.Namespace(no_color=True, update=False,
                                                 force_checkout=False))
        for path in files:
            rel = path.resolve().relative_to(REPO_ROOT)
            try:
                problems = check(path.resolve())
            except Exception as e:  # kas reports schema errors as exceptions of its own
                problems = [f"{type(e).__name__}: {e}"]
            if problems:
                failed = True
                for p in problems:
                    print(f"check_kas: {rel}: {p}", file=sys.stderr)
            else:
                print(f"check_kas: {rel}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
