#!/usr/bin/env bash
# Set up a virtual environment from this checkout and run the save-and-resume demo.
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --store s3`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ALPINEAGENTS_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
exec "$venv/bin/python" -m alpineagents.demo "$@"
