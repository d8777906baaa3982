#!/usr/bin/env bash
# Build the llama.cpp peer for the CPU comparison (issue 23) from a pinned source: the
# llama-cpp-python sdist on PyPI vendors a llama.cpp tree that builds with cmake here.
# `llama-server` and `llama-quantize` are built: Release, the CPU's own flags (AMX off: see
# below), no CUDA, no curl.
#
#   bench/build_llama_cpp.sh            # prints the llama-server path (builds once, then reuses it)
#
# The build lands in $OMNI_SERVE_CACHE/llama.cpp-<version>/ (default ~/.cache/omni-serve); a second
# run finds build/bin/llama-server there and skips everything. The unpacked source stays beside
# it for bench/convert_to_gguf.sh (llama.cpp's own convert_hf_to_gguf.py).
# Progress goes to stderr; stdout is only the binary's path, so `$(bench/build_llama_cpp.sh)` works.
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-$ROOT/.venv/bin/python}
CACHE=${OMNI_SERVE_CACHE:-$HOME/.cache/omni-serve}
DEST="$CACHE/llama.cpp-$VERSION"
SRC="$DEST/llama_cpp_python-$VERSION/vendor/llama.cpp"
BIN="$DEST/build/bin/llama-server"

log() { echo "build_llama_cpp: $*" >&2; }

if [[ -x "$BIN" ]]; then
    log "already built: $BIN"
    echo "$BIN"
    exit 0
fi

mkdir -p "$DEST"
# One build at a time: a second caller waits here, then finds the binary.
exec 9>"$DEST/.lock"
flock 9
if [[ -x "$BIN" ]]; then
    echo "$BIN"
    exit 0
fi
SDIST="$DEST/llama_cpp_python-$VERSION.tar.gz"
if [[ ! -f "$SDIST" ]] || ! echo "$SHA256  $SDIST" | sha256sum -c --quiet - >/dev/null 2>&1; then
    log "downloading the llama-cpp-python $VERSION sdist"
    rm -f "$SDIST"
    "$PY" -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$VERSION" -d "$DEST" >&2
fi
echo "$SHA256  $SDIST" | sha256sum -c --quiet - >&2 || {
    log "sha256 mismatch for $SDIST; refusing to build"
    exit 1
}

if [[ ! -f "$SRC/CMakeLists.txt" ]]; then
    log "unpacking"
    tar -xzf "$SDIST" -C "$DEST"
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
# ISA: native, except on a CPU with AMX: this version's AMX matmul (ggml_backend_amx_mul_mat)
# crashed llama-server at its first Q4_1 / Q8_0 batch on the 2-core Xeon of 2026-12-06 (SIGSEGV;
# `--no-repack` avoids it but also drops the AVX512 repacking). There the same flags are named
# one by one from the CPU's, without AMX: Q4_1 84 tok/s at one sequence against 81 with
# --no-repack on the native build (docs/BENCHMARKS.md, session 15).
ISA=(-DGGML_NATIVE=ON)
if grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    flag() { grep -qw "$1" /proc/cpuinfo && echo ON || echo OFF; }
    ISA=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2="$(flag avx2)" -DGGML_FMA="$(flag fma)"
         -DGGML_F16C="$(flag f16c)" -DGGML_BMI2="$(flag bmi2)" -DGGML_AVX_VNNI="$(flag avx_vnni)"
         -DGGML_AVX512="$(flag avx512f)" -DGGML_AVX512_VBMI="$(flag avx512vbmi)"
         -DGGML_AVX512_VNNI="$(flag avx512_vnni)" -DGGML_AVX512_BF16="$(flag avx512_bf16)"
         -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
fi
log "configuring (Release, ${ISA[*]}, no CUDA, no curl)"
cmake -S "$SRC" -B "$DEST/build" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    "${ISA[@]}" \
    -DGGML_CUDA=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF >&2
start=$SECONDS
log "building llama-server with -j$(nproc)"
cmake --build "$DEST/build" --config Release --target llama-server llama-quantize -j"$(nproc)" >&2
log "built in $((SECONDS - start)) s: $BIN"
echo "$BIN"
