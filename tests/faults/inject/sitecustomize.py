"""Test-only gRPC fault injection for the rollout workers of a fault test. Not part of Orrery.

Python imports `sitecustomize` at start-up from the path, so a process started with this folder
on PYTHONPATH and ORRERY_FAULTS set gets one more server interceptor on every `grpc.server` it
makes. The fault tests set both for the controller, which passes its environment to the rollout
workers it spawns (and to the ones it restarts); production code is unchanged.

ORRERY_FAULTS is JSON:
  seed                 int; each process draws from Random(f"{seed}/{its --worker-id}/{pid}")
  rollout_error_rate   share of RolloutGroup calls of training groups (ids not starting "eval-")
                       that fail with UNAVAILABLE before any trajectory is sent
  latency_rate         share of RolloutGroup calls that first wait `latency_s` seconds
  latency_s            injected latency (below the fleet's rollout deadline: slow, not lost)
  update_error_every   every N-th UpdateWeights call of a process fails with UNAVAILABLE (0: never)
  log                  file that gets one JSON line per injected fault:
                       {"pid", "worker", "method", "group_id", "fault"}
Only processes whose command line names `rollout.server` inject anything.
"""

import json
import os
import random
import sys
import threading
import time

_CONFIG = os.environ.get("ORRERY_FAULTS")


def _command_line() -> list[str]:
    """This process's full command line (at start-up sys.argv lacks the `-m` module's name)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0")]
    except OSError:
        return list(sys.argv)


if _CONFIG and "rollout.server" in _command_line():
    import grpc

    _faults = json.loads(_CONFIG)
    _argv = _command_line()
    _worker = _argv[_argv.index("--worker-id") + 1] if "--worker-id" in _argv else "?"
    _rng = random.Random(f"{_faults.get('seed', 0)}/{_worker}/{os.getpid()}")
    _lock = threading.Lock()
    _updates = [0]

    def _draw(rate: float) -> bool:
        with _lock:
            return _rng.random() < rate

    def _record(method: str, group_id: str, fault: str) -> None:
        line = json.dumps({"pid": os.getpid(), "worker": _worker, "method": method, "group_id": group_id,
                           "fault": fault})
        with open(_faults["log"], "a") as log:
            log.write(line + "\n")

    class _FaultInterceptor(grpc.ServerInterceptor):
        def intercept_service(self, continuation, details):
            handler = continuation(details)
            if handler is None:
                return handler
            if details.method.endswith("/RolloutGroup") and handler.unary_stream is not None:
                inner = handler.unary_stream

                def rollout_group(request, context):
                    training = not request.group_id.startswith("eval-")
                    if training and _draw(_faults.get("rollout_error_rate", 0.0)):
                        _record("RolloutGroup", request.group_id, "unavailable")
                        context.abort(grpc.StatusCode.UNAVAILABLE, "injected fault")
                    if _draw(_faults.get("latency_rate", 0.0)):
                        _record("RolloutGroup", request.group_id, "latency")
                        time.sleep(_faults.get("latency_s", 0.0))
                    yield from inner(request, context)

                return grpc.unary_stream_rpc_method_handler(
                    rollout_group, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)
            if details.method.endswith("/UpdateWeights") and handler.unary_unary is not None:
                inner_update = handler.unary_unary

                def update_weights(request, context):
                    every = _faults.get("update_error_every", 0)
                    with _lock:
                        _updates[0] += 1
                        fail = every > 0 and _updates[0] % every == 0
                    if fail:
                        _record("UpdateWeights", "", "unavailable")
                        context.abort(grpc.StatusCode.UNAVAILABLE, "injected fault")
                    return inner_update(request, context)

                return grpc.unary_unary_rpc_method_handler(
                    update_weights, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)
            return handler

    _server = grpc.server

    def _server_with_faults(*args, **kwargs):
        kwargs["interceptors"] = tuple(kwargs.get("interceptors") or ()) + (_FaultInterceptor(),)
        return _server(*args, **kwargs)

    grpc.server = _server_with_faults
