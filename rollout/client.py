"""RolloutClient: the controller's handle on one rollout worker over gRPC (`rollout.api.Rollout`).

Every call has a deadline (DESIGN.md rule 4): the ones the caller passes, and
`default_deadline_s` for `abort`. Any `grpc.RpcError`, including one raised while a
RolloutGroup stream is being read, becomes `RolloutError` carrying the method, the peer
address and the status code, so the controller can tell a busy worker (RESOURCE_EXHAUSTED) from
a bad snapshot (FAILED_PRECONDITION) from a lost one (UNAVAILABLE, DEADLINE_EXCEEDED) and mark
the group's unfinished samples as infra errors.
"""

from __future__ import annotations

from typing import Iterator

import grpc

from model.weights import WeightVersion
from orrery.security import ClientSecurity, client_channel
from orrery.v1 import rollout_pb2, rollout_pb2_grpc
from rollout import wire
from rollout.api import GroupRequest, Trajectory, WeightAck, WorkerInfo

_MAX_MESSAGE = 64 << 20


class RolloutError(RuntimeError):
    """A RolloutService call failed: `method`, `peer`, `code` (grpc.StatusCode), `details`."""

    def __init__(self, method: str, peer: str, code: grpc.StatusCode | str, details: str):
        name = getattr(code, "name", code)
        super().__init__(f"RolloutService/{method} at {peer} failed with {name}: {details}")
        self.method, self.peer, self.code, self.details = method, peer, code, details


class RolloutClient:
    """Implements `rollout.api.Rollout` against `python -m rollout.server` at `address`."""

    def __init__(self, address: str, *, default_deadline_s: float = 30.0,
                 security: ClientSecurity = ClientSecurity()):
        """`security`: the worker's CA (TLS) and where the token (role `internal`) is."""
        self.address = address
        self.default_deadline_s = default_deadline_s
        self._channel = client_channel(address, security, max_receive_bytes=_MAX_MESSAGE,
                                       max_send_bytes=_MAX_MESSAGE)
        self._stub = rollout_pb2_grpc.RolloutServiceStub(self._channel)

    def _error(self, method: str, e: grpc.RpcError) -> RolloutError:
        return RolloutError(method, self.address, e.code(), e.details() or "")

    def rollout_group(self, request: GroupRequest, deadline_s: float) -> Iterator[Trajectory]:
        """Stream trajectories as the worker finishes them; the deadline covers the whole group."""
        call = self._stub.RolloutGroup(wire.group_request_to_proto(request), timeout=deadline_s)
        try:
            for response in call:
                yield wire.trajectory_from_proto(response.trajectory)
        except grpc.RpcError as e:
            raise self._error("RolloutGroup", e) from e
        finally:
            call.cancel()  # no-op when finished; stops the worker's episodes if we left early

    def update_weights(self, version: WeightVersion, deadline_s: float) -> WeightAck:
        request = rollout_pb2.UpdateWeightsRequest(version=wire.weight_version_to_proto(version))
        try:
            return wire.weight_ack_from_proto(self._stub.UpdateWeights(request, timeout=deadline_s))
        except grpc.RpcError as e:
            raise self._error("UpdateWeights", e) from e

    def info(self, deadline_s: float) -> WorkerInfo:
        try:
            return wire.worker_info_from_proto(
                self._stub.GetInfo(rollout_pb2.GetInfoRequest(), timeout=deadline_s))
        except grpc.RpcError as e:
            raise self._error("GetInfo", e) from e

    def abort(self, group_id: str, deadline_s: float | None = None) -> int:
        """Abort the worker's groups with this id ("" for all); returns how many it aborted."""
        try:
            response = self._stub.Abort(rollout_pb2.AbortRequest(group_id=group_id),
                                        timeout=deadline_s or self.default_deadline_s)
        except grpc.RpcError as e:
            raise self._error("Abort", e) from e
        return response.aborted

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
