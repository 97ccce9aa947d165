# laya-edge from its main branch, pinned to one commit: the recipe bitbake builds by default
# (until a release recipe, laya-edge_<version>.bb, is buildable). Pinned, it parses without
# network access, its fetch is cached in DL_DIR and works under BB_NO_NETWORK, and a build is
# reproducible. SRCREV and PV are written by tools/yocto/pin_srcrev.py, which also checks that
# laya-edge-crates.inc is the crate list of that commit's Cargo.lock; CI checks that SRCREV is a
# commit of this repository's history, and that the agent at that commit has what this layer
# uses: every cargo feature a PACKAGECONFIG option names, a handler for every signal the unit
# sends (tools/yocto/pin_agent.py). Move the pin when the layer starts using something newer.
#
# To follow main instead (AUTOREV: a `git ls-remote` at every parse, nothing cached), opt in
# in local.conf:
#   SRCREV:pn-laya-edge = "${AUTOREV}"
# (see the meta-laya README: the crate list is the layer's, so it matches main only when the
# layer is from the same commit.)
PV = "0.1.0+git"
SRC_URI = "git://${LAYA_EDGE_REPO};branch=main"
SRCREV = "614fb694d11953c849d0b3e9a3caa2826e01ad2e"

# A release recipe, once one is buildable, wins over this one.
DEFAULT_PREFERENCE = "-1"

require laya-edge.inc
require ${BPN}-crates.inc
