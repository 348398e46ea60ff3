"""`EnvService` server: hosts environments for rollout workers over gRPC (one of the wire files).

What it serves is an `EnvHost`: something that lists tasks and opens one `Env` per episode.
`BuiltinEnvHost` hosts the built-in kinds (`args["kind"]` picks one, else the host's default);
`sandbox/remote_example.py` shows a third-party host with its own env. Each Reset opens a
session (an Env) that lives until Close, or until it has been idle for `session_ttl_s`, when
the janitor closes it (nothing waits forever, DESIGN.md rule 4).

Errors on the wire: an `EnvInfraError` inside the env aborts the RPC with ABORTED and the
trailing metadata `orrery-infra-class` = its class, so the client re-raises the same class; an
unknown session is NOT_FOUND; bad arguments INVALID_ARGUMENT. Server reflection and the standard
health service are on, as for the other services.

Callers are outside the trust boundary (any rollout worker, or whoever reaches the port): a
task is validated like a submitted one (`sandbox.validation`), args are plain JSON of bounded
size, and `BuiltinEnvHost` validates the whole spec it builds (kind, `num_tasks` cap, the
`files` env's workspace-relative paths). Access control (`orrery.security`): with a tokens file
every EnvService call needs a token with role `internal`; a listen address other than loopback
needs TLS and a tokens file (`python -m sandbox.service --tls-cert ... --tokens-file ...`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Mapping, Protocol, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orrery.security import SecurityError, ServerSecurity, bind, check_server, make_server
from orrery.v1 import env_service_pb2, env_service_pb2_grpc
from sandbox import validation, wire
from sandbox.api import Env, EnvInfraError, EnvSpec, SafetyPolicy, Task
from sandbox.config import SandboxConfig

log = logging.getLogger(__name__)

SERVICE_NAME = "orrery.v1.EnvService"
INFRA_METADATA_KEY = "orrery-infra-class"
_MAX_REQUEST = 8 << 20  # a task, args and a tool call: far below this (SpecLimits)
_MAX_RESPONSE = 64 << 20  # ListTasks of up to SpecLimits.max_tasks tasks


class EnvHost(Protocol):
    """What an EnvService hosts."""

    def list_tasks(self, args: Mapping[str, Any]) -> Sequence[Task]:
        """The tasks for these env arguments (deterministic)."""

    def open(self, task: Task, args: Mapping[str, Any], safety: SafetyPolicy) -> Env:
        """A fresh episode of `task`; the service calls reset() on it."""


class BuiltinEnvHost:
    """Hosts `sandbox.envs` kinds. `args["kind"]` chooses one (default `default_kind`)."""

    def __init__(self, default_kind: str = "calc", config: SandboxConfig | None = None):
        self.default_kind = default_kind
        self.config = config or SandboxConfig()

    def _spec(self, args: Mapping[str, Any], safety: SafetyPolicy = SafetyPolicy()) -> EnvSpec:
        args = dict(args)
        kind = args.pop("kind", self.default_kind)
        eval_fraction = args.pop("eval_fraction", 0.0)
        spec = EnvSpec(name=f"hosted-{kind}", kind=str(kind)[:64], args=args, safety=safety,
                       eval_fraction=eval_fraction)
        from sandbox.envs import KINDS

        return validation.validate_env_spec(spec, known_kinds=KINDS)  # no "remote" here: KINDS only

    def list_tasks(self, args):
        from sandbox.envs import generate_tasks

        return generate_tasks(self._spec(args))

    def open(self, task, args, safety):
        from sandbox.envs import make_env

        spec = self._spec(args, safety)
        validation.validate_task(task, "ResetRequest.task", kind=spec.kind)
        return make_env(spec, task, self.config)


class _Session:
    def __init__(self, env: Env):
        self.env = env
        self.lock = threading.Lock()
        self.last_used = time.monotonic()


class EnvServicer(env_service_pb2_grpc.EnvServiceServicer):
    def __init__(self, host: EnvHost, session_ttl_s: float = 900.0):
        self.host = host
        self.session_ttl_s = session_ttl_s
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._janitor = threading.Thread(target=self._close_idle, name="env-sessions", daemon=True)
        self._janitor.start()

    # -- helpers --------------------------------------------------------------------------------

    def _session(self, session_id: str, context) -> _Session:
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no session {session_id!r} (closed, expired or server restarted)")
        session.last_used = time.monotonic()
        return session

    @staticmethod
    def _abort_infra(context, error: EnvInfraError) -> None:
        context.set_trailing_metadata(((INFRA_METADATA_KEY, error.error_class.value),))
        context.abort(grpc.StatusCode.ABORTED, str(error))

    def _close_idle(self) -> None:
        while not self._stopped.wait(timeout=min(self.session_ttl_s / 4, 30.0)):
            now = time.monotonic()
            with self._lock:
                idle = [k for k, s in self._sessions.items() if now - s.last_used > self.session_ttl_s]
                sessions = [self._sessions.pop(k) for k in idle]
            for s in sessions:
                log.warning("closing an env session idle for over %.0fs", self.session_ttl_s)
                with s.lock:
                    s.env.close()

    def shutdown(self) -> None:
        self._stopped.set()
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            s.env.close()

    # -- RPCs -----------------------------------------------------------------------------------

    def ListTasks(self, request, context):
        try:
            args = self._args(request.args)
            tasks = self.host.list_tasks(args)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        limit = validation.SpecLimits().max_tasks
        if len(tasks) > limit:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ListTasks: at most {limit} tasks, got {len(tasks)}")
        return env_service_pb2.ListTasksResponse(tasks=[wire.task_to_proto(t) for t in tasks])

    @staticmethod
    def _args(message) -> dict:
        args = wire.args_from_proto(message)
        validation.check_json(args, "args")
        return args

    def Reset(self, request, context):
        try:
            task = validation.validate_task(wire.task_from_proto(request.task), "ResetRequest.task")
            args = self._args(request.args)
            safety = wire.safety_from_proto(request.safety) if request.HasField("safety") else SafetyPolicy()
            for i, path in enumerate(safety.protected_paths):
                validation.check_workspace_path(path, f"ResetRequest.safety.protected_paths[{i}]")
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        try:
            env = self.host.open(task, args, safety)
            observation = env.reset()
            tools = list(env.tools())
        except EnvInfraError as e:
            self._abort_infra(context, e)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        session_id = uuid.uuid4().hex
        with self._lock:
            self._sessions[session_id] = _Session(env)
        return env_service_pb2.ResetResponse(session_id=session_id, observation=observation,
                                             tools=[wire.tool_spec_to_proto(t) for t in tools])

    def Step(self, request, context):
        session = self._session(request.session_id, context)
        try:
            call = wire.tool_call_from_proto(request.call)
            validation.check_json(call.arguments, "StepRequest.call.arguments_json")
            if not isinstance(call.arguments, dict):
                raise validation.SpecError("StepRequest.call.arguments_json", "must be a JSON object",
                                           request.call.arguments_json)
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        with session.lock:
            try:
                step = session.env.step(call)
            except EnvInfraError as e:
                self._abort_infra(context, e)
        return wire.step_result_to_proto(step)

    def Score(self, request, context):
        session = self._session(request.session_id, context)
        with session.lock:
            try:
                outcome = session.env.outcome(request.answer if request.HasField("answer") else None)
            except EnvInfraError as e:
                self._abort_infra(context, e)
        return wire.outcome_to_proto(outcome)

    def Close(self, request, context):
        with self._lock:
            session = self._sessions.pop(request.session_id, None)
        if session is not None:
            with session.lock:
                session.env.close()
        return env_service_pb2.CloseResponse()


def serve_env(host: EnvHost, listen: str = "127.0.0.1:0", *, max_workers: int = 8,
              session_ttl_s: float = 900.0, security: ServerSecurity = ServerSecurity()
              ) -> tuple[grpc.Server, int, EnvServicer]:
    """Start EnvService (+ reflection + health) on `listen`; return (server, bound port, servicer).

    `security`: TLS and tokens (required beyond loopback; callers need role `internal`)."""
    server, _ = make_server("EnvService", listen, security, max_workers=max_workers,
                            max_receive_bytes=_MAX_REQUEST, max_send_bytes=_MAX_RESPONSE,
                            thread_name_prefix="env-grpc", maximum_concurrent_rpcs=8 * max_workers)
    servicer = EnvServicer(host, session_ttl_s)
    env_service_pb2_grpc.add_EnvServiceServicer_to_server(servicer, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), server)
    port = bind(server, "EnvService", listen, security)
    server.start()
    log.info("EnvService listening on %s (port %d)", listen, port)
    return server, port, servicer


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m sandbox.service --listen 127.0.0.1:50070 --kind calc`: host the built-in envs."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--listen", default="127.0.0.1:50070")
    parser.add_argument("--kind", default="calc", help="default built-in kind (args['kind'] overrides)")
    parser.add_argument("--isolation", default="bwrap", choices=("bwrap", "none"))
    parser.add_argument("--tls-cert", default="", help="PEM server certificate (TLS)")
    parser.add_argument("--tls-key", default="", help="PEM key of --tls-cert")
    parser.add_argument("--tls-client-ca", default="", help="PEM CA; clients must present a certificate it signed")
    parser.add_argument("--tokens-file", default="", help="tokens file (name, sha256, roles); set, calls need a token")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    security = ServerSecurity(tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca,
                              tokens_file=args.tokens_file)
    try:
        check_server("EnvService", args.listen, security)
    except SecurityError as error:
        parser.exit(2, f"error: {error}\n")
    server, port, _ = serve_env(BuiltinEnvHost(args.kind, SandboxConfig(isolation=args.isolation)), args.listen,
                                security=security)
    print(f"listening on port {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
