#!/usr/bin/env bash
# Stops the llama-server started by start.sh, by the PID in its pidfile.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/model/defaults.sh
. "$HERE/defaults.sh"
PIDFILE="$MODEL_DIR/server-$MODEL_PORT.pid"

log() { printf '[model-stop] %s\n' "$*" >&2; }

if [ ! -f "$PIDFILE" ]; then
  log "no pidfile at $PIDFILE; nothing to stop"
  exit 0
fi
PID="$(cat "$PIDFILE")"
if ! kill -0 "$PID" 2>/dev/null; then
  log "pid $PID is not running; removing stale pidfile"
  rm -f "$PIDFILE"
  exit 0
fi
kill -TERM "$PID"
for _ in $(seq 1 50); do
  kill -0 "$PID" 2>/dev/null || break
  sleep 0.2
done
if kill -0 "$PID" 2>/dev/null; then
  log "pid $PID ignored SIGTERM for 10s; sending SIGKILL"
  kill -KILL "$PID" 2>/dev/null || true
fi
rm -f "$PIDFILE"
log "stopped pid $PID"
