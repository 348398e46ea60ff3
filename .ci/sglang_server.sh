#!/usr/bin/env bash
# Start or stop a real SGLang server on CPU for Orrery's SGLang engine tests.
#
#   .ci/sglang_server.sh start MODEL_DIR PORT   # prints the base URL once /health answers 200
#   .ci/sglang_server.sh stop  MODEL_DIR PORT   # MODEL_DIR is ignored; PORT names the server
#
# The server runs from SGLang's own virtual environment (built by .ci/sglang_env.sh), in its
# own process group, with the pure-PyTorch sgl_kernel stand-in (tests/support) on PYTHONPATH.
# It serves MODEL_DIR in float32 on CPU with the torch-native attention and sampling backends,
# announces weight version "0" (the engine parses versions as integers), and returns logprobs
# of the temperature-scaled distribution unless ORRERY_SGLANG_RETURN_ORIGINAL_LOGPROB=1.
# When MODEL_DIR has no tokenizer files the server skips tokenizer init (token ids only;
# stop strings are then unavailable).
#
# Environment (all optional):
#   ORRERY_SGLANG_VENV            SGLang's venv (default: the versioned path in sglang_env.sh)
#   ORRERY_SGLANG_STATE_DIR       pid and log files (default ${TMPDIR:-/tmp}/orrery-sglang)
#   ORRERY_SGLANG_START_TIMEOUT   seconds to wait for /health (default 300)
#   ORRERY_SGLANG_MAX_TOKENS      KV-cache pool size in tokens (default 16384)
#   ORRERY_SGLANG_RETURN_ORIGINAL_LOGPROB  1: logprobs of the unscaled distribution
#   ORRERY_SGLANG_EXTRA_ARGS      more launch_server flags, word-split
# Files: $STATE_DIR/sglang-PORT.pid (the process group id) and sglang-PORT.log.
set -euo pipefail

usage() { echo "usage: $0 start|stop MODEL_DIR PORT" >&2; exit 2; }
[[ $# -eq 3 ]] || usage
action=$1 model_dir=$2 port=$3
[[ $port =~ ^[0-9]+$ ]] || { echo "sglang_server: PORT must be a number, got '$port'" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$repo/.ci/sglang_env.sh" --print-venv)
state=${ORRERY_SGLANG_STATE_DIR:-${TMPDIR:-/tmp}/orrery-sglang}
pidfile=$state/sglang-$port.pid
logfile=$state/sglang-$port.log
deadline_s=${ORRERY_SGLANG_START_TIMEOUT:-300}
url=http://127.0.0.1:$port

alive() { [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

stop_server() {
  if ! alive; then rm -f "$pidfile"; echo "sglang_server: nothing running on port $port"; return 0; fi
  local pgid; pgid=$(cat "$pidfile")
  kill -TERM -- "-$pgid" 2>/dev/null || true
  for _ in $(seq 1 40); do
    kill -0 -- "-$pgid" 2>/dev/null || { rm -f "$pidfile"; echo "sglang_server: stopped port $port"; return 0; }
    sleep 0.5
  done
  kill -KILL -- "-$pgid" 2>/dev/null || true
  rm -f "$pidfile"
  echo "sglang_server: killed port $port (did not stop within 20 s)"
}

start_server() {
  [[ -f $model_dir/config.json ]] || { echo "sglang_server: $model_dir/config.json not found" >&2; exit 2; }
  [[ -x $venv/bin/python ]] || {
    echo "sglang_server: no SGLang venv at $venv; run .ci/sglang_env.sh first" >&2; exit 3; }
  if alive; then echo "sglang_server: already running on port $port (pid file $pidfile)" >&2; exit 4; fi
  if curl -s -m 2 -o /dev/null "$url/health"; then
    echo "sglang_server: port $port is already in use by another process" >&2; exit 4; fi
  mkdir -p "$state"
  local tok_args=()
  if [[ ! -f $model_dir/tokenizer.json && ! -f $model_dir/tokenizer_config.json ]]; then
    tok_args=(--skip-tokenizer-init)
  fi
  local original=()
  [[ ${ORRERY_SGLANG_RETURN_ORIGINAL_LOGPROB:-0} == 1 ]] && original=(SGLANG_RETURN_ORIGINAL_LOGPROB=1)
  # --sleep-on-idle: the scheduler otherwise busy-polls a whole core for the entire test run.
  # setsid: the server and its scheduler/detokenizer children share one process group,
  # so stop can end all of them and nothing else.
  # shellcheck disable=SC2086
  env SGLANG_USE_CPU_ENGINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "${original[@]}" \
    PYTHONPATH="$repo/tests/support${PYTHONPATH:+:$PYTHONPATH}" \
    setsid "$venv/bin/python" -m sglang.launch_server \
      --model-path "$model_dir" --device cpu --dtype float32 \
      --attention-backend torch_native --sampling-backend pytorch \
      --cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled \
      --disable-overlap-schedule --max-total-tokens "${ORRERY_SGLANG_MAX_TOKENS:-16384}" \
      --sleep-on-idle \
      --weight-version 0 --random-seed 0 --host 127.0.0.1 --port "$port" \
      "${tok_args[@]}" ${ORRERY_SGLANG_EXTRA_ARGS:-} \
      >"$logfile" 2>&1 </dev/null &
  echo $! >"$pidfile"
  local t0=$SECONDS
  while (( SECONDS - t0 < deadline_s )); do
    if ! alive; then
      echo "sglang_server: server exited during startup; last lines of $logfile:" >&2
      grep -v "server_args=" "$logfile" | tail -n 30 >&2
      rm -f "$pidfile"; exit 1
    fi
    if [[ $(curl -s -m 5 -o /dev/null -w '%{http_code}' "$url/health" || true) == 200 ]]; then
      echo "sglang_server: ready on $url after $((SECONDS - t0)) s (log $logfile)" >&2
      echo "$url"; return 0
    fi
    sleep 1
  done
  echo "sglang_server: no healthy answer from $url within $deadline_s s; stopping it. Log: $logfile" >&2
  grep -v "server_args=" "$logfile" | tail -n 30 >&2
  stop_server >&2; exit 1
}

case $action in
  start) start_server ;;
  stop) stop_server ;;
  *) usage ;;
esac
