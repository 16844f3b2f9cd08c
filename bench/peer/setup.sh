#!/usr/bin/env bash
# The closest peer, Strands Agents' S3SessionManager, in a virtualenv of its own (never the
# project's): bench/peer/strands_bench.py runs there, and bench/table.py finds it.
#
#   bash bench/peer/setup.sh            # makes bench/peer/.venv (git ignores .venv/)
#   PEER_VENV=/tmp/peer bash bench/peer/setup.sh
#
# bench/table.py looks for $PEER_VENV, else bench/peer/.venv.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${PEER_VENV:-$here/.venv}
version=${STRANDS_VERSION:-1.62.0}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    "strands-agents==$version" "boto3>=1.40" 2>&1 |
    { grep -v "is ignored: it is neither a file nor a directory" || true; }
"$venv/bin/python" -c 'from strands.session.s3_session_manager import S3SessionManager' ||
    { echo "setup.sh: strands-agents installed, but S3SessionManager does not import" >&2; exit 1; }
echo "peer virtualenv ready: $venv (strands-agents $version)"
