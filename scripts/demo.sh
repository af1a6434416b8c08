#!/usr/bin/env bash
# Sets up and runs the demo:
#   1. in the terminal, an agent with host tools answers a question, streaming its events;
#   2. the demo page (www/) is built and served on 127.0.0.1, its URL printed; Ctrl-C stops it.
# It uses the local model (started here, stopped on exit) unless OPENAI_BASE_URL/OPENAI_API_KEY
# or ANTHROPIC_API_KEY are set. Pass a question as the first argument to ask something else;
# CRUCIBLE_DEMO_NO_SERVE=1 skips the page; PORT=N serves it on another port than 4173.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh
# shellcheck source=scripts/model/use.sh
. scripts/model/use.sh
trap model_release EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
serve=1
[ "${CRUCIBLE_DEMO_NO_SERVE:-0}" = 1 ] && serve=0
# Said now, not after the terminal demo: the page's port must be free.
if [ "$serve" = 1 ] && [ "${PORT:-4173}" != 0 ] && (exec 3<>"/dev/tcp/127.0.0.1/${PORT:-4173}") 2>/dev/null; then
  die "port ${PORT:-4173} on 127.0.0.1 is in use (an earlier demo still serving?): stop that, or set PORT=N for another port (CRUCIBLE_DEMO_NO_SERVE=1 skips the page)"
fi
if [ "$serve" = 1 ]; then bash scripts/setup.sh --www; else bash scripts/setup.sh; fi
if [ -z "${OPENAI_BASE_URL:-}${OPENAI_API_KEY:-}${ANTHROPIC_API_KEY:-}" ]; then
  model_use_lock
  model_url="$(model_use)" # not `export X="$(…)"`, which hides a failed start
  export CRUCIBLE_MODEL_URL="$model_url"
fi

printf '\n== the agent, in the terminal\n'
(cd npm && node --import tsx examples/demo.ts "$@")

[ "$serve" = 1 ] || exit 0
printf '\n== the demo page\n'
cd www
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
