# Cross-building dserve for 64-bit ARM (Kunpeng 920, Graviton, Ampere) on an x86
# Debian 12 machine: Debian's g++-aarch64-linux-gnu against the arm64 libraries that
# multiarch installs under /usr/lib/aarch64-linux-gnu (`make build-arm64` installs
# both). Tests run through tools/qemu_arm64.sh, so `ctest` in the build tree runs them
# under qemu-aarch64.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR ${CMAKE_CURRENT_LIST_DIR}/../tools/qemu_arm64.sh)

# Only the arm64 .pc files (PKG_CONFIG_PATH may add more, e.g. the oniguruma one that
# cannot be co-installed with the amd64 package; see the Makefile).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
