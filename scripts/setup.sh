#!/usr/bin/env bash
# The development environment of this checkout, in the virtualenv $ALPINEAGENTS_VENV (default
# .venv), created if missing: this repository's core, editable, with its `dev` extra (pytest,
# ruff, mypy, moto, boto3, aioboto3 and their stubs), and the S3 plugin from a wheel built from
# packaging/alpineagents-s3, as a user installs it. The wheel stays in $ALPINEAGENTS_VENV/wheel/
# for scripts/test.sh, which installs the same file next to the published cores.
#
# A second call costs nothing: it installs again only when a file of pyproject.toml, packaging/
# or alpineagents_s3/ changed since the last set-up that succeeded (a stamp in the virtualenv).
# ALPINEAGENTS_SETUP_FORCE=1 installs again anyway (after deleting a file, say: that changes
# no file's time).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ALPINEAGENTS_VENV:-.venv}
stamp="$venv/.alpineagents-setup"
wheel_dir="$venv/wheel"
pip_quiet=(--quiet --disable-pip-version-check)

quiet() {  # pip, without the warnings of a pip configuration naming folders that do not exist
    "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
}

up_to_date() {
    [ -z "${ALPINEAGENTS_SETUP_FORCE:-}" ] && [ -x "$venv/bin/python" ] && [ -f "$stamp" ] &&
        compgen -G "$wheel_dir/alpineagents_s3-*.whl" >/dev/null &&
        [ -z "$(find pyproject.toml packaging alpineagents_s3 -type f -newer "$stamp" \
            -not -path '*/__pycache__/*' -print -quit)" ]
}

if up_to_date; then
    exit 0
fi

echo "setup.sh: installing this checkout into $venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# Stamped with the time the set-up started: a file edited while pip runs counts as changed.
touch "$stamp.new"
quiet "$venv/bin/python" -m pip install "${pip_quiet[@]}" -e '.[dev]'
rm -rf "$wheel_dir"
quiet "$venv/bin/python" -m pip wheel "${pip_quiet[@]}" --no-deps -w "$wheel_dir" \
    ./packaging/alpineagents-s3
# Its dependencies (boto3, and aioboto3 and moto for the async and testing extras) come with
# the dev extra; --force-reinstall: the version stays 0.1.0 while alpineagents_s3/ changes.
quiet "$venv/bin/python" -m pip install "${pip_quiet[@]}" --force-reinstall --no-deps \
    "$wheel_dir"/alpineagents_s3-*.whl
mv "$stamp.new" "$stamp"
echo "setup.sh: $venv is ready ($("$venv/bin/python" --version); activate it with: source $venv/bin/activate)"
