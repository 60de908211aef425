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
command -v node >/dev/null || { echo "error: Node.js 20.10 or newer is needed (node not on PATH)" >&2; exit 2; }
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 10) ? 0 : 1)' \
  || { echo "error: Node.js 20.10 or newer is needed, this is $(node --version)" >&2; exit 2; }
mapfile -t pkgs < <(node -e 'const l = require("./src/host/tools.json"); console.log([...new Set(l.filter((t) => t.install !== false).map((t) => t.package).filter(Boolean))].join("\n"))')
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
echo "== build (TypeScript, the CLI bundle, the agent and the snaplab command)"
npm run build
# `snaplab` on PATH: a link to this checkout's command (native/build/snaplab: exec's fast path in
# C, the Node CLI for the rest), not `npm link`, which would write into npm's global prefix; one
# visible link that `rm /usr/local/bin/snaplab` undoes, and set-up from another checkout moves
echo "== /usr/local/bin/snaplab -> $PWD/native/build/snaplab"
ln -sfn "$PWD/native/build/snaplab" /usr/local/bin/snaplab
hash -r
# the VM driver's guest kernel (apt) and initramfs, now rather than at the first VM
echo "== snaplab prepare --driver qemu"
if ! snaplab prepare --driver qemu; then
  echo "error: the VM driver could not be prepared (see above); fix it and run this script again" >&2
  exit 1
fi

if [ "${1:-}" = "--demo" ]; then
  echo "== snaplab doctor"
  snaplab doctor
  echo "== snaplab demo"
  snaplab demo
fi
