#!/usr/bin/env python3
"""Check the kas files of yocto-layer/kas without a Yocto build.

Each top-level kas file is loaded the way `kas build` loads it, includes and all, which
validates every file against kas's configuration schema, and then checked for what this
layer needs of a board file: a machine, the layer itself among the repositories, wrynose
branches, every other repository pinned to a full commit hash (`commit:`), the local.conf
lines that point LAYA_EDGE_REPO at the checkout, and, with meta-qcom, the lines that drop its
kernels' AUTOREV variants (which would need the network at every parse). Whether a pinned
commit is on its branch needs the network, so it is not checked here; kas checks it out.

Then the fetch of laya-edge that those lines set up is replayed from a detached checkout
(HEAD only, no `main` or any other ref, as CI and `git checkout <sha>` leave it): the git
commands bitbake 2.18's git fetcher (lib/bb/fetch2/git.py) runs for the recipe's SRC_URI with
LAYA_EDGE_REPO as the kas file sets it (clone --bare --mirror, the branch or nobranch check
of the pinned SRCREV, and, for an opted-in AUTOREV with usehead=1, ls-remote's HEAD). The same
replay without usehead/nobranch is expected to fail: that is issue #18's finding 6, and the
check says so if it stops failing. Only local git commands run; nothing is fetched from the
network.

Needs kas (tools/yocto/requirements.txt); run from the repository root:
  python3 tools/yocto/check_kas.py
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
KAS_DIR = REPO_ROOT / "yocto-layer" / "kas"
GIT_RECIPE = REPO_ROOT / "yocto-layer" / "recipes-laya" / "laya-edge" / "laya-edge_git.bb"
RELEASE_BRANCH = "wrynose"
# bitbake's branch for wrynose, and meta-lts-mixins' branch naming.
OTHER_BRANCHES = {"bitbake": "2.18", "meta-lts-mixins": "wrynose/linux-firmware"}
FULL_HASH = re.compile(r"[0-9a-f]{40}")
# meta-qcom's (wrynose) kernel recipes with BBCLASSEXTEND = "devupstream:target" and
# SRCREV:class-devupstream ?= "${AUTOREV}".
QCOM_DEVUPSTREAM_KERNELS = ("linux-qcom", "linux-qcom-rt", "linux-qcom-next", "linux-qcom-next-rt")


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
        if branch != wanted:
            problems.append(f"repository {name} is on branch {branch!r}, not {wanted!r}")
        # Every other repository is pinned (kas's `commit:` beside `branch:`), so that one
        # laya-edge commit always builds with the same layers.
        commit = repo.get("commit")
        if commit is None:
            problems.append(f"repository {name} has no commit: pin it to a full 40-hex commit hash "
                            "of its branch (the layer README, \"Moving the layer pins\")")
        elif not FULL_HASH.fullmatch(str(commit)):
            problems.append(f"repository {name}'s commit {commit!r} is not a full 40-hex commit "
                            "hash (lowercase)")
    local_conf = "\n".join(config.get("local_conf_header", {}).values())
    if "meta-qcom" in repos:
        # meta-qcom's kernels would run `git ls-remote` at every parse (their AUTOREV devupstream
        # variants): the layer README, "Pinned or AUTOREV".
        for pn in QCOM_DEVUPSTREAM_KERNELS:
            line = f'BBCLASSEXTEND:remove:pn-{pn} = "devupstream:target"'
            if not re.search(rf"^\s*{re.escape(line)}\s*$", local_conf, re.MULTILINE):
                problems.append(f"local.conf does not drop {pn}'s AUTOREV devupstream variant "
                                f"({line}): a parse without the network would fail")
    if "LAYA_EDGE_REPO" not in local_conf:
        problems.append("local.conf does not set LAYA_EDGE_REPO (the recipes would skip themselves)")
    if "packagegroup-laya" not in local_conf:
        problems.append("packagegroup-laya is not installed in the image")
    return problems


class LocalDatastore:
    """The one variable the kas file's inline Python reads, as bitbake would give it."""

    def getVar(self, name):  # noqa: N802 (bitbake's name)
        if name != "LAYERDIR_laya":
            raise KeyError(f"the kas file's LAYA_EDGE_REPO reads {name}, which this check does not know")
        return str(REPO_ROOT / "yocto-layer")


