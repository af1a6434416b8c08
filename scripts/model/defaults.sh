# shellcheck shell=bash
# shellcheck disable=SC2034  # read by the scripts that source this file
# Sourced by every model script: where the model and its server live, and the server's port,
# so a run and the scripts that start or stop its server never disagree on a default.
# MODEL_* names: use.sh is sourced into test.sh and demo.sh, whose PORT is the demo page's.
MODEL_DIR="${CRUCIBLE_MODEL_DIR:-$HOME/.cache/crucible/model}"
MODEL_PORT="${CRUCIBLE_MODEL_PORT:-8089}"
