#!/usr/bin/env bash
# Installs everything the project needs on a fresh Debian machine with rustup, Node 20 and npm
# (registries only), then builds the package. Idempotent: each step is skipped when done.
#   scripts/setup.sh            toolchain + npm deps + build (wasm and TypeScript)
#   scripts/setup.sh --browser  also Debian's chromium (browser tests)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
want_browser=0
for arg in "$@"; do [ "$arg" = "--browser" ] && want_browser=1; done

# Builds of every clone share one target dir and wasm cache, so repeated runs are cheap.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/crucible/target}"
export CARGO_TERM_COLOR=never
log() { printf '\n== %s\n' "$*" >&2; }

log "rust: wasm32 target"
rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

# wasm-bindgen-cli must equal the wasm-bindgen crate in Cargo.lock exactly. `--locked` fails
# (a pinned dependency of the CLI is missing from the index), so it resolves afresh (~8 min once).
bindgen_version="$(awk '/^name = "wasm-bindgen"$/{getline; gsub(/version = |"/,""); print; exit}' Cargo.lock)"
if ! wasm-bindgen --version 2>/dev/null | grep -q " ${bindgen_version}\$"; then
  log "installing wasm-bindgen-cli ${bindgen_version}"
  cargo install wasm-bindgen-cli --version "${bindgen_version}" --force
fi

if [ "$want_browser" = 1 ] && [ ! -x /usr/bin/chromium ]; then
  log "installing Debian chromium for browser tests"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi

log "npm dependencies"
(cd npm && npm ci --no-audit --no-fund --loglevel=error)

log "building wasm (cached by source hash) and TypeScript"
(cd npm && npm run build --silent)
