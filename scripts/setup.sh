#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine with rustup, Node 20 and npm
# (registries only), then builds the package. Idempotent: each step is skipped when done.
#   scripts/setup.sh            toolchain + npm deps + build (wasm and TypeScript)
#   scripts/setup.sh --browser  also Debian's chromium (browser tests)
#   scripts/setup.sh --www      also the demo page's npm deps (www/)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
# shellcheck source=scripts/model/common.sh
. scripts/model/common.sh
want_browser=0 want_www=0
for arg in "$@"; do
  case "$arg" in
    --browser) want_browser=1 ;;
    --www) want_www=1 ;;
    *) die "unknown argument $arg (setup.sh [--browser] [--www])" ;;
  esac
done

if ! command -v rustup >/dev/null || ! command -v cargo >/dev/null; then
  die "rustup and cargo are needed (not on PATH, nor in $_cargo_bin)"
fi
command -v npm >/dev/null || die "npm is needed (it comes with Node.js 20)"
node_major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
[ "$node_major" -ge 20 ] ||
  die "Node.js 20 or newer is needed; found $(node --version 2>/dev/null || echo 'no node on PATH')"

log "rust: wasm32 target"
rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

# wasm-bindgen-cli must equal the wasm-bindgen crate in Cargo.lock exactly. `--locked` fails
# (a pinned dependency of the CLI is missing from the index), so it resolves afresh (~8 min once).
bindgen_version="$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/version = |"/,""); print; exit}' Cargo.lock)"
if ! wasm-bindgen --version 2>/dev/null | grep -q " ${bindgen_version}\$"; then
  log "installing wasm-bindgen-cli ${bindgen_version}"
  cargo install wasm-bindgen-cli --version "${bindgen_version}" --force
  wasm-bindgen --version 2>/dev/null | grep -q " ${bindgen_version}\$" ||
    die "installed wasm-bindgen-cli ${bindgen_version} in $_cargo_bin, but the wasm-bindgen first on PATH ($(command -v wasm-bindgen)) is $(wasm-bindgen --version): put $_cargo_bin before it"
fi

if [ "$want_browser" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  log "installing Debian chromium for browser tests"
  apt_install_recommends chromium
fi

# npm ci, skipped while node_modules holds what it installed from the same package.json and
# lock under the same Node ABI (a fresh clone has none, so CI always installs).
npm_ci() {
  local dir="$1" want stamp="$1/node_modules/.crucible-npm-ci"
  want="$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -d' ' -f1) abi=$(node -p process.versions.modules)"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "$dir/node_modules: up to date" >&2
    return 0
  fi
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  printf '%s\n' "$want" >"$stamp"
}

log "npm dependencies"
npm_ci npm
if [ "$want_www" = 1 ]; then npm_ci www; fi

log "building wasm (cached by source hash) and TypeScript"
# Clones share the target dir: a build of other sources in between this one's cargo build and
# its wasm-bindgen step would have this one read, and cache under its key, the other's wasm.
mkdir -p "$CARGO_TARGET_DIR"
(cd npm && flock "$CARGO_TARGET_DIR/.crucible-wasm-build.lock" npm run --silent build:wasm)
(cd npm && npm run --silent build:ts)
