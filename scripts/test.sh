#!/usr/bin/env bash
# Set up a virtual environment from this checkout, start the S3 emulator the integration
# tests use (LocalStack, on 127.0.0.1, no Docker), run every test, and stop the emulator.
# Set ALPINEAGENTS_NO_LOCALSTACK=1 to skip the emulator (its tests are then skipped).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ALPINEAGENTS_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'

if [ -z "${ALPINEAGENTS_NO_LOCALSTACK:-}" ] && [ -f localstack/localstack.sh ]; then
    bash localstack/localstack.sh install
    bash localstack/localstack.sh start
    trap 'bash localstack/localstack.sh stop' EXIT
    bash localstack/localstack.sh wait
    export ALPINEAGENTS_LOCALSTACK_URL=${ALPINEAGENTS_LOCALSTACK_URL:-http://127.0.0.1:4566}
fi

"$venv/bin/python" -m pytest "$@"
