#!/usr/bin/env bash
# Build SGLang's own virtual environment (CPU-capable; as it would live beside a GPU).
#
#   .ci/sglang_env.sh               # build if missing or incomplete, then print the venv path
#   .ci/sglang_env.sh --print-venv  # only print the path it would use
#
# The venv path is keyed by the pinned versions, so CI can cache it outside the clone:
#   ${ORRERY_SGLANG_VENV:-$HOME/.cache/orrery/sglang-0.5.23-torch2.14.1}
# Idempotent: a venv whose ready marker matches this recipe and whose imports work is kept;
# anything else at that path is removed and rebuilt from nothing. A lock serialises builders.
#
# Recipe: torch + torchvision (the CUDA builds; they also run on CPU), sglang itself without
# its dependency list (which pulls CUDA-only kernels: flashinfer, sglang-kernel, deep-gemm...),
# then the pure-Python packages that `python -m sglang.launch_server --device cpu` needs,
# found by starting it and reading the ImportErrors. The compiled CPU kernel package
# `sgl_kernel` is not on PyPI; tests/support/sgl_kernel stands in for it at server start
# (.ci/sglang_server.sh puts it on PYTHONPATH).
set -euo pipefail

SGLANG_VERSION=0.5.23
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
venv=${ORRERY_SGLANG_VENV:-$HOME/.cache/orrery/sglang-$SGLANG_VERSION-torch$TORCH_VERSION}

if [[ ${1:-} == --print-venv ]]; then echo "$venv"; exit 0; fi
[[ $# -eq 0 ]] || { echo "usage: $0 [--print-venv]" >&2; exit 2; }

# Pins come from sglang 0.5.23's own metadata where it pins; the rest float.
DEPS=(
  "transformers==5.19.0" "tokenizers==0.23.2" "huggingface_hub" "safetensors"
  "fastapi" "uvicorn>=0.51" "uvloop" "python-multipart" "aiohttp" "requests"
  "pydantic" "msgspec" "orjson" "pybase64" "pyzmq>=25.1.2" "psutil" "setproctitle"
  "packaging" "tqdm" "IPython" "dill" "einops" "jsonschema" "partial_json_parser"
  "openai==2.8.0" "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1"
  "compressed-tensors==0.18.0" "gguf" "xgrammar==0.2.7" "soundfile==0.13.1"
)
recipe="sglang==$SGLANG_VERSION torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION ${DEPS[*]}"
marker=$venv/.orrery-sglang-ready

ready() {
  [[ -f $marker && $(cat "$marker") == "$recipe" ]] &&
    "$venv/bin/python" -c "import sglang, torch, transformers, fastapi, uvicorn, zmq" 2>/dev/null
}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

if ready; then
  echo "sglang_env: $venv is ready" >&2
  echo "$venv"; exit 0
fi

t0=$SECONDS
echo "sglang_env: building $venv" >&2
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
constraints=$venv/constraints.txt
printf 'torch==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" >"$constraints"

"${pip[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
"${pip[@]}" --no-deps "sglang==$SGLANG_VERSION"
echo "sglang_env: pip will report that sglang's CUDA-only requirements are missing; expected" >&2
"${pip[@]}" -c "$constraints" "${DEPS[@]}"

# Smoke check: the server's CLI and its HTTP entry point import on CPU with the stand-in.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 PYTHONPATH="$repo/tests/support" \
  "$venv/bin/python" -c "import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler" ||
  { echo "sglang_env: the built venv does not import SGLang's server; see above" >&2; exit 1; }

echo "$recipe" >"$marker"
echo "sglang_env: built $venv in $((SECONDS - t0)) s" >&2
echo "$venv"