def laya_edge_repo(local_conf: str) -> str:
    """LAYA_EDGE_REPO as bitbake expands the kas file's local.conf line."""
    m = re.search(r'^\s*LAYA_EDGE_REPO\s*=\s*"(.*)"\s*$', local_conf, re.MULTILINE)
    if not m:
        raise ValueError("no LAYA_EDGE_REPO = \"...\" line in local.conf")
    return re.sub(r"\$\{@(.*?)\}",
                  lambda e: str(eval(e.group(1), {"os": os}, {"d": LocalDatastore()})),  # noqa: S307
                  m.group(1))


def recipe_srcrev_and_uri() -> tuple[str, str]:
    text = GIT_RECIPE.read_text()
    srcrev = re.search(r'^SRCREV = "([^"]*)"$', text, re.MULTILINE)
    uri = re.search(r'^SRC_URI = "(git://[^"]*)"$', text, re.MULTILINE)
    if not srcrev or not uri:
        raise ValueError(f"{GIT_RECIPE.name}: no SRCREV or git:// SRC_URI line")
    return srcrev.group(1), uri.group(1)


def git(cwd, *args, check=True):
    return subprocess.run(["git", "-c", "init.defaultBranch=unused", *args], cwd=cwd,
                          capture_output=True, text=True, check=check)


_replayed: dict[tuple[str, str, bool], str | None] = {}


def replay_fetch(url: str, srcrev: str, autorev: bool, work: Path, source: Path) -> str | None:
    """Memoised: the board files share the common include, so usually the same URL."""
    key = (url, srcrev, autorev)
    if key not in _replayed:
        clonedir = work / f"clone-{len(_replayed)}"
        _replayed[key] = _replay_fetch(url, srcrev, autorev, clonedir, source)
    return _replayed[key]


def _replay_fetch(url: str, srcrev: str, autorev: bool, clonedir: Path, source: Path) -> str | None:
    """bitbake's git fetcher (2.18, lib/bb/fetch2/git.py: urldata_init, download, _contains_ref,
    _latest_revision) for url into a fresh clone directory: None if it would fetch the
    revision, else its error."""
    path, *params = url[len("git://"):].split(";")
    parm = dict(p.split("=", 1) for p in params if "=" in p)
    path = str(source)  # the kas expression's path, redirected to the detached copy
    if parm.get("protocol") != "file":
        return f"protocol is {parm.get('protocol')!r}, not file: the kas build would leave the checkout"
    nobranch = parm.get("nobranch", "0") == "1"
    usehead = parm.get("usehead", "0") == "1"
    if usehead:
        nobranch = True
    branch = parm.get("branch", "")
    if not branch and not nobranch:
        return "ParameterError: no branch parameter and no nobranch=1"
    repourl = f"file://{path}"
    if autorev:
        # _latest_revision: ls-remote, then HEAD (usehead) or refs/heads/<branch>, refs/tags/...
        out = git(source, "ls-remote", repourl, check=False).stdout
        refs = dict(reversed(line.split("\t", 1)) for line in out.splitlines() if "\t" in line)
        if usehead:
            wanted = ["HEAD"]
        else:
            wanted = [f"refs/heads/{branch}", f"refs/tags/{branch}^{{}}", f"refs/tags/{branch}"]
        rev = next((refs[w] for w in wanted if w in refs), None)
        if rev is None:
            return f"FetchError: Unable to resolve '{'HEAD' if usehead else branch}' in git ls-remote output"
    else:
        rev = srcrev
    # download(): `objects` of a checkout is not a directory (it is .git/objects), so the URL
    # stays file://, as with the kas path.
    git(source, "clone", "--bare", "--mirror", repourl, str(clonedir))

    def contains_ref() -> bool:
        if nobranch:
            cmd = f"git log --pretty=oneline -n 1 {shlex.quote(rev)} -- 2> /dev/null | wc -l"
        else:
            cmd = (f"git branch --contains {shlex.quote(rev)} --list {shlex.quote(branch)} "
                   "2> /dev/null | wc -l")
        out = subprocess.run(cmd, shell=True, cwd=clonedir, capture_output=True, text=True).stdout
        return out.split()[0] != "0"

    if not contains_ref():
        # clonedir_need_update: fetch again, with the refspecs the fetcher uses, and recheck.
        refspecs = ["refs/*:refs/*"] if nobranch else ["refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*"]
        git(clonedir, "fetch", "-f", repourl, *refspecs, check=False)
        if not contains_ref():
            return f"FetchError: Unable to find revision {rev} in branch {branch} even from upstream"
    return None


