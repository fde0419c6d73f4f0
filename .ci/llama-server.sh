#!/usr/bin/env bash
# Builds llama.cpp's llama-server once, from the source distribution of the llama-cpp-python package
# on PyPI (it vendors llama.cpp), and prints the binary's path. The `llama` test tier runs it.
#
# Idempotent: a built binary at the cache path is printed and nothing else is done. CPU only, the
# server target alone, two jobs under nice, at -O1: the tests' model is tiny, so compile time is what
# counts (11 minutes from scratch on two cores at a load of about 4; -O3 took 58 at a load of 10).
# Beside the binary it keeps ggml-vocab-gpt-2.gguf from the same tree, the vocabulary the tests give
# the tiny random-weight model they write. Nothing is fetched but the sdist; no weights.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/taskweaver-lite/llama-server/$VERSION"
BIN="$CACHE/llama-server"
VOCAB="$CACHE/ggml-vocab-gpt-2.gguf"
if [[ -x "$BIN" && -f "$VOCAB" ]]; then
  echo "$BIN"
  exit 0
fi
PYTHON="${PYTHON:-python3}"
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq cmake g++ make >/dev/null) >&2 \
    || { echo "llama-server: cmake and g++ are needed to build it" >&2; exit 1; }
fi
mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK" >&2
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK" \
  "llama_cpp_python-$VERSION/vendor/llama.cpp"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
nice -n 19 cmake -S "$SRC" -B "$WORK/build" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
  -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_CURL=OFF >&2
nice -n 19 cmake --build "$WORK/build" --target llama-server -j 2 >&2
cp "$SRC/models/ggml-vocab-gpt-2.gguf" "$VOCAB.tmp" && mv "$VOCAB.tmp" "$VOCAB"
cp "$WORK/build/bin/llama-server" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
echo "$BIN"
