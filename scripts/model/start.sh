#!/usr/bin/env bash
# Starts the local test LLM (llama-server, Qwen2.5-Coder-0.5B) in the background on
# loopback, or reuses one that already answers there. Prints the OpenAI-compatible
# base URL (http://127.0.0.1:PORT/v1) on stdout; everything else goes to stderr.
#
# Environment:
#   CRUCIBLE_MODEL_DIR            install dir (default: $HOME/.cache/crucible/model)
#   CRUCIBLE_MODEL_PORT           port (default: 8089)
#   CRUCIBLE_MODEL_THREADS        CPU threads (default: 2)
#   CRUCIBLE_MODEL_CTX            context size (default: 4096)
#   CRUCIBLE_MODEL_START_TIMEOUT  seconds to wait for /health (default: 120); a server
#                                 started here that has not answered by then is stopped
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/model/defaults.sh
. "$HERE/defaults.sh"
PORT="$MODEL_PORT"
THREADS="${CRUCIBLE_MODEL_THREADS:-2}"
CTX="${CRUCIBLE_MODEL_CTX:-4096}"
TIMEOUT="${CRUCIBLE_MODEL_START_TIMEOUT:-120}"
HOST=127.0.0.1
BASE="http://$HOST:$PORT"
PIDFILE="$MODEL_DIR/server-$PORT.pid"
LOGFILE="$MODEL_DIR/server-$PORT.log"
BIN_DIR="$MODEL_DIR/bin"
GGUF="$MODEL_DIR/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
TEMPLATE="$HERE/qwen-tools.jinja"

log() { printf '[model-start] %s\n' "$*" >&2; }

healthy() { curl -fsS -m 2 "$BASE/health" >/dev/null 2>&1; }

if healthy; then
  log "reusing server already answering at $BASE"
  echo "$BASE/v1"
  exit 0
fi

"$HERE/setup.sh"

# One start at a time per port: two runs that both found no server would otherwise both
# launch one, and the second, unable to bind, would overwrite the first's pidfile.
exec 7>>"$MODEL_DIR/server-$PORT.start-lock"
flock 7
if healthy; then
  log "reusing server already answering at $BASE"
  echo "$BASE/v1"
  exit 0
fi

# A stale pidfile from a server that died: clear it; a live one that does not
# answer yet (still loading) is waited on below instead of starting a second one.
PID=""
if [ -f "$PIDFILE" ]; then
  PID="$(cat "$PIDFILE")"
  if ! kill -0 "$PID" 2>/dev/null; then
    rm -f "$PIDFILE"
    PID=""
  fi
fi

# A server started here that never answered (the wait ran out, or Ctrl-C came first) is
# stopped on the way out: no caller learns its PID, so nothing else would stop it.
STARTED=""
stop_unready() {
  [ -n "$STARTED" ] || return 0
  kill -TERM "$STARTED" 2>/dev/null || true
  rm -f "$PIDFILE"
}
trap stop_unready EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -z "$PID" ]; then
  log "starting llama-server on $BASE (log: $LOGFILE)"
  LD_LIBRARY_PATH="$BIN_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    setsid nohup "$BIN_DIR/llama-server" \
    -m "$GGUF" --host "$HOST" --port "$PORT" -t "$THREADS" -c "$CTX" \
    --jinja --chat-template-file "$TEMPLATE" --alias qwen --no-webui \
    >"$LOGFILE" 2>&1 </dev/null 7>&- &
  PID=$!
  STARTED=$PID
  echo "$PID" >"$PIDFILE"
fi

deadline=$((SECONDS + TIMEOUT))
until healthy; do
  if ! kill -0 "$PID" 2>/dev/null; then
    rm -f "$PIDFILE"
    STARTED=""
    log "ERROR: llama-server (pid $PID) exited before answering; last log lines:"
    tail -n 30 "$LOGFILE" >&2 || true
    exit 1
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    log "ERROR: llama-server (pid $PID) did not answer $BASE/health within ${TIMEOUT}s; last log lines:"
    tail -n 30 "$LOGFILE" >&2 || true
    exit 1
  fi
  sleep 0.5
done
STARTED=""
log "ready (pid $PID)"
echo "$BASE/v1"
