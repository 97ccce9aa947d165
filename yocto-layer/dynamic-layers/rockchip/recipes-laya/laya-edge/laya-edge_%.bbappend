# meta-rockchip boards with an RKNPU (RK3588/RK3588S): build the RKNN backend and let the
# service reach the NPU. The agent dlopen()s librknnrt from $RKNN_LIB at run time, so the
# runtime is a runtime dependency only (librknnrt_2.3.2.bb in this dynamic layer).
#
# librknnrt needs Rockchip's rknpu kernel driver (vendor BSP kernels). meta-rockchip's
# default linux-yocto kernel drives the NPU with the mainline "rocket" accel driver instead,
# which librknnrt does not support: on such an image the agent falls back to its CPU backend.

FILESEXTRAPATHS:prepend:rk3588s := "${THISDIR}/files:"

SRC_URI:append:rk3588s = " file://rknn.conf"

PACKAGECONFIG:append:rk3588s = " rknn"
PACKAGECONFIG[rknn] = "--features rknn,,,librknnrt"

# Keep in step with the librknnrt recipe's version (its install directory).
LAYA_RKNN_LIB ??= "${libdir}/librknnrt-2.3.2/librknnrt.so"

# The drop-in is only installed on RKNPU SoCs, so the package depends on the machine.
PACKAGE_ARCH:rk3588s = "${MACHINE_ARCH}"

do_install:append:rk3588s() {
    if ${@bb.utils.contains('PACKAGECONFIG', 'rknn', 'true', 'false', d)}; then
        install -d ${D}${systemd_system_unitdir}/laya-edge.service.d
        install -m 0644 ${UNPACKDIR}/rknn.conf ${D}${systemd_system_unitdir}/laya-edge.service.d/rknn.conf
        sed -i -e 's,@RKNN_LIB@,${LAYA_RKNN_LIB},' ${D}${systemd_system_unitdir}/laya-edge.service.d/rknn.conf
    fi
}
