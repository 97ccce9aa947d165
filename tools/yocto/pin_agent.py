#!/usr/bin/env python3
"""Check that the agent laya-edge_git.bb pins has what the layer around it uses.

The recipe builds one commit (SRCREV, tools/yocto/pin_srcrev.py); the layer that builds and runs
it (its PACKAGECONFIG options, the systemd unit and its drop-ins) is this tree's. When a landing
makes the layer use something the pinned agent does not have yet, nothing else notices until a
board does: a PACKAGECONFIG option whose cargo feature the pinned Cargo.toml lacks fails at
do_compile; a signal the unit sends that the pinned agent does not handle ends it (SIGHUP's
default action is to terminate, so `systemctl reload` would stop the service, and
Restart=on-failure does not bring back a process that a signal it was sent ended cleanly).
This checks, against the pinned commit itself:

  1. every cargo feature the layer passes (`--features NAME` in a PACKAGECONFIG option's first
     field or in CARGO_BUILD_FLAGS, in every recipe, .inc and .bbappend under yocto-layer/) is
     in the [features] table of agent/Cargo.toml at SRCREV;
  2. every signal the unit sends the agent, ExecReload='s `kill -HUP` (SIGHUP), KillSignal= and
     RestartKillSignal= (SIGTERM unless set), SIGHUP with SendSIGHUP=yes, in laya-edge.service
     and the board drop-ins, is handled by the agent at SRCREV: its tokio `SignalKind` (or
     `ctrl_c` for SIGINT) is used under agent/src at that commit;
  3. every file or directory of the source tree the layer installs (`${S}/PATH` in a recipe's
     tasks: the OTA adapters under ota/, the demo model) exists at SRCREV.

  python3 tools/yocto/pin_agent.py [--srcrev REV]

It names each thing missing. The pinned commit must be in this clone: a shallow clone without
it fails, saying how to fetch the history (a check that cannot be made is not passed).

Python 3.11+ standard library only.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LAYER = REPO_ROOT / "yocto-layer"
RECIPE = LAYER / "recipes-laya" / "laya-edge" / "laya-edge_git.bb"
UNIT = LAYER / "recipes-laya" / "laya-edge" / "files" / "laya-edge.service"
SRCREV_RE = re.compile(r'^SRCREV = "([^"]*)"$', re.MULTILINE)
# PACKAGECONFIG[name] = "enable,disable,depends,rdepends,..." (its first field goes to cargo);
# CARGO_BUILD_FLAGS += "...".
PACKAGECONFIG_RE = re.compile(r'^PACKAGECONFIG\[([^\]]+)\]\s*\??=\s*"([^"]*)"', re.MULTILINE)
BUILD_FLAGS_RE = re.compile(r'^CARGO_BUILD_FLAGS\s*[+.:]?\??=\s*"([^"]*)"', re.MULTILINE)
FEATURES_RE = re.compile(r"--features(?:=|\s+)([^\s,\"]+)")
# A path of the source tree a task uses: ${S}/ota/mender/laya-model, ${S}/models/demo/.
SOURCE_PATH_RE = re.compile(r"\$\{S\}/([A-Za-z0-9_.\-/]+)")

# What the agent's source says when it handles a signal (tokio::signal).
HANDLERS = {
    "SIGHUP": ["SignalKind::hangup()"],
    "SIGTERM": ["SignalKind::terminate()"],
    "SIGINT": ["SignalKind::interrupt()", "signal::ctrl_c()"],
    "SIGQUIT": ["SignalKind::quit()"],
    "SIGUSR1": ["SignalKind::user_defined1()"],
    "SIGUSR2": ["SignalKind::user_defined2()"],
}
# kill(1) and systemd spell signals by name (HUP, SIGHUP) or number.
NUMBERS = {"1": "SIGHUP", "2": "SIGINT", "3": "SIGQUIT", "9": "SIGKILL", "10": "SIGUSR1", "12": "SIGUSR2",
           "15": "SIGTERM"}


class CheckError(Exception):
    pass


def git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=check)


def signal_name(word: str) -> str:
    word = word.upper()
    if word in NUMBERS:
        return NUMBERS[word]
    return word if word.startswith("SIG") else f"SIG{word}"


def layer_files() -> list[Path]:
    return sorted(p for p in LAYER.rglob("*") if p.suffix in (".bb", ".bbappend", ".inc") and p.is_file())


def features_used() -> dict[str, list[str]]:
    """Each cargo feature the layer passes, with where: {feature: ["file: PACKAGECONFIG[x]"]}."""
    used: dict[str, list[str]] = {}
    for path in layer_files():
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(REPO_ROOT)
        for option, value in PACKAGECONFIG_RE.findall(text):
            for feature in FEATURES_RE.findall(value.split(",")[0]):
                used.setdefault(feature, []).append(f"{rel}: PACKAGECONFIG[{option}]")
        for value in BUILD_FLAGS_RE.findall(text):
            for feature in FEATURES_RE.findall(value):
                used.setdefault(feature, []).append(f"{rel}: CARGO_BUILD_FLAGS")
    return used


def source_paths_used() -> dict[str, list[str]]:
    """Each path of the source tree the laya-edge recipes' tasks use, with where: {path: [file]}
    (other recipes, librknnrt's, fetch trees of their own)."""
    used: dict[str, list[str]] = {}
    for path in (p for p in layer_files() if p.name.startswith("laya-edge")):
        rel = str(path.relative_to(REPO_ROOT))
        for found in SOURCE_PATH_RE.findall(path.read_text(encoding="utf-8")):
            cleaned = found.rstrip("/.").rstrip("/")
            if cleaned and rel not in used.setdefault(cleaned, []):
                used[cleaned].append(rel)
    return used


def unit_files() -> list[Path]:
    """The unit and the drop-ins the board layers install beside it."""
    dropins = sorted(p for p in LAYER.glob("dynamic-layers/*/recipes-laya/laya-edge/files/*.conf"))
    return [UNIT, *dropins]


def signals_sent() -> dict[str, list[str]]:
    """Each signal the unit sends the agent, with why: {signal: ["file: Key=value"]}."""
    sent: dict[str, list[str]] = {}
    settings: dict[str, tuple[str, str]] = {}
    for path in unit_files():
        rel = path.relative_to(REPO_ROOT)
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r"^\s*([A-Za-z]+)=(.*)$", line)
            if not m:
                continue
            key, value = m.group(1), m.group(2).strip()
            # A later file (a drop-in) overrides an earlier one's setting, as systemd reads them.
            settings[key] = (value, f"{rel}: {key}={value}")
            if key == "ExecReload" and re.search(r"(^|[/\s])kill\s", value):
                for word in re.findall(r"\s-(?:s\s+|-signal[=\s]+)?(?:SIG)?([A-Z]+[0-9]*|[0-9]+)\b", value):
                    sent.setdefault(signal_name(word), []).append(f"{rel}: ExecReload={value}")
    kill, why = settings.get("KillSignal", ("SIGTERM", "KillSignal= (unset: SIGTERM)"))
    sent.setdefault(signal_name(kill), []).append(why)
    restart, why = settings.get("RestartKillSignal", (kill, f"RestartKillSignal= (unset: the KillSignal, {signal_name(kill)})"))
    sent.setdefault(signal_name(restart), []).append(why)
    if settings.get("SendSIGHUP", ("no", ""))[0].lower() in ("yes", "true", "1", "on"):
        sent.setdefault("SIGHUP", []).append(settings["SendSIGHUP"][1])
    reload_signal = settings.get("ReloadSignal")
    if reload_signal:
        sent.setdefault(signal_name(reload_signal[0]), []).append(reload_signal[1])
    return sent


