"""ControllerService on a real gRPC server on loopback: env management, errors, status, metrics stream,
reflection and health.

Proves the status codes and exact messages clients see (field, rule and value for invalid specs),
that StreamMetrics delivers the steps the loop logs and ends with the run or when the client leaves,
and that standard tools can discover the service. Run: `.venv/bin/python -m pytest tests/controller/test_service.py`.
"""

import dataclasses
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from controller.client import ControllerClient, ControllerError
from controller.registry import EnvRegistry, EnvState
from controller.service import RunStatus, serve_controller
from orrery.v1 import controller_pb2, controller_pb2_grpc
from sandbox import api, validation, wire

KINDS = ("calc", "code", "files")


@pytest.fixture
def served():
    registry = EnvRegistry(known_kinds=KINDS, limits=validation.SpecLimits(max_spec_bytes=20_000))
    status = RunStatus(total_steps=10, mode="async", rollout_workers=2)
    server, port = serve_controller(registry, status)
    client = ControllerClient(f"127.0.0.1:{port}", deadline_s=5)
    yield registry, status, client, port
    client.close()
    status.close()
    server.stop(None)


def calc(name="calc-a", **kw):
    return api.EnvSpec(name=name, kind="calc", args={"level": 2}, **kw)


def test_submit_list_get_pause_resume_remove(served):
    registry, status, client, _ = served
    status.log(4, {"reward/mean": 0.5})
    record = client.submit(calc())
    assert (record.name, record.state, record.submitted_step) == ("calc-a", EnvState.ACTIVE, 4)
    assert record.spec == calc()
    client.submit(calc("calc-b", mixture_weight=2.0))
    assert [r.name for r in client.list_envs()] == ["calc-a", "calc-b"]
    assert client.get_env("calc-b").spec.mixture_weight == 2.0
    assert client.pause("calc-a").state is EnvState.PAUSED
    assert registry.get("calc-a").state is EnvState.PAUSED  # the loop sees it
    assert client.resume("calc-a").state is EnvState.ACTIVE
    client.remove("calc-a")
    assert [r.name for r in registry.list()] == ["calc-b"]


def test_invalid_spec_is_invalid_argument_with_field_rule_value(served):
    _, _, client, port = served
    with pytest.raises(ControllerError) as error:
        client.submit(calc(budgets=api.Budgets(max_turns=0)))
    e = error.value
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details == "EnvSpec.budgets.max_turns: must be an integer between 1 and 64, got 0"
    assert (e.method, e.peer) == ("SubmitEnv", f"127.0.0.1:{port}")
    assert str(e) == (f"SubmitEnv to 127.0.0.1:{port} failed: INVALID_ARGUMENT: "
                      "EnvSpec.budgets.max_turns: must be an integer between 1 and 64, got 0")
    with pytest.raises(ControllerError) as error:
        client.submit(api.EnvSpec(name="x", kind="chess"))
    assert error.value.details == "EnvSpec.kind: must be one of ['calc', 'code', 'files', 'remote'], got 'chess'"


def test_oversized_and_missing_spec_are_invalid_argument(served):
    _, _, client, port = served
    big = calc(tasks=tuple(api.Task(f"t{i}", "x" * 1000) for i in range(30)))  # ~30 kB > 20 kB limit
    with pytest.raises(ControllerError) as error:
        client.submit(big)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details.startswith("EnvSpec: serialised size must be at most 20000 bytes, got ")
    stub = controller_pb2_grpc.ControllerServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    with pytest.raises(grpc.RpcError) as error:
        stub.SubmitEnv(controller_pb2.SubmitEnvRequest(), timeout=5)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "SubmitEnvRequest.spec: must be set, got None"


def test_duplicate_is_already_exists_and_replace_works(served):
    _, _, client, _ = served
    client.submit(calc())
    with pytest.raises(ControllerError) as error:
        client.submit(calc(mixture_weight=3.0))
    assert error.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert "'calc-a'" in error.value.details
    assert client.submit(calc(mixture_weight=3.0), replace=True).spec.mixture_weight == 3.0


def test_unknown_env_is_not_found(served):
    _, _, client, _ = served
    client.submit(calc())
    for call in (client.get_env, client.pause, client.resume, client.remove):
        with pytest.raises(ControllerError) as error:
            call("nope")
        assert error.value.code == grpc.StatusCode.NOT_FOUND
        assert error.value.details == "no env named 'nope'; registered envs: 'calc-a'"


