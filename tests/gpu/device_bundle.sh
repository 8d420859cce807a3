#!/usr/bin/env bash
# Gathers programs and libraries to carry to a GPU machine that lacks this machine's libraries.
#   bash tests/gpu/device_bundle.sh OUTDIR FILE...
# Copies each FILE into OUTDIR/bin/ and every shared library it loads (ldd) into OUTDIR/lib/,
# except the C runtime (libc, libm, libstdc++, libgcc_s, the loader) and the CUDA driver
# (libcuda, libnvidia-*): the GPU machine has its own, newer copies, and a second copy of the
# driver or the C library would break it. There, run with LD_LIBRARY_PATH=OUTDIR/lib.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: device_bundle.sh OUTDIR FILE..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out/bin" "$out/lib"
for file in "$@"; do
  cp -L "$file" "$out/bin/"
  ldd "$file" | awk '/=>/ && $3 ~ /^\// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libstdc++.so* | \
        libgcc_s.so* | libcuda.so* | libnvidia*) ;;
      *) cp -L -n "$lib" "$out/lib/" ;;
    esac
  done
done
echo "device_bundle: $(du -sh "$out" | cut -f1) in $out"
