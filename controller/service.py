"""`ControllerService` over gRPC: clients submit and manage envs and watch the run.

What crosses here: `EnvSpec`s in (validated by the registry), `EnvStatus`/run status/metrics out.
The service never touches the loop directly: it reads a `RunStatusSource` that the loop updates
(`RunStatus` is the implementation; it also satisfies the `Tracker` interface, so the loop can
log to it like any other tracker) and writes only to the `EnvRegistry`.

Errors are mapped, never leaked as tracebacks:
  invalid or oversized spec -> INVALID_ARGUMENT "<field>: <rule>, got <value>"
  unknown env               -> NOT_FOUND        "no env named 'x'; registered envs: ..."
  duplicate name            -> ALREADY_EXISTS
  anything else             -> INTERNAL with the exception's class and message (logged here
                               with its traceback)

`serve_controller` also turns on server reflection (so `grpcurl` and friends work) and the
standard health service (SERVING for "" and "orrery.v1.ControllerService"). Access control
(`orrery.security`, before any handler here runs): UNAUTHENTICATED without a known token,
PERMISSION_DENIED without the method's role (`envs.write` to change envs, `read` to look),
RESOURCE_EXHAUSTED past a client's rate of env changes. Health is open; reflection needs a token.

This is the only module of `controller/` besides `client.py` that uses the generated proto code.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import queue
import threading
from concurrent import futures
from typing import Any, Callable, Iterator, Mapping, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controller.registry import DuplicateEnvError, EnvRecord, EnvRegistry, EnvState, UnknownEnvError
from orrery.security import ServerSecurity, bind, make_server
from orrery.v1 import controller_pb2, controller_pb2_grpc, weights_pb2
from sandbox import validation, wire

logger = logging.getLogger(__name__)

SERVICE_NAME = controller_pb2.DESCRIPTOR.services_by_name["ControllerService"].full_name
SUBSCRIBER_QUEUE = 1024  # steps buffered per metrics subscriber; the oldest is dropped beyond this
STREAM_POLL_S = 0.25  # how often a StreamMetrics handler checks that its client is still there
# The env changes metered per client (ServerSecurity.submit_per_minute / submit_burst).
RATE_LIMITED = tuple(f"/{SERVICE_NAME}/{m}" for m in ("SubmitEnv", "PauseEnv", "ResumeEnv", "RemoveEnv"))


# -- what the loop updates -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunSnapshot:
    """The run as `GetRunStatus` reports it."""

    step: int = 0
    total_steps: int = 0
    mode: str = "sync"  # "sync" or "async"
    weights: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # WeightVersion fields, see _weights_proto
    rollout_workers: int = 0
    finished: bool = False
    latest_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)


class RunStatusSource(Protocol):
    """What the service reads. `subscribe` yields `(step, metrics)` per step, then `None` at the end."""

    def snapshot(self) -> RunSnapshot: ...

    def subscribe(self) -> "queue.Queue[tuple[int, dict[str, float]] | None]": ...

    def unsubscribe(self, q: "queue.Queue") -> None: ...


class RunStatus:
    """The thread-safe `RunStatusSource` the loop owns.

    The loop calls `update(...)` when the weights or the fleet change, `log(step, metrics)` once per
    learner step (the `Tracker` interface: put it in the loop's `MultiTracker`), and `close()` when
    the run ends, which ends every metrics stream.
    """

    def __init__(self, total_steps: int = 0, mode: str = "sync", rollout_workers: int = 0):
        self._lock = threading.Lock()
        self._snapshot = RunSnapshot(total_steps=total_steps, mode=mode, rollout_workers=rollout_workers)
        self._subscribers: list[queue.Queue] = []

    def update(self, **fields: Any) -> None:
        """Set any of RunSnapshot's fields except `latest_metrics`/`finished` (use log/close)."""
        allowed = {f.name for f in dataclasses.fields(RunSnapshot)} - {"latest_metrics", "finished"}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise TypeError(f"RunStatus.update: unknown fields {unknown}; valid: {sorted(allowed)}")
        if "weights" in fields:
            fields["weights"] = dict(_weights_dict(fields["weights"]))
        with self._lock:
            self._snapshot = dataclasses.replace(self._snapshot, **fields)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        metrics = {k: float(v) for k, v in metrics.items()}
        with self._lock:
            self._snapshot = dataclasses.replace(self._snapshot, step=int(step), latest_metrics=metrics)
            subscribers = list(self._subscribers)
        for q in subscribers:
            _put_dropping_oldest(q, (int(step), metrics))

    def close(self) -> None:
        """Mark the run finished and end every subscriber's stream. Idempotent."""
        with self._lock:
            self._snapshot = dataclasses.replace(self._snapshot, finished=True)
            subscribers, self._subscribers = self._subscribers, []
        for q in subscribers:
            _put_dropping_oldest(q, None)

    def snapshot(self) -> RunSnapshot:
        with self._lock:
            return self._snapshot

    def subscribe(self) -> queue.Queue:
        q: queue.Queue = queue.Queue(maxsize=SUBSCRIBER_QUEUE)
        with self._lock:
            if self._snapshot.finished:
                q.put(None)
            else:
                self._subscribers.append(q)
        return q

    def unsubscribe(self, q: queue.Queue) -> None:
        with self._lock:
            if q in self._subscribers:
                self._subscribers.remove(q)

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subscribers)


