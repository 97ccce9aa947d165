# laya-edge from the tip of its main branch. A release recipe (laya-edge_<version>.bb) is
# preferred when one is buildable; select this one with
#   PREFERRED_VERSION_laya-edge = "0.1.0+git"
# and pin it for a reproducible image with SRCREV:pn-laya-edge = "<commit>".
PV = "0.1.0+git"
SRC_URI = "git://${LAYA_EDGE_REPO};branch=main"
# Following main is what this recipe is for; releases are pinned in laya-edge_<version>.bb.
# nooelint: oelint.vars.autorev
SRCREV = "${AUTOREV}"

DEFAULT_PREFERENCE = "-1"

require laya-edge.inc
require ${BPN}-crates.inc
