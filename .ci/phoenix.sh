#!/usr/bin/env bash
# Installs Arize Phoenix once, in a virtual environment of its own, and prints its Python's path.
# The `otlp` test tier sends traces to it (an OTLP/HTTP receiver nobody here wrote) and reads them back
# through its REST API; the tests skip without it.
#
# Idempotent: an environment at the cache path that has this version of Phoenix installed is printed and nothing
# else is done (its package metadata is read, not the package imported: importing Phoenix takes 9 s of CPU).
# Its own environment, not the test extra: Phoenix brings some 850 MB (a web app, gRPC, SQLAlchemy,
# pandas of its own versions) and took 7 minutes to install here; the project's venv stays small.
# It runs offline: nothing is fetched at start or run time.
set -euo pipefail
VERSION="${PHOENIX_VERSION:-20.26.1}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/taskweaver-lite/phoenix/$VERSION"
PY="$CACHE/venv/bin/python"
if [[ -x "$PY" ]] && [[ "$("$PY" -c "import importlib.metadata as m; print(m.version('arize-phoenix'))" 2>/dev/null)" == "$VERSION" ]]; then
  echo "$PY"
  exit 0
fi
rm -rf "$CACHE/venv"
mkdir -p "$CACHE"
python3 -m venv "$CACHE/venv"
nice -n 19 "$CACHE/venv/bin/pip" install --quiet "arize-phoenix==$VERSION" >&2
echo "$PY"
