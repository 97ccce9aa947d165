# meta-rockchip boards with an RKNPU (RK3588/RK3588S): build the RKNN backend and let the
# service reach the NPU. The agent dlopen()s librknnrt from $RKNN_LIB at run time, so the
# runtime is a runtime dependency only (librknnrt_2.3.2.bb in this dynamic layer). Undo RKNN
# in local.conf:
#   PACKAGECONFIG:remove:pn-laya-edge = "rknn"
#
# librknnrt needs Rockchip's rknpu kernel driver (vendor BSP kernels). meta-rockchip's
# default linux-yocto kernel drives the NPU with the mainline "rocket" accel driver instead,
# which librknnrt does not support: on such an image the agent falls back to its CPU backend.

FILESEXTRAPATHS:prepend:rk3588s := "${THISDIR}/files:"

SRC_URI:append:rk3588s = " file://rknn.conf"

PACKAGECONFIG:append:rk3588s = " rknn"
PACKAGECONFIG[rknn] = "--features rknn,,,,${LAYA_RKNN_RUNTIME}"

# librknnrt is under LICENSE_FLAGS = "rockchip-rknn". Where a build has not accepted that flag,
# bitbake skips the librknnrt recipe, and anything that needs it becomes unbuildable: a
# recommendation too, since bitbake resolves RRECOMMENDS like RDEPENDS (taskdata.py) and only
# the rootfs step treats them as optional. So the runtime is recommended only where the flag
# is accepted, exactly as oe.license.check_license_flags() accepts it for librknnrt
# ("rockchip-rknn" or "rockchip-rknn_librknnrt" in LICENSE_FLAGS_ACCEPTED). Elsewhere the agent
# still builds with the rknn feature, without a runtime: the drop-in leaves RKNN_LIB unset, so
# the RKNN backend reports that no librknnrt was given (the CPU backend is unaffected), and the
# image can bring its own librknnrt and set RKNN_LIB in a drop-in of its own. A recommendation,
# not a dependency, so that an image may also leave it out (BAD_RECOMMENDATIONS).
LAYA_RKNN_RUNTIME = "${@'librknnrt' if {'rockchip-rknn', 'rockchip-rknn_librknnrt'} & \
                        set((d.getVar('LICENSE_FLAGS_ACCEPTED') or '').split()) else ''}"

# Keep in step with the librknnrt recipe's version (its install directory).
LAYA_RKNN_LIB ??= "${@'${libdir}/librknnrt-2.3.2/librknnrt.so' if d.getVar('LAYA_RKNN_RUNTIME') else ''}"

# The drop-in is only installed on RKNPU SoCs, so the package depends on the machine.
PACKAGE_ARCH:rk3588s = "${MACHINE_ARCH}"

# The note where the runtime is left out: a parse-time message is the only one a builder sees
# without opening task logs. It only reads variables.
# nooelint: oelint.task.noanonpython
python () {
    if bb.utils.contains('PACKAGECONFIG', 'rknn', True, False, d) and not d.getVar('LAYA_RKNN_RUNTIME'):
        bb.note('laya-edge: RKNN backend built without librknnrt: LICENSE_FLAGS_ACCEPTED does not have '
                '"rockchip-rknn" (see the meta-laya README); RKNN_LIB is left unset in rknn.conf')
}

do_install:append:rk3588s() {
    if ${@bb.utils.contains('PACKAGECONFIG', 'rknn', 'true', 'false', d)}; then
        install -d ${D}${systemd_system_unitdir}/laya-edge.service.d
        install -m 0644 ${UNPACKDIR}/rknn.conf ${D}${systemd_system_unitdir}/laya-edge.service.d/rknn.conf
        if [ -n "${LAYA_RKNN_LIB}" ]; then
            sed -i -e 's,@RKNN_LIB@,${LAYA_RKNN_LIB},' \
                ${D}${systemd_system_unitdir}/laya-edge.service.d/rknn.conf
        else
            sed -i -e '/@RKNN_LIB@/d' ${D}${systemd_system_unitdir}/laya-edge.service.d/rknn.conf
        fi
    fi
}
