#!/usr/bin/env bash
# Set up (idempotent) and run the default test suite: CPU only, minutes, no network.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
