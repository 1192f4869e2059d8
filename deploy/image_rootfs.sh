#!/usr/bin/env bash
# deploy/image_rootfs.sh OUT BINARY... — assembles the root file system of a dipaco image in
# OUT: the given binaries in /opt/dipaco/bin (worker image: dipaco-worker and dipacoctl;
# coordinator image: dipaco-coordinator and dipacoctl) and exactly the shared libraries they
# load (the dynamic loader's closure as ldd reports it, copied with their contents under
# /usr/lib, Debian's merged-/usr layout: /lib and /lib64 are links into it), plus /etc/passwd
# and /etc/group naming the unprivileged user dipaco (uid/gid 10001), /etc/nsswitch.conf (host
# names from /etc/hosts, then DNS) and the empty mount points a container runtime fills
# (/dev, /proc, /sys, /tmp, /run, /data, /var/lib/dipaco). Nothing else: no shell, no package manager.
# deploy/Containerfile.worker and deploy/Containerfile.coordinator copy this tree into a
# `FROM scratch` image, so the image is this directory; tests/deploy/worker_image.sh runs the
# worker from it with unshare + chroot.
#
# For the CUDA plugin, pass lib/dipaco/libdipaco-cuda.so as a BINARY too: it is put beside
# bin/ (/opt/dipaco/lib/dipaco/) where dipaco-worker looks for it, and its libraries (cuBLAS,
# the CUDA runtime) are copied the same way; libcuda.so.1 belongs to the driver, which the
# GPU container runtime mounts, and is left out.
# Needs bash, coreutils and ldd (Debian libc-bin). OUT must be absent or empty.
set -euo pipefail

die() { echo "image_rootfs: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: image_rootfs.sh OUT BINARY..."
OUT=$1; shift
if [ -e "$OUT" ] && [ -n "$(ls -A "$OUT")" ]; then die "$OUT is not empty"; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# Debian's merged /usr: /lib, /lib64 and /bin-less; libraries live under /usr/lib*.
mkdir -p "$OUT/usr/lib" "$OUT/usr/lib64" "$OUT/opt/dipaco/bin" "$OUT/opt/dipaco/lib/dipaco" "$OUT/etc"
ln -s usr/lib "$OUT/lib"
ln -s usr/lib64 "$OUT/lib64"

# The path a library gets in the image: /lib/... and /lib64/... as /usr/lib/..., /usr/lib64/...
image_path() {
  case "$1" in
    /lib/* | /lib64/*) echo "/usr$1" ;;
    /usr/*) echo "$1" ;;
    *) die "library outside /usr/lib and /lib: $1" ;;
  esac
}

declare -A copied=()
add_library() {
  local src=$1 dst
  dst=$(image_path "$src")
  [ -n "${copied[$dst]:-}" ] && return 0
  copied[$dst]=1
  mkdir -p "$OUT$(dirname "$dst")"
  cp -L --preserve=mode "$src" "$OUT$dst" # the file's contents, not the link (alternatives)
}

# The libraries one ELF file loads: every "name => /path (addr)" line and the loader line.
add_libraries_of() {
  local f=$1 out line lib
  out=$(ldd "$f" 2>&1) || die "ldd $f: $out"
  if grep -q "not found" <<<"$out"; then die "$f: missing libraries: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"; fi
  while IFS= read -r line; do
    lib=""
    case "$line" in
      *"=> /"*) lib=${line#*=> }; lib=${lib%% (*} ;;
      *linux-vdso* | *"=> not found"*) ;;
      /*) lib=${line%% (*} ;;
      [[:space:]]/*) lib=${line#"${line%%[![:space:]]*}"}; lib=${lib%% (*} ;;
    esac
    # The GPU driver's own library comes from the host at run time (NVIDIA container runtime).
    case "$lib" in "" | */libcuda.so.1) continue ;; esac
    add_library "$lib"
  done <<<"$out"
}

for bin in "$@"; do
  [ -f "$bin" ] || die "$bin: no such file"
  case "$(basename "$bin")" in
    lib*.so*) install -m 0755 "$bin" "$OUT/opt/dipaco/lib/dipaco/$(basename "$bin")" ;;
    *) install -m 0755 "$bin" "$OUT/opt/dipaco/bin/$(basename "$bin")" ;;
  esac
  add_libraries_of "$bin"
done

# Accounts (the image runs as dipaco, uid 10001), name resolution, mount points.
printf 'root:x:0:0:root:/nonexistent:/usr/sbin/nologin\ndipaco:x:10001:10001:dipaco worker:/nonexistent:/usr/sbin/nologin\n' >"$OUT/etc/passwd"
printf 'root:x:0:\ndipaco:x:10001:\n' >"$OUT/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$OUT/etc/nsswitch.conf"
chmod 0644 "$OUT/etc/passwd" "$OUT/etc/group" "$OUT/etc/nsswitch.conf"
mkdir -p "$OUT/dev" "$OUT/proc" "$OUT/sys" "$OUT/run" "$OUT/data" "$OUT/tmp" "$OUT/var/lib/dipaco"
chmod 1777 "$OUT/tmp"
chmod 0700 "$OUT/var/lib/dipaco" # the coordinator's state (a volume), owned by dipaco
if [ "$(id -u)" = 0 ]; then chown 10001:10001 "$OUT/var/lib/dipaco"; fi

n=$(find "$OUT/usr" -type f | wc -l)
echo "image_rootfs: $OUT: $# binaries, $n libraries, $(du -sh "$OUT" | cut -f1)"
