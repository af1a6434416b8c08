#!/usr/bin/env bash
# Sets up and runs every test tier:
#   1. Rust: cargo test (the core natively, scripted test-double models)
#   2. Node + Chromium: node --test over npm/test (providers vs a local wire-format server,
#      stores, sandbox, agent API, packaging, browser tests in Debian's chromium)
#   3. End to end on the real local model (Qwen2.5-Coder-0.5B via llama-server from PyPI)
# Set CRUCIBLE_SKIP_E2E=1 to skip tier 3.
# The run closes on node's own test summary (tier 1's counts are printed when it ends). The
# exit status is non-zero when a test failed, or when cargo or node ran no test (tiers 2 and 3
# are one node run, counted together).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
# shellcheck source=scripts/model/use.sh
. scripts/model/use.sh

work="$(mktemp -d "${TMPDIR:-/tmp}/crucible-test.XXXXXX")"
cleanup() {
  model_release
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bash scripts/setup.sh --browser

printf '\n== tier 1: cargo test\n'
# Cargo judges freshness by file times, and its fingerprints name no checkout, so a clone whose
# files are older than another clone's last build in this shared target dir would run the other
# clone's test binaries. A build of other sources than the last one recompiles this crate.
key_file="$CARGO_TARGET_DIR/debug/.crucible-source-key"
key_paths=()
for p in Cargo.toml Cargo.lock build.rs .cargo src tests benches examples; do [ -e "$p" ] && key_paths+=("$p"); done
key="$(find "${key_paths[@]}" -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
if [ -d "$CARGO_TARGET_DIR/debug" ] && [ "$(cat "$key_file" 2>/dev/null)" != "$key" ]; then
  cargo clean --quiet -p crucible
fi
{ cargo test --quiet 2>&1; echo $? >"$work/cargo.status"; } | tee "$work/cargo.log" |
  grep -E '^(test result|running|error|warning: unused)' || true
cargo_status="$(cat "$work/cargo.status")"
if [ "$cargo_status" != 0 ] || ! grep -q '^test result: ok' "$work/cargo.log"; then
  cat "$work/cargo.log"
  echo "tier 1 (cargo test) failed (exit status $cargo_status)"
  exit 1
fi
mkdir -p "$CARGO_TARGET_DIR/debug" && printf '%s\n' "$key" >"$key_file"
# "test result: ok. 3 passed; 0 failed; 1 ignored; ..." once per test binary.
read -r rust_passed rust_failed rust_skipped < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) s += $i }
  } END { print p + 0, f + 0, s + 0 }' "$work/cargo.log")
printf 'tier 1 (cargo test): %s passed, %s failed, %s ignored\n' "$rust_passed" "$rust_failed" "$rust_skipped"

if [ "${CRUCIBLE_SKIP_E2E:-0}" != 1 ]; then
  printf '\n== tier 3 setup: local model\n'
  model_use_lock
  # Assigned first, exported after: `export X="$(cmd)"` returns export's status, so a failed
  # start would go unnoticed and tier 3 would be skipped instead of failing.
  e2e_base_url="$(model_use)"
  export CRUCIBLE_E2E_BASE_URL="$e2e_base_url"
  # The demo page's real-model test too: at this URL, and a failure if it does not answer.
  export CRUCIBLE_LOCAL_MODEL_URL="$e2e_base_url" CRUCIBLE_REQUIRE_LOCAL_MODEL=1
fi

printf '\n== tiers 2 and 3: node --test (Node, Chromium, real local model)\n'
cd npm
# The tests run through tsx, which strips types without checking them: check them (and the
# bench and the demo page) first, so a test cannot pass on code its types refuse.
npm run --silent typecheck:tests
(cd ../www && ../npm/node_modules/.bin/tsc --noEmit -p tsconfig.json)
node_status=0
node --import tsx --test --test-concurrency=1 \
  --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$work/node.tap" \
  test/*.test.ts || node_status=$?
[ "$node_status" = 0 ] || exit "$node_status"
# Node's summary above is the run's closing report. A tier that ran no test fails the run all the
# same (the TAP copy closes with "# pass N").
node_passed="$(awk '/^# pass [0-9]+$/ { n = $3 } END { print n + 0 }' "$work/node.tap" 2>/dev/null || echo 0)"
if [ "$rust_passed" = 0 ] || [ "$node_passed" = 0 ]; then
  echo "no test ran in tier 1 or in tiers 2 and 3 (cargo: $rust_passed passed, node: $node_passed passed)" >&2
  exit 1
fi
