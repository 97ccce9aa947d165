SUMMARY = "Rockchip RKNN runtime (librknnrt), prebuilt"
DESCRIPTION = "Rockchip's user-space runtime for the NPU of the RK3562, RK3566/RK3568, \
               RK3576 and RK3588, from the rknn-toolkit2 release. It is installed in a \
               versioned directory outside the linker path, so that it never replaces or \
               shadows a librknnrt.so the BSP already ships; laya-edge dlopen()s it by path."
HOMEPAGE = "https://github.com/airockchip/rknn-toolkit2"
SECTION = "libs"

# Rockchip's own terms, not an open-source licence. At v2.3.2 the repository's LICENSE is a
# short copyright statement (software provided as-is); it grants no explicit right to
# redistribute. The RKNN SDK License that replaced it on master in July 2025 allows
# redistribution only for applications compatible with Rockchip products. Read both before
# shipping an image; building needs LICENSE_FLAGS_ACCEPTED += "rockchip-rknn".
LICENSE = "Rockchip-RKNN"
LIC_FILES_CHKSUM = "file://LICENSE;md5=a2399e2538b7ebeac89b5b1cc648459a"
NO_GENERIC_LICENSE[Rockchip-RKNN] = "LICENSE"
LICENSE_FLAGS = "rockchip-rknn"
# Shown with the "restricted license" skip message where the flag is not accepted.
LICENSE_FLAGS_DETAILS[rockchip-rknn] = "librknnrt is Rockchip's prebuilt runtime under Rockchip's \
own terms; read the notes in meta-laya's librknnrt_2.3.2.bb before accepting them. Without it \
laya-edge still builds, with no RKNN runtime in the image (see the meta-laya README)."

# v2.3.2 is a lightweight tag on master; the repository carries Python wheels and examples
# for every release, so fetch only this commit.
SRC_URI = "git://github.com/airockchip/rknn-toolkit2.git;protocol=https;branch=master;tag=v${PV}"
SRCREV = "42aa1d426c0a9e0869b6374edba009f7208a1926"
BB_GIT_SHALLOW = "1"

# The Linux aarch64 build is the only one installed.
COMPATIBLE_HOST = "aarch64.*-linux"

LIBRKNNRT_DIR = "${libdir}/librknnrt-${PV}"

do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install() {
    install -d ${D}${LIBRKNNRT_DIR}
    install -m 0755 ${S}/rknpu2/runtime/Linux/librknn_api/aarch64/librknnrt.so ${D}${LIBRKNNRT_DIR}/librknnrt.so
}

# Not a shared-library provider for other packages: nothing links against this copy, and a
# BSP's own librknnrt.so must keep that role.
PRIVATE_LIBS = "librknnrt.so"

# Prebuilt and already stripped by Rockchip: nothing to strip or split.
INHIBIT_PACKAGE_STRIP = "1"
INHIBIT_PACKAGE_DEBUG_SPLIT = "1"

FILES:${PN} += "${LIBRKNNRT_DIR}"

# QA checks that cannot hold for a binary built elsewhere: it comes stripped
# (already-stripped) and was not linked with this build's LDFLAGS, e.g. its hash style
# (ldflags).
# nooelint: oelint.vars.insaneskip
INSANE_SKIP:${PN} = "already-stripped ldflags"
