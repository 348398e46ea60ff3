"""Opening environments: built-in ones locally, remote ones over gRPC (`RemoteEnv`). A wire file.

`open_env(spec, task, config)` is what the rollout loop calls; `list_remote_tasks(spec)` is what
the controller calls for kind "remote". Every RPC has a deadline (`remote_timeout_s`). Failures
become `EnvInfraError`, never rewards (DESIGN.md rule 3), carrying method, address and status:

    UNAVAILABLE (refused, reset, server gone)   -> ENV_UNREACHABLE, retried
    DEADLINE_EXCEEDED                          -> ENV_TIMEOUT, retried except for Step
    ABORTED + orrery-infra-class metadata      -> that class (the env's own infra error), not retried
    anything else (NOT_FOUND session, INTERNAL) -> ENV_UNREACHABLE, not retried

Retries are bounded (`remote_retries`) with exponential backoff from `remote_backoff_s`. Step is
retried only on UNAVAILABLE: a Step that timed out may have run its tool, and running it twice
would change the episode.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

import grpc

from orrery.v1 import env_service_pb2, env_service_pb2_grpc
from sandbox import wire
from sandbox.api import (Env, EnvInfraError, EnvSpec, InfraErrorClass, Outcome, StepResult, Task, ToolCall,
                         ToolSpec)
from sandbox.config import SandboxConfig

INFRA_METADATA_KEY = "orrery-infra-class"  # same value as sandbox.service.INFRA_METADATA_KEY

_channels: dict[str, grpc.Channel] = {}
_channels_lock = threading.Lock()


def _channel(address: str) -> grpc.Channel:
    """One channel per address, shared by every RemoteEnv of this process."""
    with _channels_lock:
        channel = _channels.get(address)
        if channel is None:
            channel = _channels[address] = grpc.insecure_channel(address)
        return channel


def _infra_error(method: str, address: str, error: grpc.RpcError) -> EnvInfraError:
    code = error.code()
    for key, value in error.trailing_metadata() or ():
        if key == INFRA_METADATA_KEY:
            try:
                return EnvInfraError(InfraErrorClass(value), f"{method} at {address}: {error.details()}")
            except ValueError:
                break
    error_class = InfraErrorClass.ENV_TIMEOUT if code == grpc.StatusCode.DEADLINE_EXCEEDED \
        else InfraErrorClass.ENV_UNREACHABLE
    return EnvInfraError(error_class, f"{method} at {address}: {code.name}: {error.details()}")


class EnvServiceClient:
    """Deadlines, bounded retries and error mapping around the EnvService stub."""

    def __init__(self, address: str, config: SandboxConfig):
        self.address = address
        self.config = config
        self.stub = env_service_pb2_grpc.EnvServiceStub(_channel(address))

    def call(self, method: str, request, retry_on_timeout: bool = True):
        retryable = {grpc.StatusCode.UNAVAILABLE} | ({grpc.StatusCode.DEADLINE_EXCEEDED} if retry_on_timeout else set())
        delay = self.config.remote_backoff_s
        for attempt in range(self.config.remote_retries + 1):
            try:
                return getattr(self.stub, method)(request, timeout=self.config.remote_timeout_s)
            except grpc.RpcError as error:
                if error.code() not in retryable or attempt == self.config.remote_retries:
                    raise _infra_error(method, self.address, error) from None
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")


class RemoteEnv:
    """An `Env` whose episode lives in a remote EnvService. Implements `sandbox.api.Env`."""

    def __init__(self, spec: EnvSpec, task: Task, config: SandboxConfig | None = None):
        self.spec = spec
        self.task = task
        self.client = EnvServiceClient(spec.remote_address, config or SandboxConfig())
        self.session_id = ""
        self._tools: tuple[ToolSpec, ...] = ()

    def reset(self) -> str:
        request = env_service_pb2.ResetRequest(task=wire.task_to_proto(self.task), args=wire.args_to_proto(self.spec.args),
                                               safety=wire.safety_to_proto(self.spec.safety))
        response = self.client.call("Reset", request)
        self.session_id = response.session_id
        self._tools = tuple(wire.tool_spec_from_proto(t) for t in response.tools)
        return response.observation

    def tools(self) -> Sequence[ToolSpec]:
        return self.spec.tools or self._tools

    def step(self, call: ToolCall) -> StepResult:
        request = env_service_pb2.StepRequest(session_id=self.session_id, call=wire.tool_call_to_proto(call))
        return wire.step_result_from_proto(self.client.call("Step", request, retry_on_timeout=False))

    def outcome(self, answer: str | None) -> Outcome:
        request = env_service_pb2.ScoreRequest(session_id=self.session_id)
        if answer is not None:
            request.answer = answer
        return wire.outcome_from_proto(self.client.call("Score", request))

    def close(self) -> None:
        if not self.session_id:
            return
        session_id, self.session_id = self.session_id, ""
        try:
            self.client.call("Close", env_service_pb2.CloseRequest(session_id=session_id))
        except EnvInfraError:
            pass  # the server's janitor closes idle sessions


def list_remote_tasks(spec: EnvSpec, config: SandboxConfig | None = None) -> list[Task]:
    """The tasks a remote EnvService offers for `spec.args`."""
    client = EnvServiceClient(spec.remote_address, config or SandboxConfig())
    response = client.call("ListTasks", env_service_pb2.ListTasksRequest(args=wire.args_to_proto(spec.args)))
    return [wire.task_from_proto(t) for t in response.tasks]


def list_tasks(spec: EnvSpec, config: SandboxConfig | None = None) -> list[Task]:
    """Tasks of any env: explicit, generated by a built-in kind, or listed by the remote server."""
    if spec.tasks:
        return list(spec.tasks)
    if spec.kind == "remote":
        return list_remote_tasks(spec, config)
    from sandbox.envs import generate_tasks

    return generate_tasks(spec)


def open_env(spec: EnvSpec, task: Task, config: SandboxConfig | None = None) -> Env:
    """One episode of `task`: a built-in env, or a RemoteEnv for kind "remote". Call reset() first."""
    if spec.kind == "remote":
        return RemoteEnv(spec, task, config)
    from sandbox.envs import make_env

    return make_env(spec, task, config)


def env_opener(config: SandboxConfig) -> Callable[[EnvSpec, Task], Env]:
    """`open_env` with the config bound, in the (spec, task) shape the rollout loop takes."""
    return lambda spec, task: open_env(spec, task, config)
