#!/usr/bin/env bash
# Set up a virtual environment from this checkout and run the save-and-resume demo.
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --store s3`.
# It installs this repository's core and the S3 plugin (with moto, for `--store s3`), and does
# not install again while pyproject.toml and packaging/ are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ALPINEAGENTS_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
stamp="$venv/.alpineagents-demo-installed"
if [ ! -f "$stamp" ] || [ -n "$(find pyproject.toml packaging -newer "$stamp" -print -quit)" ]; then
    {
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
            './packaging/alpineagents-s3[async,testing]'
    } 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    touch "$stamp"
fi
exec "$venv/bin/python" -m alpineagents.demo "$@"
