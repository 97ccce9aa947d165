#!/usr/bin/env python3
"""Check the laya-edge recipe's LICENSE against the crates linked into the binary.

A Rust binary statically links its crates, so the recipe's LICENSE has to cover them, not
only laya-edge's own Apache-2.0. This asks cargo which crates end up in the laya-edge binary
for a Linux target, with every feature on (every PACKAGECONFIG): laya-edge's normal
dependencies, followed through normal dependencies only; build dependencies, dev-dependencies
and proc-macro crates run on the build host and are left out. Each crate's SPDX expression must
be satisfied by the licences the recipe lists (an OR needs one of its sides, an AND both).

Usage (from the repository root; `cargo metadata` reads Cargo.lock and the crates' manifests,
downloading crates it has not cached):
  python3 tools/yocto/licenses.py            # print the licences and which crates need them
  python3 tools/yocto/licenses.py --check    # exit 1 if LICENSE in laya-edge.inc misses one

Python 3.11+ standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
INC = REPO_ROOT / "yocto-layer/recipes-laya/laya-edge/laya-edge.inc"
PACKAGE = "laya-edge"
# Any Linux target gives the same graph here; aarch64 is what the boards run.
TARGET = "aarch64-unknown-linux-gnu"

TOKEN = re.compile(r"\s*(\(|\)|[A-Za-z0-9.+-]+)")


def parse_spdx(expr: str):
    """SPDX expression -> nested ('or'|'and', [...]) / licence-id tree.

    Also reads the old crates.io spellings "MIT/Apache-2.0" (an OR). "X WITH exception" is
    kept as the id "X WITH exception": only an exact match satisfies it.
    """
    tokens = []
    pos = 0
    text = expr.replace("/", " OR ")
    while pos < len(text):
        m = TOKEN.match(text, pos)
        if not m:
            if text[pos:].strip() == "":
                break
            raise ValueError(f"cannot parse licence expression {expr!r}")
        tokens.append(m.group(1))
        pos = m.end()

    def parse_seq(i, op, parse_item):
        """parse_item (op parse_item)*: a lone item as itself, else (op, items)."""
        left, i = parse_item(i)
        items = [left]
        while i < len(tokens) and tokens[i].upper() == op.upper():
            right, i = parse_item(i + 1)
            items.append(right)
        return ((op, items) if len(items) > 1 else left), i

    def parse_or(i):
        return parse_seq(i, "or", parse_and)

    def parse_and(i):
        return parse_seq(i, "and", parse_atom)

    def parse_atom(i):
        if i >= len(tokens):
            raise ValueError(f"truncated licence expression {expr!r}")
        if tokens[i] == "(":
            node, i = parse_or(i + 1)
            if i >= len(tokens) or tokens[i] != ")":
                raise ValueError(f"unbalanced licence expression {expr!r}")
            return node, i + 1
        ident = tokens[i]
        i += 1
        if i < len(tokens) and tokens[i].upper() == "WITH":
            ident = f"{ident} WITH {tokens[i + 1]}"
            i += 2
        return ident, i

    node, i = parse_or(0)
    if i != len(tokens):
        raise ValueError(f"trailing text in licence expression {expr!r}")
    return node


def satisfied(node, allowed: set[str]) -> bool:
    if isinstance(node, str):
        return node in allowed
    op, items = node
    results = [satisfied(x, allowed) for x in items]
    return any(results) if op == "or" else all(results)


def recipe_licenses() -> set[str]:
    m = re.search(r'^LICENSE\s*=\s*"([^"]*)"', INC.read_text(), re.MULTILINE)
    if not m:
        raise SystemExit(f"licenses: no LICENSE = \"...\" in {INC}")
    if "|" in m.group(1):
        raise SystemExit("licenses: LICENSE in the recipe should be a plain '&' list")
    return {x.strip() for x in m.group(1).split("&") if x.strip()}


def linked_crates(root: Path) -> list[dict]:
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features",
         "--filter-platform", TARGET],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
    meta = json.loads(out)
    packages = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    roots = [p["id"] for p in meta["packages"] if p["name"] == PACKAGE and p["source"] is None]
    if len(roots) != 1:
        raise SystemExit(f"licenses: workspace package {PACKAGE} not found")

    def is_proc_macro(pid):
        return any("proc-macro" in t["kind"] for t in packages[pid]["targets"])

    seen, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for dep in nodes[pid]["deps"]:
            normal = any(k["kind"] is None for k in dep["dep_kinds"])
            if normal and not is_proc_macro(dep["pkg"]):
                stack.append(dep["pkg"])
    return [packages[pid] for pid in sorted(seen)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the recipe's LICENSE does not cover every linked crate")
    args = parser.parse_args(argv)

    allowed = recipe_licenses()
    crates = linked_crates(REPO_ROOT)
    missing = []
    by_expr = defaultdict(list)
    for c in crates:
        expr = c.get("license")
        if not expr:
            missing.append(f"{c['name']} {c['version']}: no SPDX licence in its manifest "
                           f"(license-file: {c.get('license_file')})")
            continue
        by_expr[expr].append(f"{c['name']} {c['version']}")
        if not satisfied(parse_spdx(expr), allowed):
            missing.append(f"{c['name']} {c['version']}: {expr}")

    if not args.check:
        for expr, names in sorted(by_expr.items(), key=lambda kv: -len(kv[1])):
            print(f"{len(names):4d}  {expr}: {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}")
    if missing:
        print(f"licenses: LICENSE = \"{' & '.join(sorted(allowed))}\" in {INC.relative_to(REPO_ROOT)} "
              f"does not cover:", file=sys.stderr)
        for m in missing:
            print(f"  {m}", file=sys.stderr)
        print("Add the licences (and their LIC_FILES_CHKSUM entries) to the recipe.", file=sys.stderr)
        return 1
    print(f"licenses: LICENSE covers the {len(crates)} packages linked into {PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
