#!/usr/bin/env bash
# Builds llama.cpp's llama-server once, from the source distribution of the llama-cpp-python package
# on PyPI (it vendors llama.cpp), and prints the binary's path. The `llama` and `real` test tiers run it.
#
# Idempotent: a built binary at the cache path is printed and nothing else is done. CPU only, the
# server target alone, two jobs under nice. The server's own C++ (most of the compile time) is built
# at -O1; ggml, where a model's time goes, at -O3 with AVX2, FMA, F16C and BMI2 (on a CPU that has
# them; on one that has not, the portable build below). Not -march=native: its AMX kernels crash
# llama-server while it loads on this project's machines (a known ggml fault), and a fixed instruction
# set gives the seeded `real` chat the same numbers on every CPU that has it. The build takes 7 minutes of
# CPU: about 12 minutes on two cores (22 at a load of 8); ggml at -O3 adds under a minute to an all -O1
# build, where -O3 everywhere took 58 minutes at a load of 10. SmolLM2-135M then costs 0.8x the CPU per
# token of the portable build (bench/llama_build_bench.py).
#
# A binary with those instructions dies of SIGILL on a CPU without them, so the cache path names a hash
# of this CPU's flags (/proc/cpuinfo) beside the build's options: a cache carried to another CPU builds
# again. LLAMA_SERVER_BUILD=portable builds what this script built before (no AVX, everything at -O1; any
# x86-64 runs it), the baseline bench/llama_build_bench.py compares with. `--where` prints the path the
# binary is (or would be) at, without building (LLAMA_SERVER_CPUINFO names another cpuinfo file to read).
#
# Beside the builds it keeps ggml-vocab-gpt-2.gguf from the same tree, the vocabulary the tests give
# the tiny random-weight model they write. Nothing is fetched but the sdist; no weights.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
# taskweaver_lite/testing/llama_server.py picks and names the build the same way (tests/test_llama_build.py holds them together).
FLAGS="$(sed -n 's/^flags[[:space:]]*: //p' "${LLAMA_SERVER_CPUINFO:-/proc/cpuinfo}" 2>/dev/null | head -n 1)"
AVX2=avx2
for flag in avx2 fma f16c bmi2; do [[ " $FLAGS " == *" $flag "* ]] || AVX2=portable; done
BUILD="${LLAMA_SERVER_BUILD:-$AVX2}"
ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/taskweaver-lite/llama-server/$VERSION"
case "$BUILD" in
  avx2) KEY="avx2-ggml-O3-$(echo "$FLAGS" | sha256sum | cut -c 1-12)" ;;
  portable) KEY="portable-O1" ;;
  *) echo "LLAMA_SERVER_BUILD is avx2 or portable, not '$BUILD'" >&2; exit 2 ;;
esac
BIN="$ROOT/$KEY/llama-server"
VOCAB="$ROOT/ggml-vocab-gpt-2.gguf"
if [[ "${1:-}" == "--where" ]]; then
  echo "$BIN"
  exit 0
fi
if [[ -x "$BIN" && -f "$VOCAB" ]]; then
  echo "$BIN"
  exit 0
fi
PYTHON="${PYTHON:-python3}"
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq cmake g++ make >/dev/null) >&2 \
    || { echo "llama-server: cmake and g++ are needed to build it" >&2; exit 1; }
fi
mkdir -p "$ROOT/$KEY"
WORK="$(mktemp -d "$ROOT/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK" >&2
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK" \
  "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
OPTIONS=(-DGGML_NATIVE=OFF)
if [[ "$BUILD" == avx2 ]]; then
  # Read after each project(): once the whole tree is read, ggml's two targets get -O3 after the -O1 every file gets.
  cat >"$WORK/ggml-O3.cmake" <<'CMAKE'
get_property(done GLOBAL PROPERTY TASKWEAVER_LITE_GGML_O3)
if(NOT done)
  set_property(GLOBAL PROPERTY TASKWEAVER_LITE_GGML_O3 TRUE)
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL set_property TARGET ggml-base ggml-cpu APPEND PROPERTY COMPILE_OPTIONS -O3)
endif()
CMAKE
  OPTIONS=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON "-DCMAKE_PROJECT_INCLUDE=$WORK/ggml-O3.cmake")
fi
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
nice -n 19 cmake -S "$SRC" -B "$WORK/build" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
  -DBUILD_SHARED_LIBS=OFF "${OPTIONS[@]}" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_CURL=OFF >&2
nice -n 19 cmake --build "$WORK/build" --target llama-server -j 2 >&2
cp "$SRC/models/ggml-vocab-gpt-2.gguf" "$VOCAB.tmp" && mv "$VOCAB.tmp" "$VOCAB"
cp "$WORK/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
