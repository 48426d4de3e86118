#!/usr/bin/env bash
# Installs what the benchmarks measure against. Idempotent: run it on every fresh machine and in CI.
#   bash bench/setup.sh
# - redis-server (Debian package), for channels.py, locks.py and jobs.py (Redis pub/sub, redis-py Lock, arq)
# - the peers' Python packages into the project's venv (.venv)
# - bench/.venv-orig: a Python 3.12 venv with the original TinyStore (PyPI tinyshed-tinystore) and uvloop
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv_python="${VENV_PYTHON:-$root/.venv/bin/python}"
py312="${PY312:-/root/.pyenv/versions/3.12.1/bin/python}"
orig="$here/.venv-orig"

sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi

if ! command -v redis-server >/dev/null 2>&1; then
    echo "setup: installing redis-server" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! $sudo apt-get install -y --no-install-recommends redis-server >&2; then
        $sudo apt-get update >&2
        $sudo apt-get install -y --no-install-recommends redis-server >&2
    fi
fi

echo "setup: peer packages into $venv_python" >&2
"$venv_python" -m pip install -q --disable-pip-version-check aiosqlite redis hiredis huey arq sse-starlette uvloop >&2

if [ ! -x "$py312" ]; then
    py312="$(command -v python3.12 || true)"
fi
if [ -z "$py312" ]; then
    echo "setup: no Python 3.12 found (set PY312); the original TinyStore will be reported unavailable" >&2
    exit 0
fi
if [ ! -x "$orig/bin/python" ]; then
    echo "setup: creating $orig with $py312" >&2
    "$py312" -m venv "$orig"
fi
if ! "$orig/bin/python" -c "import tinystore, uvloop" >/dev/null 2>&1; then
    echo "setup: installing tinyshed-tinystore (and uvloop, the loop every system runs on) into $orig" >&2
    "$orig/bin/python" -m pip install -q --disable-pip-version-check tinyshed-tinystore uvloop >&2
fi
echo "setup: done" >&2
