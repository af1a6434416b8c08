#!/usr/bin/env bash
# Sets up and runs the demo:
#   1. in the terminal, an agent with host tools answers a question, streaming its events;
#   2. the demo page (www/) is built and served on 127.0.0.1, its URL printed; Ctrl-C stops it.
# It uses the local model (started here, stopped on exit) unless OPENAI_BASE_URL/OPENAI_API_KEY
# or ANTHROPIC_API_KEY are set. Pass a question as the first argument to ask something else;
# CRUCIBLE_DEMO_NO_SERVE=1 skips the page.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
if [ -z "${OPENAI_BASE_URL:-}${OPENAI_API_KEY:-}${ANTHROPIC_API_KEY:-}" ]; then
  started_here=0
  curl -sf "http://127.0.0.1:${CRUCIBLE_MODEL_PORT:-8089}/health" >/dev/null 2>&1 || started_here=1
  model_url="$(bash scripts/model/start.sh)" # not `export X="$(…)"`, which hides a failed start
  export CRUCIBLE_MODEL_URL="$model_url"
  [ "$started_here" = 1 ] && trap 'bash "$root/scripts/model/stop.sh" >/dev/null 2>&1 || true' EXIT
fi

printf '\n== the agent, in the terminal\n'
(cd npm && node --import tsx examples/demo.ts "$@")

[ "${CRUCIBLE_DEMO_NO_SERVE:-0}" = 1 ] && exit 0
printf '\n== the demo page\n'
cd www
npm ci --no-audit --no-fund --loglevel=error
npm run build --silent
# The page reads its provider from the URL (www/src/settings.ts) and otherwise defaults to the
# local model, which is not started when a hosted provider is set: the printed URL names the
# provider the terminal demo used (demo.ts chooses it; keys never go in a URL).
query="$(cd ../npm && node --import tsx examples/demo.ts --page-query)"
if [ -n "${ANTHROPIC_API_KEY:-}${OPENAI_API_KEY:-}" ]; then
  echo "Open the page below; it talks to your configured provider from the browser: paste its API key under Settings (it is not put in the URL). Ctrl-C stops it."
else
  echo "Open the page below; it talks to ${CRUCIBLE_MODEL_URL:-${OPENAI_BASE_URL:-the local model}} from the browser. Ctrl-C stops it."
fi
npm run serve --silent -- --query "$query"
