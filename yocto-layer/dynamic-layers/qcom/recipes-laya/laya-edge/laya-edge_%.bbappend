# meta-qcom boards: build the QNN backend and let the service reach the Hexagon NPU.
#
# Only on aarch64 qcom machines: meta-qcom's qairt-sdk and fastrpc recipes are
# COMPATIBLE_MACHINE:aarch64 only, so on its 32-bit qcom-armv7a machine nothing provides them
# and a QNN laya-edge would have no buildable provider; there the agent builds with its CPU
# backend alone. Undo QNN on any machine in local.conf:
#   PACKAGECONFIG:remove:pn-laya-edge = "qnn"
# (everything below follows PACKAGECONFIG: the runtime dependencies and the drop-in.)
#
# Package names and paths below are meta-qcom's (wrynose branch): qairt-sdk and its
# qairt-sdk-hexagon-v68 package (recipes-ml/qairt), fastrpc (recipes-support/fastrpc), the
# dmaheap group (recipes-core/systemd). The agent dlopen()s the QNN libraries at run time,
# so they are runtime dependencies only.

FILESEXTRAPATHS:prepend:qcom := "${THISDIR}/files:"

SRC_URI:append:qcom = " file://qnn.conf"

PACKAGECONFIG:append:qcom:aarch64 = " qnn"
PACKAGECONFIG[qnn] = "--features qnn,,,qairt-sdk fastrpc"

# Hexagon skeletons per SoC. qairt-sdk installs the V68 ones (QCS6490/QCM6490, e.g.
# rb3gen2-core-kit) in this directory for every qcm6490 board; add other SoCs here.
LAYA_ADSP_LIBRARY_PATH ??= ""
LAYA_ADSP_LIBRARY_PATH:qcm6490 = "${datadir}/qcom/qcm6490/Thundercomm/RB3gen2/dsp/cdsp"

# The drop-in depends on the SoC, so the package does too. On every qcom machine, not only
# those with QNN: the qcom overrides above (SRC_URI, do_install) change the recipe there, and a
# package that differs between machines of one tune must not share that tune's feed.
PACKAGE_ARCH:qcom = "${MACHINE_ARCH}"

RDEPENDS:${PN}:append:qcm6490 = " ${@bb.utils.contains('PACKAGECONFIG', 'qnn', 'qairt-sdk-hexagon-v68', '', d)}"

do_install:append:qcom() {
    if ${@bb.utils.contains('PACKAGECONFIG', 'qnn', 'true', 'false', d)}; then
        install -d ${D}${systemd_system_unitdir}/laya-edge.service.d
        install -m 0644 ${UNPACKDIR}/qnn.conf ${D}${systemd_system_unitdir}/laya-edge.service.d/qnn.conf
        if [ -n "${LAYA_ADSP_LIBRARY_PATH}" ]; then
            sed -i -e 's,@ADSP_LIBRARY_PATH@,${LAYA_ADSP_LIBRARY_PATH},' \
                ${D}${systemd_system_unitdir}/laya-edge.service.d/qnn.conf
        else
            sed -i -e '/@ADSP_LIBRARY_PATH@/d' ${D}${systemd_system_unitdir}/laya-edge.service.d/qnn.conf
        fi
    fi
}
