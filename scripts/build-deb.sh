#!/usr/bin/env bash
# Builds a Debian package of vramscope: the three programs, the shim, the systemd units and the
# LICENSE, as `meson install` lays them out, with dependencies found by dpkg-shlibdeps.
#
#   bash scripts/build-deb.sh [--no-build] [--compression=TYPE] [BUILD_DIR [OUT_DIR]]
#
# BUILD_DIR (default build-deb) is set up with --prefix=/usr if it does not exist; an existing
# one is packaged with whatever prefix it has (tests/package uses the test build's). Only the
# installed targets are built (--no-build: none, they must be built already). The .deb goes to
# OUT_DIR (default .); its path is printed last. --compression is dpkg-deb's -Z (xz, the
# default; gzip, zstd or none): tests/package packages sanitizer builds of several hundred MB,
# which xz takes minutes to compress, and uses none.
set -euo pipefail
no_build=0
compression=xz
while [ $# -gt 0 ]; do
  case $1 in
    --no-build) no_build=1 ;;
    --compression=*) compression=${1#--compression=} ;;
    *) break ;;
  esac
  shift
done
case $compression in
  xz | gzip | zstd | none) ;;
  *) echo "build-deb.sh: --compression must be xz, gzip, zstd or none, not '$compression'" >&2; exit 2 ;;
esac
build=${1:-build-deb}
out=${2:-.}
cd "$(dirname "$0")/.."
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" --prefix=/usr --buildtype=release -Db_ndebug=if-release \
    -Dexamples=disabled -Dbenchmarks=disabled >/dev/null
fi
version=$(meson introspect "$build" --projectinfo |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
if [ $no_build -eq 0 ]; then
  targets=$(meson introspect "$build" --targets | python3 -c '
import json, os, sys
for t in json.load(sys.stdin):
    if t.get("installed"):
        for f in t["filename"]:
            print(os.path.relpath(f, sys.argv[1]))' "$build")
  # shellcheck disable=SC2086
  ninja -C "$build" $targets >/dev/null
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
DESTDIR="$stage/root" meson install -C "$build" --no-rebuild --quiet
arch=$(dpkg --print-architecture)
# dpkg-shlibdeps reads debian/control from the current directory.
mkdir -p "$stage/src/debian"
printf 'Source: vramscope\n\nPackage: vramscope\nArchitecture: any\n' >"$stage/src/debian/control"
mapfile -t elves < <(find "$stage/root" -type f \( -perm -u+x -o -name '*.so*' \) -exec sh -c \
  'head -c 4 "$1" | grep -q ELF && echo "$1"' _ {} \;)
depends=$(cd "$stage/src" && dpkg-shlibdeps -O "${elves[@]}" 2>/dev/null |
  sed -n 's/^shlibs:Depends=//p')
mkdir -p "$stage/root/DEBIAN"
cat >"$stage/root/DEBIAN/control" <<CONTROL
Package: vramscope
Version: $version
Architecture: $arch
Installed-Size: $(du -sk "$stage/root" | cut -f1)
Maintainer: vramscope developers <vramscope@localhost>
Depends: $depends
Section: devel
Priority: optional
Homepage: https://github.com/vramscope/vramscope
Description: GPU memory profiler and pooled allocator for unmodified CUDA programs
 vramscope is loaded into a CUDA program with LD_PRELOAD (or started by
 "vramscope run"): it serves the program's device allocations from a pooled
 caching allocator, records every allocation, free and NVTX range, and
 reports peak, reserved versus allocated memory and fragmentation. The agent
 and collector daemons stream the events of every process on a node to a
 central collector; "vramscope top", "report" and "check" read it.
CONTROL
mkdir -p "$out"
deb="$out/vramscope_${version}_${arch}.deb"
dpkg-deb --root-owner-group "-Z$compression" --build "$stage/root" "$deb" >/dev/null
echo "$deb"