def check_detached_fetch(config_path: Path, work: Path) -> list[str]:
    from kas.includehandler import IncludeHandler

    config, _ = IncludeHandler([str(config_path)], use_lock=False).get_config()
    local_conf = "\n".join(config.get("local_conf_header", {}).values())
    try:
        repo = laya_edge_repo(local_conf)
        srcrev, uri = recipe_srcrev_and_uri()
    except (ValueError, KeyError) as e:
        return [str(e)]
    problems = []
    repo_path = repo.split(";", 1)[0]
    if Path(repo_path) != REPO_ROOT:
        problems.append(f"LAYA_EDGE_REPO's path is {repo_path}, not the checkout the layer is in ({REPO_ROOT})")
    url = uri.replace("${LAYA_EDGE_REPO}", repo)

    # A detached checkout: HEAD's commit and history, no branch, no tag, no remote ref.
    detached = work / "detached"
    if git(REPO_ROOT, "rev-parse", "--git-dir", check=False).returncode != 0:
        print(f"check_kas: {config_path.name}: SKIPPED the detached fetch: not a git checkout")
        return problems
    if not detached.exists():
        git(work, "init", "-q", str(detached))
        head = git(REPO_ROOT, "rev-parse", "HEAD").stdout.strip()
        # --update-shallow: from a shallow clone (CI), take its shallow boundary along.
        git(detached, "fetch", "-q", "--update-shallow", str(REPO_ROOT), head)
        git(detached, "update-ref", "--no-deref", "HEAD", head)
        if git(detached, "for-each-ref").stdout.strip():
            problems.append("internal: the detached copy has refs")
    if git(detached, "cat-file", "-e", f"{srcrev}^{{commit}}", check=False).returncode != 0:
        # pin_srcrev.py --check reports this (shallow clone, or a commit not in HEAD's history).
        print(f"check_kas: {config_path.name}: SKIPPED the detached fetch of the pinned SRCREV: "
              f"{srcrev[:12]} is not in HEAD's history here (see pin_srcrev.py --check)")
    else:
        err = replay_fetch(url, srcrev, False, work, detached)
        if err:
            problems.append(f"from a detached checkout, fetching SRCREV {srcrev[:12]} of {url} fails: {err}")
    if "usehead=1" in url:
        err = replay_fetch(url, srcrev, True, work, detached)
        if err:
            problems.append(f"from a detached checkout, AUTOREV with usehead=1 fails: {err}")
    # The control: the URL as it was before the fix (a branch, no usehead/nobranch) must fail
    # from the same checkout, or this replay no longer tells the two apart.
    unfixed = re.sub(r";(usehead|nobranch)=1", "", url)
    if git(detached, "cat-file", "-e", f"{srcrev}^{{commit}}", check=False).returncode == 0 and \
            replay_fetch(unfixed, srcrev, False, work, detached) is None:
        problems.append(f"the replay fetches {unfixed} from a detached checkout too: it no longer "
                        "reproduces finding 6, so it proves nothing about the fix")
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
                if not problems:
                    fetch_work = Path(work, "fetch")
                    fetch_work.mkdir(exist_ok=True)
                    problems = check_detached_fetch(path.resolve(), fetch_work)
            except Exception as e:  # kas reports schema errors as exceptions of its own
                problems = [f"{type(e).__name__}: {e}"]
            if problems:
                failed = True
                for p in problems:
                    print(f"check_kas: {rel}: {p}", file=sys.stderr)
            else:
                print(f"check_kas: {rel}: ok (schema, layers, branches, pinned commits, local.conf "
                      "lines; laya-edge fetches from a detached checkout)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