def _put_dropping_oldest(q: queue.Queue, item: Any) -> None:
    """A slow watcher must not block the loop or grow memory: drop its oldest step instead."""
    while True:
        try:
            q.put_nowait(item)
            return
        except queue.Full:
            try:
                q.get_nowait()
            except queue.Empty:
                pass


def _weights_dict(weights: Any) -> Mapping[str, Any]:
    """A WeightVersion given as a dict, a dataclass or None, as a plain dict."""
    if weights is None:
        return {}
    if dataclasses.is_dataclass(weights):
        return dataclasses.asdict(weights)
    return dict(weights)


# -- proto conversion ----------------------------------------------------------------------------

_STATE_TO_PROTO = {EnvState.ACTIVE: controller_pb2.ENV_STATE_ACTIVE, EnvState.PAUSED: controller_pb2.ENV_STATE_PAUSED}


def env_record_to_proto(record: EnvRecord) -> controller_pb2.EnvStatus:
    return controller_pb2.EnvStatus(
        spec=wire.env_spec_to_proto(record.spec),
        state=_STATE_TO_PROTO[record.state],
        submitted_step=record.submitted_step,
        groups_sampled=record.groups_sampled,
        success_rate=record.success_rate,
    )


_WEIGHT_ALIASES = {"step": "learner_step", "created_at": "created_unix_s"}  # model.weights.WeightVersion's names


def _weights_proto(weights: Mapping[str, Any]) -> weights_pb2.WeightVersion:
    """Keys as in weights.proto, or as in `model.weights.WeightVersion` (`step`, `created_at`);
    `format` may be an enum member, its name ("orbax", "WEIGHT_FORMAT_ORBAX") or the proto number.
    Other keys are ignored (they are not on the wire)."""
    weights = {_WEIGHT_ALIASES.get(k, k): v for k, v in weights.items()}
    message = weights_pb2.WeightVersion()
    for key in ("version", "learner_step"):
        if weights.get(key) is not None:
            setattr(message, key, int(weights[key]))
    for key in ("location", "digest"):
        if weights.get(key) is not None:
            setattr(message, key, str(weights[key]))
    if weights.get("created_unix_s") is not None:
        message.created_unix_s = float(weights["created_unix_s"])
    fmt = weights.get("format")
    if isinstance(fmt, enum.Enum):
        fmt = fmt.value if isinstance(fmt.value, int) else fmt.name
    if isinstance(fmt, str) and fmt:
        name = fmt.upper()
        message.format = weights_pb2.WeightFormat.Value(name if name.startswith("WEIGHT_FORMAT_") else f"WEIGHT_FORMAT_{name}")
    elif isinstance(fmt, int):
        message.format = fmt
    return message


def run_snapshot_to_proto(snapshot: RunSnapshot) -> controller_pb2.GetRunStatusResponse:
    return controller_pb2.GetRunStatusResponse(
        step=snapshot.step,
        total_steps=snapshot.total_steps,
        mode=snapshot.mode,
        weights=_weights_proto(snapshot.weights),
        rollout_workers=snapshot.rollout_workers,
        finished=snapshot.finished,
        latest_metrics=dict(snapshot.latest_metrics),
    )


# -- the servicer --------------------------------------------------------------------------------


def _rpc(method: Callable) -> Callable:
    """Map our exceptions to status codes; anything unexpected becomes INTERNAL with one line."""

    def handler(self, request, context):
        try:
            return method(self, request, context)
        except validation.SpecError as error:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        except UnknownEnvError as error:
            context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        except DuplicateEnvError as error:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, str(error))
        except Exception as error:  # noqa: BLE001 - the client gets one line; the log gets the traceback
            if isinstance(error, grpc.RpcError) or not context.is_active():
                raise  # context.abort's own exception, or the client already left
            logger.exception("ControllerService.%s failed", method.__name__)
            context.abort(grpc.StatusCode.INTERNAL, f"{method.__name__}: {type(error).__name__}: {error}")

    handler.__name__ = method.__name__
    handler.__doc__ = method.__doc__
    return handler


