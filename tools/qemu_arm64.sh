#!/bin/sh
# Runs an aarch64 binary under user-mode qemu as a given ARM core. The core is
# $DSERVE_QEMU_CPU (default neoverse-n1: ARMv8.2 with dotprod and no SVE, i8mm or BF16,
# a Kunpeng 920 class core); cortex-a72 is an ARMv8.0 core without dotprod. qemu's
# default `max` core has SVE, i8mm and BF16, which Kunpeng lacks, so it is never used.
# The arm64 libraries are Debian's multiarch ones; the loader finds them itself.
exec qemu-aarch64 -cpu "${DSERVE_QEMU_CPU:-neoverse-n1}" "$@"
