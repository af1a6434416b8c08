#!/usr/bin/env bash
# Sets up and runs the demo: an agent with host tools answering in the terminal. It uses the
# local model (started here, stopped on exit) unless OPENAI_BASE_URL/OPENAI_API_KEY or
# ANTHROPIC_API_KEY are set. Pass a question as the first argument to ask something else.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
if [ -z "${OPENAI_BASE_URL:-}${OPENAI_API_KEY:-}${ANTHROPIC_API_KEY:-}" ]; then
  started_here=0
  curl -sf "http://127.0.0.1:${CRUCIBLE_MODEL_PORT:-8089}/health" >/dev/null 2>&1 || started_here=1
  export CRUCIBLE_MODEL_URL="$(bash scripts/model/start.sh)"
  [ "$started_here" = 1 ] && trap 'bash scripts/model/stop.sh >/dev/null 2>&1 || true' EXIT
fi
cd npm
node --import tsx examples/demo.ts "$@"