def test_unexpected_error_is_internal_one_line(served):
    registry, _, client, _ = served

    def broken(name):
        raise RuntimeError("disk on fire")

    registry.get = broken
    with pytest.raises(ControllerError) as error:
        client.get_env("x")
    assert error.value.code == grpc.StatusCode.INTERNAL
    assert error.value.details == "GetEnv: RuntimeError: disk on fire"


def test_run_status(served):
    _, status, client, _ = served
    status.update(weights={"version": 3, "learner_step": 6, "location": "/ckpt/3", "format": "orbax",
                           "digest": "abc", "created_unix_s": 1.5})
    status.log(6, {"rollout/success_rate": 0.25, "learner/loss": -0.5})
    s = client.status()
    assert (s.step, s.total_steps, s.mode, s.rollout_workers, s.finished) == (6, 10, "async", 2, False)
    assert s.weights == {"version": 3, "learner_step": 6, "location": "/ckpt/3", "format": 1, "digest": "abc",
                         "created_unix_s": 1.5}
    assert s.latest_metrics == {"rollout/success_rate": 0.25, "learner/loss": -0.5}
    status.close()
    assert client.status().finished


@dataclasses.dataclass(frozen=True)
class ModelWeightVersion:
    """Same fields as model.weights.WeightVersion (importing it would pull in jax)."""

    version: int
    step: int
    location: str
    format: str
    digest: str
    created_at: float


def test_run_status_takes_the_model_weight_version_dataclass(served):
    _, status, client, _ = served
    status.update(weights=ModelWeightVersion(4, 8, "/w/4", "hf_safetensors", "sha256:ab", 2.0))
    assert client.status().weights == {"version": 4, "learner_step": 8, "location": "/w/4", "format": 2,
                                       "digest": "sha256:ab", "created_unix_s": 2.0}
    with pytest.raises(TypeError, match="unknown fields \\['steps'\\]"):
        status.update(steps=3)


def test_stream_metrics_delivers_steps_and_ends_with_the_run(served):
    _, status, client, _ = served
    received = []
    watcher = threading.Thread(target=lambda: received.extend(client.watch(prefix="rollout/")))
    watcher.start()
    _wait_for(lambda: status.subscriber_count == 1)
    for step in (1, 2, 3):
        status.log(step, {"rollout/success_rate": step / 10, "learner/loss": 1.0})
    status.close()
    watcher.join(timeout=5)
    assert not watcher.is_alive()
    assert received == [(1, {"rollout/success_rate": 0.1}), (2, {"rollout/success_rate": 0.2}),
                        (3, {"rollout/success_rate": 0.3})]
    assert list(client.watch()) == []  # subscribing after the end returns at once


def test_stream_metrics_ends_when_the_client_leaves(served):
    _, status, client, _ = served
    stream = client.watch()
    status_thread = threading.Thread(target=lambda: [status.log(1, {"a": 1.0})] if _wait_for(
        lambda: status.subscriber_count == 1) else None)
    status_thread.start()
    assert next(stream) == (1, {"a": 1.0})
    stream.close()  # cancels the RPC
    status_thread.join()
    _wait_for(lambda: status.subscriber_count == 0)  # the handler noticed and unsubscribed


def test_reflection_lists_the_controller_service(served):
    *_, port = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = set(database.get_services())
        assert {"orrery.v1.ControllerService", "grpc.reflection.v1alpha.ServerReflection"} <= services
        symbol = database.FindFileContainingSymbol("orrery.v1.ControllerService")
        assert symbol.name == "orrery/v1/controller.proto"


def test_health_is_serving(served):
    *_, port = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "orrery.v1.ControllerService"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_non_loopback_without_credentials_is_refused():
    with pytest.raises(ValueError, match="not a loopback address"):
        serve_controller(EnvRegistry(known_kinds=KINDS), RunStatus(), listen="0.0.0.0:0")


def test_wire_spec_from_client_equals_registry_spec(served):
    registry, _, client, _ = served
    s = calc(tasks=(api.Task("t1", "What is 1 + 1?", verifier={"answer": 2}),), sampling=api.SamplingOverrides(top_p=0.9))
    client.submit(s)
    assert registry.get("calc-a").spec == s == wire.env_spec_from_proto(wire.env_spec_to_proto(s))


def _wait_for(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
    return True
