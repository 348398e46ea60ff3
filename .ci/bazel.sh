#!/usr/bin/env bash
# Build and test Orrery with Bazel, offline: `bash .ci/bazel.sh` tests //...; with arguments,
# `bash .ci/bazel.sh //:tests_model --test_arg=-k --test_arg=decoder` runs exactly those.
#
# Installs Debian's bazel-bootstrap (4.2.3) when bazel is missing and the venv when it lacks
# the test dependencies, then runs `bazel test //...`. Every Python action runs on the venv's
# python through the toolchain in tools/bazel; .venv/bin also goes first on the PATH the tests
# see, for the programs they start. The WORKSPACE replaces the repositories Bazel would
# download with in-repo stand-ins, so no network is needed. Bazel's output base lives under
# ~/.cache/orrery-bazel (ORRERY_BAZEL_OUTPUT_BASE overrides it), never in the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v bazel >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq bazel-bootstrap >/dev/null
fi

if ! .venv/bin/python -c "import grpc_tools, pytest" >/dev/null 2>&1; then
  bash scripts/setup_env.sh test
fi
export PATH="$PWD/.venv/bin:$PATH"

checkout_id=$(printf '%s' "$PWD" | sha256sum | cut -c1-12)
output_base="${ORRERY_BAZEL_OUTPUT_BASE:-${XDG_CACHE_HOME:-$HOME/.cache}/orrery-bazel/$checkout_id}"

# The server exits after 5 idle minutes so CI machines get their memory back.
[ "$#" -gt 0 ] || set -- //...
exec bazel --output_base="$output_base" --max_idle_secs=300 test "$@"
