#!/usr/bin/env bash
# Installs JupyterLab 4 with Jupyter AI 3 and this checkout's persona (the `jupyter` extra) in a virtual
# environment of its own, and prints its Python's path. The `jupyter` test tier starts that JupyterLab and
# asks `@TaskWeaver` in its chat from headless Chromium; the tests skip without it.
#
# Its own environment, not the test extra: Jupyter AI needs the MCP SDK below 2 and the `mcp` extra 2 or
# later, and it brings some 300 MB (JupyterLab, its chat, Jupyter AI's MCP server). It lives in this
# checkout (build/jupyter-ai) or where TASKWEAVER_LITE_JUPYTER_VENV says (CI keeps it in its cache), with this
# checkout installed editable in it each time, so the persona it runs is always this checkout's.
# Idempotent: an environment that already imports Jupyter AI's ACP client only gets this checkout again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${TASKWEAVER_LITE_JUPYTER_VENV:-build/jupyter-ai/venv}"
PY="$VENV/bin/python"
if ! { [[ -x "$PY" ]] && "$PY" -c "import jupyter_ai_acp_client, jupyterlab" 2>/dev/null; }; then
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip >&2
fi
nice -n 19 "$VENV/bin/pip" install --quiet -e '.[jupyter]' >&2
echo "$(cd "$(dirname "$PY")" && pwd)/python"
