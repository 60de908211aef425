#!/usr/bin/env bash
# Set up snaplab on Debian 12 (as root): Debian packages, npm dependencies, the TypeScript
# build and the in-sandbox agent. With --demo, run the demo on the embedded default afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "error: run as root (snaplab makes namespaces, mounts and cgroups)" >&2
  exit 2
fi

# The Debian packages come from the one list of host programs snaplab runs (src/host/tools.json:
# each program, its package, and what needs it), which doctor and the probes check too.
command -v node >/dev/null || { echo "error: Node.js 20 is needed (node not on PATH)" >&2; exit 2; }
mapfile -t pkgs < <(node -e 'const l = require("./src/host/tools.json"); console.log([...new Set(l.filter((t) => t.install !== false).map((t) => t.package))].join("\n"))')
[ ${#pkgs[@]} -gt 0 ] || { echo "error: cannot read the package list src/host/tools.json" >&2; exit 2; }
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
if ! npx --no-install snaplab prepare --driver qemu; then
  echo "error: the VM driver could not be prepared (see above); fix it and run this script again" >&2
  exit 1
fi

if [ "${1:-}" = "--demo" ]; then
  echo "== snaplab doctor"
  npx --no-install snaplab doctor
  echo "== snaplab demo"
  npx --no-install snaplab demo
fi
