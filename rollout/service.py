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

What it is not: authentication (issue 8) or a load balancer.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from model.weights import SnapshotError
from orrery.v1 import rollout_pb2, rollout_pb2_grpc
from rollout import wire
from rollout.api import EngineError
from rollout.worker import RolloutWorker, WorkerBusyError

logger = logging.getLogger(__name__)

SERVICE_NAME = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].full_name
_MAX_MESSAGE = 64 << 20  # trajectories are token lists; long multi-turn episodes exceed 4 MiB


class RolloutServicer(rollout_pb2_grpc.RolloutServiceServicer):
    def __init__(self, worker: RolloutWorker):
        self.worker = worker

    def RolloutGroup(self, request, context):
        try:
            group = wire.group_request_from_proto(request)
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
            ack = self.worker.update_weights(version, context.time_remaining() or 0.0)
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


def serve(worker: RolloutWorker, listen: str) -> RunningServer:
    """Start RolloutService + Health + reflection on `listen` (host:port; port 0 picks one)."""
    threads = worker.config.max_concurrent_groups + 8
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rpc"),
        options=[("grpc.max_send_message_length", _MAX_MESSAGE),
                 ("grpc.max_receive_message_length", _MAX_MESSAGE)])
    rollout_pb2_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(worker), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"rollout server could not bind {listen}")
    server.start()
    return RunningServer(server, port, health_servicer, worker)
