# shellcheck shell=bash
# Sourced by scripts/test.sh and scripts/demo.sh: the local model for the length of one run.
#
#   model_use_lock  marks this run as a user of the server (a shared flock on fd 8, which the
#                   caller keeps open until it exits)
#   model_use       starts the server (or reuses one that answers), prints its base URL
#                   (http://127.0.0.1:PORT/v1)
#   model_release   for an EXIT trap: the last run using the server stops it, if it was started
#                   by one of these runs (never a server started by hand with start.sh)
#
# Runs that overlap share one server: each holds a shared flock on server-PORT.users while it
# uses it, so a run that ends first does not stop the server under another run's tests.
# server-PORT.by-run holds the PID of a server a run started; the last run out stops it (also
# one a killed run left behind). The lock belongs to the caller's shell, so call model_use_lock
# there first, then `url="$(model_use)"`, and set the trap before either.

_model_here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/model/defaults.sh
. "$_model_here/defaults.sh"
_model_dir="$MODEL_DIR"
_model_port="$MODEL_PORT"
_model_users="$_model_dir/server-$_model_port.users"
_model_by_run="$_model_dir/server-$_model_port.by-run"
_model_pidfile="$_model_dir/server-$_model_port.pid"
_model_locked=0

# In the caller's shell (not in a $(...)): take the shared lock on fd 8. Waits while a run
# that was the last user stops the server.
model_use_lock() {
  mkdir -p "$_model_dir"
  exec 8>>"$_model_users"
  flock -s 8
  _model_locked=1
}

model_use() {
  local started=0 url
  curl -fsS -m 2 "http://127.0.0.1:$_model_port/health" >/dev/null 2>&1 || started=1
  # 8>&-: the server must not inherit the users lock, or it would count as a user forever.
  url="$(bash "$_model_here/start.sh" 8>&-)" || return 1
  if [ "$started" = 1 ] && [ -f "$_model_pidfile" ]; then
    cat "$_model_pidfile" >"$_model_by_run"
  fi
  printf '%s\n' "$url"
}

model_release() {
  [ "$_model_locked" = 1 ] || return 0
  _model_locked=0
  exec 8>&-
  (
    flock -n 9 || exit 0 # another run still uses the server
    if [ -f "$_model_by_run" ] && [ "$(cat "$_model_by_run")" = "$(cat "$_model_pidfile" 2>/dev/null)" ]; then
      bash "$_model_here/stop.sh" >/dev/null 2>&1 || true
    fi
    rm -f "$_model_by_run"
  ) 9>>"$_model_users"
}
