#!/usr/bin/env bash
# Set up a virtual environment from this checkout and run the save-and-resume demo.
# Extra arguments go to the demo, e.g. `bash scripts/demo.sh --dir agent-runs` (keeps the runs
# for `alpineagents ls agent-runs`) or `bash scripts/demo.sh --store s3`.
#
# It installs only what the demo asks for: the core (anthropic, pydantic) for the default
# FileStore; the S3 plugin with boto3 for `--store s3://BUCKET/PREFIX`; and moto too for
# `--store s3` (an embedded S3 server). Each is installed once: a stamp file in the venv
# records it, and it is installed again only when the files it is built from are newer.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ALPINEAGENTS_VENV:-.venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"

# What the demo's arguments need.
plugin=""
previous=""
for arg in "$@"; do
    store=""
    if [ "$previous" = "--store" ]; then store=$arg; fi
    case $arg in --store=*) store=${arg#--store=} ;; esac
    case $store in
        s3) plugin="./packaging/alpineagents-s3[testing]" ;;  # the embedded server: moto
        s3://*) [ -n "$plugin" ] || plugin="./packaging/alpineagents-s3" ;;
    esac
    previous=$arg
done

# install STAMP SOURCES... -- PIP-ARGS...: pip install unless STAMP is newer than SOURCES.
install() {
    local stamp="$venv/.alpineagents-demo-$1"
    shift
    local sources=()
    while [ "$1" != "--" ]; do sources+=("$1"); shift; done
    shift
    if [ -f "$stamp" ] && [ -z "$(find "${sources[@]}" -newer "$stamp" -print -quit)" ]; then
        return 0
    fi
    echo "Installing into $venv: $*" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@" 2>&1 |
        { grep -v "is ignored: it is neither a file nor a directory" || true; }
    touch "$stamp"
}

# The core is installed editable: its code is read from the checkout, only pyproject.toml
# changes what is installed.
install core pyproject.toml -- -e .
if [ -n "$plugin" ]; then
    # The plugin is installed as a copy of alpineagents_s3/: a change there installs it again.
    stamp=s3
    [ "$plugin" = "./packaging/alpineagents-s3" ] || stamp=s3-moto
    install "$stamp" packaging alpineagents_s3 -- "$plugin"
fi
exec "$venv/bin/python" -m alpineagents.demo "$@"
