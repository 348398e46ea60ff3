"""RolloutService over gRPC: the controller's door into one rollout worker.

What it is: `RolloutServicer` adapts a `RolloutWorker` to `orrery.v1.RolloutService`
(RolloutGroup server-stream, UpdateWeights, GetInfo, Abort), and `serve()` builds a server
with standard health checking (`grpc.health.v1.Health`, SERVING while the engine is healthy,
NOT_SERVING once it is not) and server reflection listing RolloutService and Health.

Errors become status codes the client can act on:
    INVALID_ARGUMENT     malformed request (bad env spec, group_size 0, version going down)
    FAILED_PRECONDITION  a snapshot that is unreadable or fails its digest (old weights kept)
    RESOURCE_EXHAUSTED   the worker already serves max_concurrent_groups groups
    UNAVAILABLE          the engine is dead or closed
    DEADLINE_EXCEEDED    a weight switch that did not happen in time
A client cancelling a RolloutGroup (or its deadline passing) aborts the group's episodes.

Access control (`orrery.security`, before any handler here runs): with a tokens file every call
needs a token with role `internal` (GetInfo also accepts `read`), else UNAUTHENTICATED or
PERMISSION_DENIED; a listen address other than loopback needs TLS and a tokens file. Health is
open. Hostile input is bounded here: a group's env spec passes the same validation as a client's
submission (`sandbox.validation`), `group_size` is at most MAX_GROUP_SIZE, and a WeightVersion is
loaded only from inside the worker's weights roots (symlinks resolved; INVALID_ARGUMENT naming
`WeightVersion.location` otherwise; a worker started without roots loads no updates).

What it is not: a load balancer.
"""

from __future__ import annotations

import logging
import threading

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from model.weights import SnapshotError
from orrery.security import SecurityError, ServerSecurity, bind, check_listen, inside_roots, make_server
from orrery.v1 import rollout_pb2, rollout_pb2_grpc
from rollout import wire
from rollout.api import EngineError
from rollout.worker import RolloutWorker, WorkerBusyError
from sandbox import validation

logger = logging.getLogger(__name__)

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
_MAX_MESSAGE = 64 << 20  # trajectories are token lists; long multi-turn episodes exceed 4 MiB
_MAX_REQUEST = validation.SpecLimits().max_spec_bytes + (1 << 20)  # a group request is a spec, a task and a few fields
MAX_GROUP_SIZE = 1024  # samples of one group; the controller sends tens


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, worker: RolloutWorker, weights_roots: tuple[str, ...] = ()):
        self.worker = worker
        self.weights_roots = tuple(weights_roots)

    def RolloutGroup(self, request, context):
        try:
            group = wire.group_request_from_proto(request)
            validation.validate_env_spec(group.env)
            validation.validate_task(group.task, "RolloutGroupRequest.task")
            if not 1 <= group.group_size <= MAX_GROUP_SIZE:
                raise validation.SpecError("RolloutGroupRequest.group_size",
                                           f"must be between 1 and {MAX_GROUP_SIZE}", group.group_size)
        except (ValueError, KeyError, TypeError) as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"RolloutGroup request: {e}")
        abort = threading.Event()
        # The client's deadline or cancel ends the RPC, which runs this callback: the group's
        # unfinished episodes stop (ABORTED) instead of running on for nobody.
        context.add_callback(abort.set)
        try:
            for trajectory in self.worker.rollout_group(
                    group, self.worker.config.group_deadline_s, abort):
                yield rollout_pb2.RolloutGroupResponse(
                    trajectory=wire.trajectory_to_proto(trajectory))
        except WorkerBusyError as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def UpdateWeights(self, request, context):
        try:
            version = wire.weight_version_from_proto(request.version)
            if not self.weights_roots:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              "UpdateWeights: this worker was started without --weights-root, so it "
                              "loads no weight updates")
            inside_roots(version.location, self.weights_roots, "WeightVersion.location")
            ack = self.worker.update_weights(version, context.time_remaining() or 0.0)
        except SecurityError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except SnapshotError as e:  # before ValueError: it is one
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except EngineError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except TimeoutError as e:
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(e))
        return wire.weight_ack_to_proto(ack)

    def GetInfo(self, request, context):
        return wire.worker_info_to_proto(self.worker.info())

    def Abort(self, request, context):
        return rollout_pb2.AbortResponse(aborted=self.worker.abort(request.group_id))


class RunningServer:
    """A started server: its bound port, and `stop()`."""

    def __init__(self, server: grpc.Server, port: int, health_servicer: health.HealthServicer,
                 worker: RolloutWorker):
        self.server, self.port, self.health, self.worker = server, port, health_servicer, worker
        self._stopped = threading.Event()
        self._watcher = threading.Thread(target=self._watch_health, daemon=True,
                                         name="rollout-health")
        self._watcher.start()

    def _watch_health(self) -> None:
        status = None
        while not self._stopped.wait(0.5 if status is not None else 0.0):
            new = (health_pb2.HealthCheckResponse.SERVING if self.worker.healthy
                   else health_pb2.HealthCheckResponse.NOT_SERVING)
            if new != status:
                for name in ("", SERVICE_NAME):
                    self.health.set(name, new)
                status = new

    def wait(self) -> None:
        self.server.wait_for_termination()

    def stop(self, grace_s: float) -> None:
        self._stopped.set()
        self.health.enter_graceful_shutdown()
        self.worker.abort("")
        self.server.stop(grace_s).wait()


def serve(worker: RolloutWorker, listen: str, *, security: ServerSecurity = ServerSecurity(),
          weights_roots: tuple[str, ...] = ()) -> RunningServer:
    """Start RolloutService + Health + reflection on `listen` (host:port; port 0 picks one).

    `security`: TLS and tokens (required beyond loopback). `weights_roots`: the folders weight
    snapshots may be loaded from (the controller's run_dir/weights); none, no updates."""
    check_listen("RolloutService", listen, security)  # before anything else is built
    threads = worker.config.max_concurrent_groups + 8
    server, _ = make_server("RolloutService", listen, security, max_workers=threads,
                            max_receive_bytes=_MAX_REQUEST, max_send_bytes=_MAX_MESSAGE,
                            thread_name_prefix="rpc", maximum_concurrent_rpcs=4 * threads)
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(worker, weights_roots), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = bind(server, "RolloutService", listen, security)
    server.start()
    return RunningServer(server, port, health_servicer, worker)
