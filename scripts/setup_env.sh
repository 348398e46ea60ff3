#!/usr/bin/env bash
# Create .venv and install Orrery's dependencies (from pyproject.toml) for running from the checkout.
#
#   bash scripts/setup_env.sh          # runtime dependencies
#   bash scripts/setup_env.sh test     # plus the test extra (torch CPU, transformers, hypothesis, ...)
#
# The project itself is deliberately not installed into the venv: code runs from the checkout
# (`python -m controller.main ...`), so Bazel's sandboxed tests see only the packages each
# target declares and an import that crosses a forbidden arrow fails there.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python3 -m venv .venv
deps=$(.venv/bin/python - "$extras" <<'PY'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
deps = list(project["dependencies"])
for extra in filter(None, sys.argv[1].split(",")):
    deps += project["optional-dependencies"][extra]
print("\n".join(deps))
PY
)
stamp=".venv/.orrery-deps-$(echo "$deps" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  echo "$deps" | tr '\n' '\0' | xargs -0 .venv/bin/pip install -q
  touch "$stamp"
fi
