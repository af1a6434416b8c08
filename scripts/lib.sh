# shellcheck shell=bash
# Sourced by setup.sh, test.sh and demo.sh (each sets `root` and `cd`s there first).

log() { printf '\n== %s\n' "$*" >&2; }
die() { printf '\nERROR: %s\n' "$*" >&2; exit 1; }

# Builds of every clone share one target dir and wasm cache, so repeated runs are cheap.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/crucible/target}"
export CARGO_TERM_COLOR=never

# rustup's installer puts cargo (and `cargo install`ed tools such as wasm-bindgen) in
# ~/.cargo/bin and puts that on PATH only for login shells: without it here, the pinned
# wasm-bindgen-cli would be installed again on every run and then not be found.
_cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
case ":$PATH:" in
  *":$_cargo_bin:"*) ;;
  *) [ -d "$_cargo_bin" ] && export PATH="$_cargo_bin:$PATH" ;;
esac
