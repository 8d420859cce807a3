#!/usr/bin/env bash
# The Debian package, as a user gets it: scripts/build-deb.sh packages this build, dpkg installs
# it into an empty root (a fresh dpkg database, as in a new container; the libraries it depends
# on come from the machine, so --force-depends), and the installed files work from there:
# `--version` of the three programs, their man pages and bash/zsh completions, a replay of a
# bundled trace, `vramscope run` finding the installed shim, the systemd units pointing at the installed binaries and passing
# `systemd-analyze verify`, the LICENSE, and dpkg's own record of the package and its Depends.
#   tests/package/package_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# Uncompressed: the sanitizer build's programs weigh several hundred MB, which xz (the default)
# takes minutes to compress; the package is the same otherwise.
deb=$(bash "$source_dir/scripts/build-deb.sh" --no-build --compression=none "$build" "$work/out" | tail -1)
[ -f "$deb" ] || fail "build-deb.sh made no package"

root=$work/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/log"
touch "$root/var/lib/dpkg/status"
force=(--force-depends)
[ "$(id -u)" -eq 0 ] || force+=(--force-not-root --force-bad-path)
dpkg --root="$root" "${force[@]}" -i "$deb" >"$work/dpkg.log" 2>&1 || {
  cat "$work/dpkg.log"
  fail "dpkg -i"
}
dpkg --root="$root" -s vramscope | grep -q '^Status: install ok installed' ||
  fail "dpkg does not record vramscope as installed"
depends=$(dpkg --root="$root" -s vramscope | sed -n 's/^Depends: //p')
for lib in libc6 libgrpc++ libprotobuf libabsl; do
  [[ "$depends" == *"$lib"* ]] || fail "Depends lacks $lib: $depends"
done

prefix=$(meson introspect "$build" --buildoptions |
  python3 -c 'import json, sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "prefix"))')
bin=$root$prefix/bin
version=$(meson introspect "$build" --projectinfo |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["version"])')
for program in vramscope vramscope-agent vramscope-collector; do
  out=$("$bin/$program" --version) || fail "$program --version exited $?"
  [ "$out" = "$program $version" ] || fail "$program --version said '$out'"
done

# A bundled trace replays through the installed binary.
trace=$(find "$source_dir/traces" -name '*.csv*' | sort | head -1)
[ -n "$trace" ] || fail "no bundled trace"
"$bin/vramscope" replay "$trace" >"$work/replay.txt" 2>&1 || {
  cat "$work/replay.txt"
  fail "replay of $trace"
}
grep -q 'reserved' "$work/replay.txt" || fail "replay printed no figures"

# `vramscope run` finds the shim where the package put it (<prefix>/lib/...), with no
# VRAMSCOPE_SHIM and no build tree next to it.
shim=$(find "$root$prefix/lib" -name libvramscope.so | head -1)
[ -n "$shim" ] || fail "no libvramscope.so in the package"
env -u VRAMSCOPE_SHIM "$bin/vramscope" run --json "$work/run.json" -- /bin/true \
  >"$work/run.txt" 2>&1 || {
  cat "$work/run.txt"
  fail "vramscope run from the package"
}
grep -q '"reports"' "$work/run.json" || fail "run wrote no report"

for unit in vramscope-agent vramscope-collector; do
  file=$root$prefix/lib/systemd/system/$unit.service
  [ -f "$file" ] || fail "no $unit.service"
  grep -q "^ExecStart=$prefix/bin/$unit " "$file" || fail "$unit.service runs another binary"
  for key in NoNewPrivileges=yes ProtectSystem=strict ProtectHome=yes UMask=0077; do
    grep -q "^$key" "$file" || fail "$unit.service lacks $key"
  done
  if command -v systemd-analyze >/dev/null && [ -d /lib/systemd/system ]; then
    # The units it starts after and is wanted by (sysinit.target, network.target, ...): the
    # machine's, beside the package's in the root.
    mkdir -p "$root/lib/systemd/system"
    cp -an /lib/systemd/system/. "$root/lib/systemd/system/" 2>/dev/null || true
    # Unknown keys are only warned about: any word from it fails.
    if ! systemd-analyze verify --man=no --root="$root" "$file" >"$work/verify.txt" 2>&1 ||
      [ -s "$work/verify.txt" ]; then
      cat "$work/verify.txt"
      fail "systemd-analyze verify $unit.service"
    fi
  fi
done
grep -q 'Apache License' "$root$prefix/share/doc/vramscope/LICENSE" || fail "no LICENSE"

# The man pages and completions generated from each program's flags (lib/cli).
for program in vramscope vramscope-agent vramscope-collector; do
  page=$root$prefix/share/man/man1/$program.1
  [ -s "$page" ] || fail "no man page $program.1"
  grep -q '^\.TH ' "$page" || fail "$program.1 is not a man page"
  grep -q -- '\\-\\-version' "$page" || fail "$program.1 does not list --version"
  completion=$root$prefix/share/bash-completion/completions/$program
  [ -s "$completion" ] || fail "no bash completion for $program"
  bash -n "$completion" || fail "the bash completion of $program does not parse"
  zsh_completion=$root$prefix/share/zsh/vendor-completions/_$program
  grep -q "^#compdef $program\$" "$zsh_completion" || fail "no zsh completion for $program"
done
echo "ok: $(basename "$deb") installs and runs ($(dpkg-deb -f "$deb" Installed-Size) KiB)"