class ControllerServicer(controller_pb2_grpc.ControllerServiceServicer):
    """ControllerService over an `EnvRegistry` and a `RunStatusSource`.

    `current_step` gives the learner step stamped on submissions (default: the status's step).
    """

    def __init__(self, registry: EnvRegistry, status: RunStatusSource,
                 current_step: Callable[[], int] | None = None):
        self.registry = registry
        self.status = status
        self._current_step = current_step or (lambda: status.snapshot().step)

    @_rpc
    def SubmitEnv(self, request, context):
        validation.check_message_size(request.spec.ByteSize(), self.registry.limits)
        if not request.HasField("spec"):
            raise validation.SpecError("SubmitEnvRequest.spec", "must be set", None)
        try:
            spec = wire.env_spec_from_proto(request.spec)
        except ValueError as error:  # a Struct field that is not plain JSON, e.g. NaN in args
            raise validation.SpecError("EnvSpec", "must hold plain JSON values", str(error)) from None
        record = self.registry.submit(spec, replace=request.replace, step=self._current_step())
        logger.info("env %r submitted (kind %s, replace=%s) by %s", spec.name, spec.kind, request.replace, context.peer())
        return controller_pb2.SubmitEnvResponse(env=env_record_to_proto(record))

    @_rpc
    def ListEnvs(self, request, context):
        return controller_pb2.ListEnvsResponse(envs=[env_record_to_proto(r) for r in self.registry.list()])

    @_rpc
    def GetEnv(self, request, context):
        return controller_pb2.GetEnvResponse(env=env_record_to_proto(self.registry.get(request.name)))

    @_rpc
    def PauseEnv(self, request, context):
        return controller_pb2.PauseEnvResponse(env=env_record_to_proto(self.registry.pause(request.name)))

    @_rpc
    def ResumeEnv(self, request, context):
        return controller_pb2.ResumeEnvResponse(env=env_record_to_proto(self.registry.resume(request.name)))

    @_rpc
    def RemoveEnv(self, request, context):
        self.registry.remove(request.name)
        logger.info("env %r removed by %s", request.name, context.peer())
        return controller_pb2.RemoveEnvResponse()

    @_rpc
    def GetRunStatus(self, request, context):
        return run_snapshot_to_proto(self.status.snapshot())

    def StreamMetrics(self, request, context) -> Iterator[controller_pb2.StreamMetricsResponse]:
        """One message per step until the run ends (None from the queue) or the client leaves."""
        q = self.status.subscribe()
        try:
            while context.is_active():
                try:
                    item = q.get(timeout=STREAM_POLL_S)
                except queue.Empty:
                    continue
                if item is None:
                    return
                step, metrics = item
                chosen = {k: v for k, v in metrics.items() if k.startswith(request.prefix)}
                yield controller_pb2.StreamMetricsResponse(step=step, metrics=chosen)
        finally:
            self.status.unsubscribe(q)


# -- the server ----------------------------------------------------------------------------------


def serve_controller(
    registry: EnvRegistry,
    status: RunStatusSource,
    listen: str = "127.0.0.1:0",
    *,
    security: ServerSecurity = ServerSecurity(),
    max_workers: int = 16,
) -> tuple[grpc.Server, int]:
    """Start ControllerService (+ reflection + health) on `listen`; return (server, bound port).

    `security` guards the door (orrery/security.py): without a TLS certificate and a tokens file
    only a loopback address is accepted, since env submission makes the workers run what the
    client chose; with a tokens file every call needs a token with the method's role; env
    changes are rate-limited per client. Each metrics stream holds one of the `max_workers`
    threads while it lasts, so at most `max_workers` streams and calls run at once and further
    ones queue up to a bound, then get RESOURCE_EXHAUSTED. Stop with `server.stop(grace)`.
    """
    # Room for the largest spec we accept, so an oversized one gets check_message_size's error.
    max_message = registry.limits.max_spec_bytes + (64 << 10)
    server, _ = make_server(
        "ControllerService", listen, security, max_workers=max_workers, max_receive_bytes=max_message,
        max_send_bytes=64 << 20, thread_name_prefix="controller-grpc", rate_limited=RATE_LIMITED,
        maximum_concurrent_rpcs=4 * max_workers)
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(ControllerServicer(registry, status), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    port = bind(server, "ControllerService", listen, security)
    server.start()
    logger.info("ControllerService listening on %s (port %d)", listen, port)
    return server, port
