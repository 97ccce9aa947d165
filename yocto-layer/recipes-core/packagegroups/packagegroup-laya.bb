SUMMARY = "Laya edge agent for the image"
DESCRIPTION = "Everything an image needs to answer Laya requests on the board: the \
               laya-edge service and, where the build has meta-networking, a local MQTT \
               broker."
HOMEPAGE = "https://example.invalid/laya-edge"
SECTION = "console/network"
LICENSE = "MIT"

inherit packagegroup

# The example configuration talks to a broker on localhost: with meta-networking in the
# build, dynamic-layers/networking-layer adds mosquitto here. Without it, point [mqtt] broker
# in /etc/laya-edge/laya-edge.toml at the site's broker.
RDEPENDS:${PN} = "laya-edge"
