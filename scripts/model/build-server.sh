#!/usr/bin/env bash
# Builds llama-server from source for CPUs the prebuilt wheel cannot run on.
#
# The source is llama.cpp as vendored in the llama-cpp-python sdist on PyPI
# (vendor/llama.cpp), pinned by version and sha256 in source-requirements.txt,
# as is the cmake wheel used when the system has no cmake >= 3.14.
#
#   build-server.sh flags          print the cmake flags for this CPU (one line)
#   build-server.sh build OUT_DIR  build llama-server and install it into OUT_DIR
#
# The build is static (BUILD_SHARED_LIBS=OFF): OUT_DIR gets one `llama-server`
# binary that needs only libc, libstdc++, libgcc_s and libgomp from the system.
# CPU features are chosen from /proc/cpuinfo feature by feature (GGML_NATIVE=OFF),
# so the flags, and hence setup.sh's stamp, say exactly what the binary uses.
#
# Environment: PYTHON (python3 with pip), CRUCIBLE_MODEL_BUILD_JOBS (default: nproc).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
PINS="$HERE/source-requirements.txt"
SDIST_PKG="llama-cpp-python"

log() { printf '[model-build] %s\n' "$*" >&2; }
die() { printf '[model-build] ERROR: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/model/common.sh
. "$HERE/common.sh"

# cmake flags for the CPU backend: the widest x86 feature set this CPU has, out of
# the tiers ggml itself builds as variants (haswell, skylakex, icelake, zen4, ...).
ggml_cpu_flags() {
  if [ "$(uname -m)" != x86_64 ]; then
    echo "-DGGML_NATIVE=ON"
    return
  fi
  local f=(-DGGML_NATIVE=OFF)
  cpu_has sse4_2 && f+=(-DGGML_SSE42=ON) || f+=(-DGGML_SSE42=OFF)
  if cpu_has avx avx2 fma f16c bmi2; then
    f+=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
    if cpu_has avx512f avx512cd avx512vl avx512dq avx512bw; then
      f+=(-DGGML_AVX512=ON)
      cpu_has avx512vbmi && f+=(-DGGML_AVX512_VBMI=ON)
      cpu_has avx512_vnni && f+=(-DGGML_AVX512_VNNI=ON)
      cpu_has avx512_bf16 && f+=(-DGGML_AVX512_BF16=ON)
    elif cpu_has avx_vnni; then
      f+=(-DGGML_AVX_VNNI=ON)
    fi
  else
    f+=(-DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_BMI2=OFF)
    cpu_has avx && f+=(-DGGML_AVX=ON) || f+=(-DGGML_AVX=OFF)
    cpu_has f16c && f+=(-DGGML_F16C=ON) || f+=(-DGGML_F16C=OFF)
  fi
  echo "${f[*]}"
}

# Everything else: no GPU backends, no network code, no web UI, only the server.
COMMON_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
  -DGGML_OPENMP=ON -DGGML_VULKAN=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_CCACHE=OFF
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
)

all_flags() { echo "${COMMON_FLAGS[*]} $(ggml_cpu_flags)"; }

# One pinned line of source-requirements.txt as a requirements file of its own.
pin_file() {
  local out="$2"
  grep -E "^$1==" "$PINS" >"$out" || die "no pin for $1 in $PINS"
}

ensure_compilers() {
  local need=()
  command -v cc >/dev/null || need+=(gcc)
  command -v c++ >/dev/null || need+=(g++)
  command -v make >/dev/null || need+=(make)
  [ "${#need[@]}" = 0 ] && return 0
  log "installing build tools: ${need[*]}"
  apt_install "${need[@]}"
}

# Prints the cmake to use: the system's if >= 3.14, else the pinned wheel's binary.
find_cmake() {
  local work="$1" v
  if command -v cmake >/dev/null; then
    v="$(cmake --version | awk 'NR==1 {print $3}')"
    if [ "$(printf '%s\n3.14\n' "$v" | sort -V | head -1)" = 3.14 ]; then
      command -v cmake
      return
    fi
  fi
  pin_file cmake "$work/cmake-req.txt"
  log "fetching the pinned cmake wheel"
  "$PYTHON" -m pip download --disable-pip-version-check --quiet --no-deps \
    --require-hashes --only-binary=:all: -r "$work/cmake-req.txt" -d "$work/dl" >&2 ||
    die "pip download of cmake failed (hash mismatch or network)"
  "$PYTHON" - "$work/dl" "$work/cmake" <<'PY'
import glob, os, sys, zipfile
dl, out = sys.argv[1:3]
(whl,) = glob.glob(os.path.join(dl, "cmake-*.whl"))
with zipfile.ZipFile(whl) as z:
    for info in z.infolist():
        if info.filename.startswith("cmake/data/") and not info.is_dir():
            dest = os.path.join(out, info.filename[len("cmake/data/"):])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as dst:
                dst.write(src.read())
            if (info.external_attr >> 16) & 0o111 or "/bin/" in info.filename:
                os.chmod(dest, 0o755)
PY
  echo "$work/cmake/bin/cmake"
}

build() {
  local out="$1"
  [ -n "$out" ] || die "usage: build-server.sh build OUT_DIR"
  local work
  work="$(dirname "$out")/build-server.tmp"
  rm -rf "$work"
  mkdir -p "$work/dl"
  ensure_compilers

  # The sdist, hash-checked by pip. pip prepares its metadata in an isolated
  # env (scikit-build-core); nothing of llama-cpp-python itself is built here.
  pin_file "$SDIST_PKG" "$work/src-req.txt"
  log "fetching the pinned $SDIST_PKG sdist (vendored llama.cpp source)"
  "$PYTHON" -m pip download --disable-pip-version-check --quiet --no-deps \
    --require-hashes --no-binary="$SDIST_PKG" -r "$work/src-req.txt" -d "$work/dl" >&2 ||
    die "pip download of the $SDIST_PKG sdist failed (hash mismatch or network)"
  local sdist
  sdist="$(ls "$work"/dl/llama_cpp_python-*.tar.gz)"
  mkdir -p "$work/src"
  tar -xzf "$sdist" -C "$work/src" --strip-components=3 --wildcards '*/vendor/llama.cpp/*'
  [ -f "$work/src/tools/server/server.cpp" ] || die "no tools/server in $sdist"

  local cmake
  cmake="$(find_cmake "$work")"
  local jobs="${CRUCIBLE_MODEL_BUILD_JOBS:-$(nproc)}"
  log "configuring: $(all_flags)"
  # shellcheck disable=SC2046 # the flags are words by design
  "$cmake" -S "$work/src" -B "$work/build" "${COMMON_FLAGS[@]}" $(ggml_cpu_flags) \
    >"$work/configure.log" 2>&1 || { tail -n 40 "$work/configure.log" >&2; die "cmake configure failed"; }
  log "building llama-server with $jobs jobs (several minutes; log: $work/build.log)"
  local t0=$SECONDS
  "$cmake" --build "$work/build" --target llama-server -j "$jobs" \
    >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; die "build failed"; }
  log "built in $((SECONDS - t0)) s"

  rm -rf "$out"
  mkdir -p "$out"
  cp "$work/build/bin/llama-server" "$out/llama-server"
  strip "$out/llama-server" 2>/dev/null || true
  rm -rf "$work"
}

case "${1:-}" in
  flags) all_flags ;;
  build) build "${2:-}" ;;
  *) die "usage: build-server.sh flags | build OUT_DIR" ;;
esac
