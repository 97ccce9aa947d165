#!/usr/bin/env python3
"""Check LIC_FILES_CHKSUM of the laya-edge recipes against the repository's own files.

bitbake checks LIC_FILES_CHKSUM in do_populate_lic, i.e. only in a Yocto build. This does the
part of that check that concerns files of this repository, without one:

  * every `file://` entry of LIC_FILES_CHKSUM in laya-edge.inc that is not under
    ${COMMON_LICENSE_DIR} names a file of the repository (the recipe's ${S} is the repository
    root), and its md5 (of the lines beginline..endline, if given, as bitbake computes it)
    is the one the entry says;
  * the repository's LICENSE is among them, it is the standard Apache License 2.0 text (as
    published at https://www.apache.org/licenses/LICENSE-2.0.txt), and Apache-2.0 is both the
    workspace's licence in Cargo.toml and in the recipe's LICENSE.

The ${COMMON_LICENSE_DIR} entries are oe-core's texts, which only a Yocto build has.

Run from anywhere; Python 3.11+ standard library only:
  python3 tools/yocto/lic_files_chksum.py
"""

from __future__ import annotations

import hashlib
import re
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INC = REPO_ROOT / "yocto-layer/recipes-laya/laya-edge/laya-edge.inc"
# md5 of https://www.apache.org/licenses/LICENSE-2.0.txt, the file many recipes checksum
# (e.g. `file://LICENSE;md5=3b83ef96387f14655fc854ddc3c6bd57`); Debian ships it byte for
# byte as /usr/share/common-licenses/Apache-2.0.
APACHE_2_0_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def variable(text: str, name: str) -> str:
    """The value of `NAME = "..."` in a bitbake file, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    m = re.search(rf'^{name}\s*=\s*"([^"]*)"', joined, re.MULTILINE)
    if not m:
        raise SystemExit(f"lic_files_chksum: no {name} = \"...\" in {INC.relative_to(REPO_ROOT)}")
    return m.group(1)


def md5_of(path: Path, beginline: int | None, endline: int | None) -> str:
    """The md5 bitbake's license QA computes: the whole file, or lines beginline..endline
    (1-based, inclusive) as read in text mode with their line ends."""
    if beginline is None and endline is None:
        return hashlib.md5(path.read_bytes()).hexdigest()
    lines = path.read_bytes().splitlines(keepends=True)
    first = (beginline or 1) - 1
    last = endline or len(lines)
    return hashlib.md5(b"".join(lines[first:last])).hexdigest()


def main() -> int:
    text = INC.read_text()
    problems = []
    checked = []
    for entry in variable(text, "LIC_FILES_CHKSUM").split():
        if not entry.startswith("file://"):
            problems.append(f"{entry}: not a file:// entry")
            continue
        path, *params = entry[len("file://"):].split(";")
        if path.startswith("${COMMON_LICENSE_DIR}/"):
            continue
        opts = dict(p.split("=", 1) for p in params if "=" in p)
        if "md5" not in opts:
            problems.append(f"{entry}: no md5")
            continue
        f = REPO_ROOT / path
        if "$" in path or not f.is_file():
            problems.append(f"{entry}: {path} is not a file of the repository (the recipe's ${{S}})")
            continue
        actual = md5_of(f, int(opts["beginline"]) if "beginline" in opts else None,
                        int(opts["endline"]) if "endline" in opts else None)
        if actual != opts["md5"]:
            problems.append(f"{path}: LIC_FILES_CHKSUM says md5={opts['md5']}, the file's is {actual} "
                            f"(update the entry if the change of licence text is intended)")
        checked.append(path)

    if "LICENSE" not in checked:
        problems.append("LIC_FILES_CHKSUM has no entry for the repository's LICENSE")
    license_file = REPO_ROOT / "LICENSE"
    if license_file.is_file() and hashlib.md5(license_file.read_bytes()).hexdigest() != APACHE_2_0_MD5:
        problems.append("LICENSE is not the standard Apache License 2.0 text "
                        "(https://www.apache.org/licenses/LICENSE-2.0.txt)")
    cargo = tomllib.loads((REPO_ROOT / "Cargo.toml").read_text())
    workspace_license = cargo.get("workspace", {}).get("package", {}).get("license")
    if workspace_license != "Apache-2.0":
        problems.append(f"Cargo.toml's workspace licence is {workspace_license!r}, LICENSE is Apache-2.0")
    recipe_licenses = {x.strip() for x in variable(text, "LICENSE").split("&")}
    if "Apache-2.0" not in recipe_licenses:
        problems.append("the recipe's LICENSE does not name Apache-2.0, laya-edge's own licence")

    rel = INC.relative_to(REPO_ROOT)
    if problems:
        for p in problems:
            print(f"lic_files_chksum: {rel}: {p}", file=sys.stderr)
        return 1
    print(f"lic_files_chksum: {rel}: {', '.join(checked)} match; LICENSE is Apache-2.0 like Cargo.toml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
