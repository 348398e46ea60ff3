#!/bin/sh
# The interpreter of Orrery's Bazel Python toolchain: the project's .venv python (made by
# scripts/setup_env.sh), which has every pip dependency and not the project itself. Bazel runs
# this file through a link to the checkout; the venv sits two folders above it.
root=$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)
python="$root/.venv/bin/python3"
if [ ! -x "$python" ]; then
  echo "venv_python.sh: no $python; run: bash scripts/setup_env.sh test" >&2
  exit 127
fi
exec "$python" "$@"
