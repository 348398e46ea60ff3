#!/usr/bin/env bash
# Lint the protobuf contracts and check that they do not break old clients: `bash .ci/buf.sh`.
#
# 1. `buf lint` in proto/ (rules: proto/buf.yaml).
# 2. `buf breaking` of proto/ as it is now against the last committed baseline: the proto/ tree
#    of the parent of the newest commit that changed proto/ (or of HEAD, when proto/ has
#    uncommitted changes). BUF_AGAINST_REF=<commit-ish> overrides that, e.g. the merge base of a
#    branch: BUF_AGAINST_REF=$(git merge-base origin/main HEAD).
#
# A deliberate breaking change lands with a trailer in its commit message, which the check then
# honours for that commit:   Proto-Breaking-Change: <why old clients may break>
#
# buf comes from npm (@bufbuild/buf, pinned below), installed under ~/.cache/orrery-tools
# (ORRERY_TOOLS_DIR overrides), never in the checkout. In a shallow clone the script deepens
# the history to find the baseline; when there is none (proto/ is new, or the history cannot
# be fetched) it says so and checks lint only.
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=1.75.0
tools="${ORRERY_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/orrery-tools}/buf-$BUF_VERSION"
buf="$tools/node_modules/.bin/buf"
if [ ! -x "$buf" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq npm >/dev/null
  fi
  mkdir -p "$tools"
  npm install --prefix "$tools" --no-audit --no-fund --silent "@bufbuild/buf@$BUF_VERSION"
fi

echo "buf lint proto/"
(cd proto && "$buf" lint)

# --- buf breaking against the last committed baseline --------------------------------------

# Sets `against` to the commit whose proto/ is the baseline, or `skip` to why there is none.
against="" skip=""
find_baseline() {
  if [ -n "${BUF_AGAINST_REF:-}" ]; then
    against=$(git rev-parse --verify -q "${BUF_AGAINST_REF}^{commit}") || skip="no commit $BUF_AGAINST_REF"
    return
  fi
  if ! git rev-parse --verify -q HEAD >/dev/null; then
    skip="no commits yet"
    return
  fi
  if ! git diff --quiet HEAD -- proto || [ -n "$(git ls-files --others --exclude-standard -- proto)" ]; then
    against=$(git rev-parse HEAD)
    return
  fi
  local last
  last=$(git log -1 --format=%H -- proto)
  # A shallow clone shows its oldest commit as adding everything: fetch more history until
  # the last change to proto/ has a parent, or there is no more history to fetch.
  while [ "$(git rev-parse --is-shallow-repository)" = true ] && ! git rev-parse --verify -q "$last^" >/dev/null; do
    local before
    before=$(git rev-list --count HEAD)
    if ! git fetch -q --deepen=200 2>/dev/null || [ "$(git rev-list --count HEAD)" = "$before" ]; then
      skip="shallow clone whose history cannot be fetched"
      return
    fi
    last=$(git log -1 --format=%H -- proto)
  done
  if ! git rev-parse --verify -q "$last^" >/dev/null; then
    skip="proto/ first appears in the root commit $(git rev-parse --short "$last")"
    return
  fi
  local accepted
  accepted=$(git log -1 --format=%B "$last" | sed -n 's/^Proto-Breaking-Change:[[:space:]]*//p' | head -n 1)
  if [ -n "$accepted" ]; then
    skip="commit $(git rev-parse --short "$last") declares a breaking change: $accepted"
    return
  fi
  against=$(git rev-parse "$last^")
}

find_baseline
if [ -z "$against" ]; then
  echo "buf breaking skipped: $skip"
  exit 0
fi
if [ -z "$(git ls-tree -d --name-only "$against" -- proto)" ]; then
  echo "buf breaking: proto/ does not exist at $(git rev-parse --short "$against"); nothing to compare with"
  exit 0
fi

baseline=$(mktemp -d)
trap 'rm -rf "$baseline"' EXIT
git archive "$against" proto | tar -x -C "$baseline"
echo "buf breaking proto/ against proto/ at $(git log -1 --format='%h %s' "$against")"
"$buf" breaking proto --against "$baseline/proto"
echo "buf: lint clean, no breaking changes"
