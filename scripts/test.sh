#!/usr/bin/env bash
# Every test, on a fresh machine: set up, start the S3 emulator, run, stop.
#
# 1. This repository's core (editable) and the plugin's wheel (packaging/alpineagents-s3) in
#    one virtualenv ($ALPINEAGENTS_VENV, default .venv), set up by scripts/setup.sh: the whole
#    suite, tests/plugin included.
# 2. For each published alpineagents in PUBLISHED_CORES, a virtualenv of its own with that
#    release from the package index and the same plugin wheel: tests/plugin, the plugin's suite
#    written against the Store contract alone (conformance on moto's server, and that core's
#    own Agent killed mid-tool and resumed from the bucket).
# 3. The same suite's sync half on the oldest boto3 and botocore the plugin allows (1.40.0,
#    without the [async] extra, whose aioboto3 needs a later botocore), with the first
#    published core: the plugin's use of botocore (its shared models loader, its event hooks)
#    is tested at the floor it declares, as steps 1 and 2 test it at the newest.
# LocalStack (on 127.0.0.1, no Docker) runs for step 1; ALPINEAGENTS_NO_LOCALSTACK=1 skips it
# (its tests are then skipped). Both steps run in $ALPINEAGENTS_TEST_WORKERS pytest-xdist workers
# (default 3, on 2 cores: many tests wait on the processes and servers they start; 0 runs them
# in one process). Extra arguments go to the pytest of step 1.
#
# --fast: the inner loop (under 2 minutes): set-up, then step 1's tests that start no process,
# server or emulator (`-m "not slow and not integration and not server"`), the model checker
# and its mutation run among them; no published core, no LocalStack.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${ALPINEAGENTS_VENV:-.venv}
published=${PUBLISHED_CORES:-"0.4.0 0.7.1"}
pip_quiet=(--quiet --disable-pip-version-check)
oldest_boto=1.40.0  # the floor packaging/alpineagents-s3/pyproject.toml declares

quiet() {  # pip, without the warnings of a pip configuration naming folders that do not exist
    "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    return "${PIPESTATUS[0]}"
}

venv_at() {  # a virtualenv at $1, made again if an earlier run left it without a working pip
    "$1/bin/python" -c "import pip._internal.commands.install" >/dev/null 2>&1 || { rm -rf "$1" && python3 -m venv "$1"; }
}

# The plugin's wheel, built from this checkout by setup.sh (again only when the plugin, its
# packaging or pyproject.toml changed) and installed into every virtualenv.
ALPINEAGENTS_VENV=$venv bash scripts/setup.sh
if [ "${1:-}" = "--fast" ]; then
    shift
    exec "$venv/bin/python" -m pytest -n "${ALPINEAGENTS_TEST_WORKERS:-2}" \
        -m "not slow and not integration and not server" "$@"
fi
plugin=$(cd "$venv/wheel" && ls "$PWD"/alpineagents_s3-*.whl)  # absolute: a file:// URL below

make_core_env() {  # VERSION: a virtualenv with that published core and the plugin wheel
    local env_dir="$venv-core-$1" have
    venv_at "$env_dir"
    quiet "$env_dir/bin/python" -m pip install "${pip_quiet[@]}" "alpineagents==$1" \
        "pytest>=8.3" "pytest-asyncio>=0.25" "pytest-xdist>=3.6" "moto[server]>=5.1" "aioboto3>=15" \
        "boto3>=1.40"
    # As a user would: the plugin with its dependencies resolved next to the installed core,
    # which must stay as it is. (-P: the checkout's alpineagents.egg-info must not answer.)
    quiet "$env_dir/bin/python" -m pip uninstall "${pip_quiet[@]}" -y alpineagents-s3
    quiet "$env_dir/bin/python" -m pip install "${pip_quiet[@]}" "alpineagents-s3[async] @ file://$plugin"
    "$env_dir/bin/python" -m pip check
    have=$("$env_dir/bin/python" -P -c 'from importlib.metadata import version; print(version("alpineagents"))')
    [ "$have" = "$1" ] || { echo "test.sh: installing the plugin changed alpineagents $1 to $have" >&2; exit 1; }
    echo "test.sh: $env_dir: alpineagents $have with alpineagents-s3 from this checkout"
}

