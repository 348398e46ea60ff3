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

A remote env is not trusted either: answers larger than 16 MiB are refused by the channel, and
a step's observation and tool output are cut to `max_output_bytes` like a local tool's. A
guarded EnvService (orrery/security.py) is reached with the process's environment:
ORRERY_ENV_TOKEN_FILE (or ORRERY_ENV_TOKEN) holds the bearer token (role `internal`),
ORRERY_ENV_TLS_CA the CA of its certificate, ORRERY_ENV_TLS_CERT / ORRERY_ENV_TLS_KEY a client
certificate for mutual TLS. A token is never sent in clear beyond loopback.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Callable, Sequence

import grpc

from orrery.security import ClientSecurity, SecurityError, client_channel
from orrery.v1 import env_service_pb2, env_service_pb2_grpc
from sandbox import wire
from sandbox.api import (Env, EnvInfraError, EnvSpec, InfraErrorClass, Outcome, StepResult, Task, ToolCall,
                         ToolSpec)
from sandbox.config import SandboxConfig

INFRA_METADATA_KEY = "orrery-infra-class"  # same value as sandbox.service.INFRA_METADATA_KEY

_channels: dict[str, grpc.Channel] = {}
_channels_lock = threading.Lock()


_MAX_ANSWER = 16 << 20


def env_client_security() -> ClientSecurity:
    """How this process reaches guarded EnvServices (from ORRERY_ENV_* variables)."""
    env = os.environ
    return ClientSecurity(token_file=env.get("ORRERY_ENV_TOKEN_FILE", ""), token_env="ORRERY_ENV_TOKEN",
                          tls_ca=env.get("ORRERY_ENV_TLS_CA", ""), tls_cert=env.get("ORRERY_ENV_TLS_CERT", ""),
                          tls_key=env.get("ORRERY_ENV_TLS_KEY", ""))


def _channel(address: str) -> grpc.Channel:
    """One channel per address, shared by every RemoteEnv of this process."""
    with _channels_lock:
        channel = _channels.get(address)
        if channel is None:
            try:
                channel = client_channel(address, env_client_security(), max_receive_bytes=_MAX_ANSWER,
                                         max_send_bytes=_MAX_ANSWER)
            except SecurityError as error:
                raise EnvInfraError(InfraErrorClass.ENV_UNREACHABLE, f"EnvService at {address}: {error}") from None
            _channels[address] = channel
        return channel


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n[truncated]"


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
        step = wire.step_result_from_proto(self.client.call("Step", request, retry_on_timeout=False))
        limit = self.client.config.max_output_bytes
        return dataclasses.replace(step, observation=_cut(step.observation, limit),
                                   result=dataclasses.replace(step.result, output=_cut(step.result.output, limit),
                                                              error=_cut(step.result.error, limit)))

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