def pinned_commit(srcrev: str | None) -> str:
    if srcrev is None:
        m = SRCREV_RE.search(RECIPE.read_text(encoding="utf-8"))
        if not m:
            raise CheckError(f"{RECIPE.relative_to(REPO_ROOT)} has no SRCREV = \"...\" line")
        srcrev = m.group(1)
    if not re.fullmatch(r"[0-9a-f]{40}", srcrev):
        raise CheckError(f"SRCREV {srcrev!r} is not a full commit hash (tools/yocto/pin_srcrev.py checks the pin)")
    if git("cat-file", "-e", f"{srcrev}^{{commit}}", check=False).returncode != 0:
        shallow = git("rev-parse", "--is-shallow-repository", check=False).stdout.strip() == "true"
        if shallow:
            raise CheckError(f"this is a shallow clone and the pinned commit {srcrev[:12]} is not in it, so what "
                             "the pinned agent has cannot be checked: fetch the whole history "
                             "(git fetch --unshallow; actions/checkout: fetch-depth: 0)")
        raise CheckError(f"the pinned commit {srcrev} is not a commit of this repository")
    return srcrev


def check(srcrev: str) -> list[str]:
    """What the agent at srcrev lacks, one sentence each; empty when it has everything."""
    missing = []
    short = srcrev[:12]
    cargo = git("show", f"{srcrev}:agent/Cargo.toml", check=False)
    if cargo.returncode != 0:
        return [f"the pinned commit {short} has no agent/Cargo.toml"]
    have = set(tomllib.loads(cargo.stdout).get("features", {}))
    for feature, where in sorted(features_used().items()):
        if feature not in have:
            missing.append(f"cargo feature `{feature}` ({'; '.join(where)}) is not in agent/Cargo.toml at "
                           f"{short} (its features: {', '.join(sorted(have)) or 'none'}): do_compile would fail")
    for sig, why in sorted(signals_sent().items()):
        if sig == "SIGKILL":
            continue  # nothing handles it; the unit ends the agent with it on purpose
        patterns = HANDLERS.get(sig)
        if patterns is None:
            missing.append(f"the unit sends {sig} ({'; '.join(why)}), which no known handler covers: "
                           "teach tools/yocto/pin_agent.py its tokio SignalKind")
            continue
        found = any(git("grep", "-q", "-F", p, srcrev, "--", "agent/src", check=False).returncode == 0
                    for p in patterns)
        if not found:
            missing.append(f"the unit sends {sig} ({'; '.join(why)}), but the agent at {short} does not handle "
                           f"it (no {' or '.join(patterns)} under agent/src): the signal's default action "
                           "would end the agent")
    for path, where in sorted(source_paths_used().items()):
        if git("cat-file", "-e", f"{srcrev}:{path}", check=False).returncode != 0:
            missing.append(f"{path} ({', '.join(where)}) is not in the tree at {short}: do_install would fail")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--srcrev", help="check this commit instead of laya-edge_git.bb's SRCREV")
    parser.add_argument("--check", action="store_true", help="accepted for symmetry with the other tools")
    args = parser.parse_args(argv)
    try:
        srcrev = pinned_commit(args.srcrev)
        missing = check(srcrev)
    except CheckError as e:
        print(f"pin_agent: {e}", file=sys.stderr)
        return 1
    if missing:
        print(f"pin_agent: laya-edge_git.bb pins {srcrev[:12]}, whose agent lacks what the layer uses "
              "(pin a newer commit: tools/yocto/pin_srcrev.py):", file=sys.stderr)
        for m in missing:
            print(f"  - {m}", file=sys.stderr)
        return 1
    features = ", ".join(sorted(features_used())) or "none"
    signals = ", ".join(s for s in sorted(signals_sent()) if s != "SIGKILL")
    print(f"pin_agent: the agent at {srcrev[:12]} has every cargo feature the layer uses ({features}), "
          f"handles every signal the unit sends ({signals}) and has every file the recipe installs "
          f"({', '.join(sorted(source_paths_used())) or 'none'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