make_boto_env() {  # CORE: that core, the plugin without [async], the oldest boto3 allowed
    local have
    venv_at "$boto_env"
    quiet "$boto_env/bin/python" -m pip install "${pip_quiet[@]}" "alpineagents==$1" \
        "pytest>=8.3" "pytest-asyncio>=0.25" "pytest-xdist>=3.6" "moto[server]>=5.1" \
        "boto3==$oldest_boto" "botocore==$oldest_boto"
    quiet "$boto_env/bin/python" -m pip uninstall "${pip_quiet[@]}" -y alpineagents-s3
    quiet "$boto_env/bin/python" -m pip install "${pip_quiet[@]}" "alpineagents-s3 @ file://$plugin"
    "$boto_env/bin/python" -m pip check
    have=$("$boto_env/bin/python" -P -c 'import botocore; print(botocore.__version__)')
    [ "$have" = "$oldest_boto" ] || { echo "test.sh: $boto_env has botocore $have, not $oldest_boto" >&2; exit 1; }
}

# The virtualenvs (and LocalStack's) are made at once, each logging to a file: pip spends most
# of its time on one core, and this machine has two.
logs=$(mktemp -d)
pids=()
names=()
for core in $published; do
    make_core_env "$core" >"$logs/env-core-$core.log" 2>&1 &
    pids+=($!) && names+=("core-$core")
done
oldest_core=${published%% *}
boto_env="$venv-boto-$oldest_boto"
if [ -n "$oldest_core" ]; then
    make_boto_env "$oldest_core" >"$logs/env-boto.log" 2>&1 &
    pids+=($!) && names+=("boto")
fi
with_localstack=
if [ -z "${ALPINEAGENTS_NO_LOCALSTACK:-}" ] && [ -f localstack/localstack.sh ]; then
    with_localstack=1
    bash localstack/localstack.sh install >"$logs/env-localstack.log" 2>&1 &
    pids+=($!) && names+=("localstack")
fi
made=0
for i in "${!pids[@]}"; do
    status=0
    wait "${pids[$i]}" || status=$?
    cat "$logs/env-${names[$i]}.log"
    [ "$status" -eq 0 ] || { echo "test.sh: setting up ${names[$i]} failed (exit $status)" >&2; made=1; }
done
[ "$made" -eq 0 ] || exit 1

if [ -n "$with_localstack" ]; then
    bash localstack/localstack.sh start
    trap 'bash localstack/localstack.sh stop' EXIT
    bash localstack/localstack.sh wait
    export ALPINEAGENTS_LOCALSTACK_URL=${ALPINEAGENTS_LOCALSTACK_URL:-http://127.0.0.1:4566}
fi

summary=()
failed=0
record() {  # record NAME STATUS LOG: the last line of a pytest run, for the matrix
    local line
    line=$(grep -E "^=+ .*(passed|failed|error).* in [0-9.]+s" "$3" | tail -1 | tr -d '=' | sed 's/^ *//; s/ *$//')
    summary+=("$(printf '%-38s %s' "$1" "${line:-no result (exit $2)}")")
    [ "$2" -eq 0 ] || failed=1
}

workers=${ALPINEAGENTS_TEST_WORKERS:-3}
parallel=(-n "$workers")
[ "$workers" = 0 ] || parallel+=(--dist worksteal)  # the long tests are spread as they run

status=0
"$venv/bin/python" -m pytest "${parallel[@]}" "$@" 2>&1 | tee "$logs/repo.log" || status=$?
record "alpineagents $("$venv/bin/python" -c 'from importlib.metadata import version; print(version("alpineagents"))') (this repo)" "$status" "$logs/repo.log"

for core in $published; do
    status=0
    # The installed packages only: no repository folder on sys.path (PYTHONSAFEPATH, importlib
    # import mode, no conftest above tests/plugin), and the session checks where it imported
    # alpineagents and alpineagents_s3 from.
    ALPINEAGENTS_EXPECT_CORE=$core PYTHONSAFEPATH=1 "$venv-core-$core/bin/python" -m pytest \
        -c pyproject.toml --rootdir=. --import-mode=importlib --confcutdir=tests/plugin \
        -p no:cacheprovider "${parallel[@]}" tests/plugin 2>&1 | tee "$logs/$core.log" || status=$?
    record "alpineagents $core (published)" "$status" "$logs/$core.log"
done

if [ -n "$oldest_core" ]; then
    status=0
    ALPINEAGENTS_EXPECT_CORE=$oldest_core PYTHONSAFEPATH=1 "$boto_env/bin/python" -m pytest \
        -c pyproject.toml --rootdir=. --import-mode=importlib --confcutdir=tests/plugin \
        -p no:cacheprovider "${parallel[@]}" -k "not async" tests/plugin 2>&1 \
        | tee "$logs/boto.log" || status=$?
    record "alpineagents $oldest_core, boto3 $oldest_boto, sync" "$status" "$logs/boto.log"
fi

echo
echo "== the plugin against each alpineagents =="
printf '%s\n' "${summary[@]}"
rm -rf "$logs"
exit "$failed"
