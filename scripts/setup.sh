#!/usr/bin/env bash
# Set up snaplab on Debian 12 (as root): Debian packages, npm dependencies, the TypeScript
# build and the in-sandbox agent. With --demo, run the demo on the embedded default afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "error: run as root (snaplab makes namespaces, mounts and cgroups)" >&2
  exit 2
fi

# bubblewrap: the namespace launcher; busybox-static: the built-in image; btrfs-progs: CoW storage;
# gcc, make, libc6-dev, libseccomp-dev: the static agent; iproute2, zstd, xz-utils: tests and image import.
pkgs=(bubblewrap busybox-static btrfs-progs gcc make libc6-dev libseccomp-dev iproute2 zstd xz-utils util-linux qemu-system-x86 qemu-utils e2fsprogs lz4 cpio)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

echo "== npm ci"
npm ci --no-audit --no-fund
echo "== build (TypeScript and the agent)"
npm run build
# the VM driver's guest kernel (apt) and initramfs, now rather than at the first VM
echo "== snaplab prepare --driver qemu"
npx --no-install snaplab prepare --driver qemu || echo "warning: the VM driver could not be prepared; the first VM will try again" >&2

if [ "${1:-}" = "--demo" ]; then
  echo "== snaplab doctor"
  npx --no-install snaplab doctor
  echo "== snaplab demo"
  npx --no-install snaplab demo
fi
