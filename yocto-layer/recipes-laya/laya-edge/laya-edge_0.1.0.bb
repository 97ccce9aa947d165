# laya-edge release 0.1.0.
SRC_URI = "git://${LAYA_EDGE_REPO};branch=main;tag=v${PV}"

# v0.1.0 is not tagged yet, so there is no commit to pin: until there is, this recipe skips
# itself (LAYA_EDGE_SKIP, see laya-edge.inc) and bitbake builds laya-edge_git.bb. On release:
# delete LAYA_EDGE_SKIP, set SRCREV to the commit of tag v0.1.0 (bitbake checks that tag and
# SRCREV agree), and freeze the crate list: copy laya-edge-crates.inc as generated at the tag
# to laya-edge-${PV}-crates.inc and require that below, since laya-edge-crates.inc keeps
# following laya-edge_git.bb's pin.
LAYA_EDGE_SKIP = "laya-edge ${PV} is not released yet; laya-edge_git.bb is built instead"

require laya-edge.inc
require ${BPN}-crates.inc
