"""Property-based fuzzing (hypothesis) of the three services over real loopback gRPC, and of the
spec validators.

Each service gets random bytes, mutated valid messages and random structured messages on every
unary method and RolloutGroup (StreamMetrics is left out: a request that parses streams until
the run ends, which is its contract), while a valid client on its own channels calls all three
services in the background. The properties: each call ends within its deadline with a clear status (a handled
error code with a message; gRPC's own "Exception deserializing request!" for bytes that are not
the message), never UNKNOWN (an unhandled exception in a handler) and never a hang; and after
every example a valid client is still served. The validators get random plain data and random
protos: they return or raise `SpecError`/`EnvFileError`, nothing else.

Example counts are small so the default run stays fast; raise them with
`ORRERY_FUZZ_EXAMPLES=2000` for a longer local run. The coverage-guided fuzzer is
tests/security/fuzz_specs.py (atheris; test_atheris.py runs it briefly).

Run: .venv/bin/python -m pytest tests/security/test_fuzz.py -q
"""

from __future__ import annotations

import os
import random
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.client import EnvFileError, env_spec_from_dict
from controller.registry import EnvRegistry
from controller.service import RunStatus, serve_controller
from orrery.security import ServerSecurity
from orrery.v1 import controller_pb2, env_pb2, env_service_pb2, rollout_pb2, weights_pb2
from sandbox import api, validation, wire
from sandbox.service import BuiltinEnvHost, serve_env

EXAMPLES = int(os.environ.get("ORRERY_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Status codes a handled refusal may carry. UNKNOWN is absent on purpose: it means a handler raised.
CLEAR = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.ALREADY_EXISTS,
         grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
         grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
DESERIALIZE = "Exception deserializing request!"

CONTROLLER = ("SubmitEnv", "ListEnvs", "GetEnv", "PauseEnv", "ResumeEnv", "RemoveEnv", "GetRunStatus")
ROLLOUT = ("RolloutGroup", "UpdateWeights", "GetInfo", "Abort")
ENV = ("ListTasks", "Reset", "Step", "Score", "Close")
STREAMING = {"RolloutGroup"}


@pytest.fixture(scope="module")
def services(tiny_model_dir, tmp_path_factory):
    """The three servers on loopback, with valid clients' calls to check they keep serving."""
    from model.tokenizer import Tokenizer
    from rollout.agent import AgentLoop
    from rollout.config import RolloutConfig
    from rollout.fake import FakeEngine
    from rollout.service import serve
    from rollout.worker import RolloutWorker
    from sandbox.client import open_env
    from sandbox.config import SandboxConfig

    open_security = ServerSecurity(submit_per_minute=1e9, submit_burst=10 ** 9)  # fuzzing is not a flood
    registry = EnvRegistry(known_kinds=("calc", "code", "files"))
    controller, controller_port = serve_controller(registry, RunStatus(total_steps=1), security=open_security)
    config = RolloutConfig(engine="fake", worker_id="w-fuzz", group_deadline_s=20.0)
    engine = FakeEngine()
    worker = RolloutWorker(engine, AgentLoop(engine, Tokenizer.from_dir(tiny_model_dir), open_env, config.agent),
                           config)
    rollout = serve(worker, "127.0.0.1:0", weights_roots=(str(tmp_path_factory.mktemp("weights")),))
    env_server, env_port, env_servicer = serve_env(BuiltinEnvHost("calc", SandboxConfig(isolation="none")))
    addresses = {"ControllerService": f"127.0.0.1:{controller_port}", "RolloutService": f"127.0.0.1:{rollout.port}",
                 "EnvService": f"127.0.0.1:{env_port}"}
    channels = {name: grpc.insecure_channel(address) for name, address in addresses.items()}
    # A valid client calling all three services the whole time the fuzzing runs, on its own channels.
    stop, record = threading.Event(), {"served": 0, "failures": []}

    def valid_client():
        own = {name: grpc.insecure_channel(address) for name, address in addresses.items()}
        while not stop.wait(0.05):
            try:
                _still_serving(own)
                record["served"] += 1
            except (grpc.RpcError, AssertionError) as error:
                record["failures"].append(repr(error)[:300])
        for channel in own.values():
            channel.close()

    watcher = threading.Thread(target=valid_client, daemon=True)
    watcher.start()
    channels["valid_client"] = record
    yield channels
    stop.set()
    watcher.join(timeout=60)
    channels.pop("valid_client")
    for channel in channels.values():
        channel.close()
    controller.stop(0)
    rollout.stop(0)
    env_server.stop(0)
    env_servicer.shutdown()


def _raw(channel: grpc.Channel, service: str, method: str):
    path = f"/orrery.v1.{service}/{method}"
    identity = (lambda b: b)
    if method in STREAMING:
        return channel.unary_stream(path, request_serializer=identity, response_deserializer=identity)
    return channel.unary_unary(path, request_serializer=identity, response_deserializer=identity)


def _call(channel, service: str, method: str, payload: bytes) -> None:
    """One call; asserts the answer is OK or a clear error, within the deadline."""
    stub = _raw(channel, service, method)
    try:
        answer = stub(payload, timeout=30)
        if method in STREAMING:
            list(answer)
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
        if code is grpc.StatusCode.INTERNAL and details == DESERIALIZE:
            return
        assert code in CLEAR, f"{service}/{method} answered {code.name}: {details!r} to {payload[:200]!r}"
        assert details, f"{service}/{method} answered {code.name} without a message"


def _still_serving(channels) -> None:
    channels = {k: v for k, v in channels.items() if k != "valid_client"}
    for name, channel in channels.items():
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING, name
    _raw(channels["ControllerService"], "ControllerService", "ListEnvs")(b"", timeout=30)
    _raw(channels["RolloutService"], "RolloutService", "GetInfo")(b"", timeout=30)
    request = env_service_pb2.ListTasksRequest()
    request.args.update({"num_tasks": 2})
    _raw(channels["EnvService"], "EnvService", "ListTasks")(request.SerializeToString(), timeout=30)


def _valid_messages() -> dict[tuple[str, str], bytes]:
    """One valid request per method, the seeds that mutations start from."""
    spec = api.EnvSpec(name="calc-seed", kind="calc", args={"num_tasks": 4},
                       tasks=(api.Task("t1", "What is 1 + 1?", {"answer": 2}),),
                       budgets=api.Budgets(max_turns=2, max_new_tokens_per_turn=4, max_total_tokens=64))
    task = wire.task_to_proto(spec.tasks[0])
    group = rollout_pb2.RolloutGroupRequest(group_id="g", env=wire.env_spec_to_proto(spec), task=task, group_size=2)
    weights = weights_pb2.WeightVersion(version=1, learner_step=1, location="/tmp/w", digest="sha256:" + "0" * 64,
                                        format=weights_pb2.WEIGHT_FORMAT_ORBAX)
    reset = env_service_pb2.ResetRequest(task=task)
    step = env_service_pb2.StepRequest(session_id="s")
    step.call.name, step.call.arguments_json = "calculator", '{"expression": "1 + 1"}'
    messages = {
        ("ControllerService", "SubmitEnv"): controller_pb2.SubmitEnvRequest(spec=wire.env_spec_to_proto(spec)),
        ("ControllerService", "GetEnv"): controller_pb2.GetEnvRequest(name="calc-seed"),
        ("ControllerService", "PauseEnv"): controller_pb2.PauseEnvRequest(name="calc-seed"),
        ("ControllerService", "RemoveEnv"): controller_pb2.RemoveEnvRequest(name="calc-seed"),
        ("RolloutService", "RolloutGroup"): group,
        ("RolloutService", "UpdateWeights"): rollout_pb2.UpdateWeightsRequest(version=weights),
        ("RolloutService", "Abort"): rollout_pb2.AbortRequest(group_id="g"),
        ("EnvService", "Reset"): reset,
        ("EnvService", "Step"): step,
        ("EnvService", "Score"): env_service_pb2.ScoreRequest(session_id="s", answer="2"),
    }
    return {key: message.SerializeToString() for key, message in messages.items()}


METHODS = [("ControllerService", m) for m in CONTROLLER] + [("RolloutService", m) for m in ROLLOUT] + \
          [("EnvService", m) for m in ENV]
SEEDS = _valid_messages()


@FUZZ
@given(target=st.sampled_from(METHODS), payload=st.binary(max_size=2048))
def test_random_bytes_get_clear_errors(services, target, payload):
    service, method = target
    _call(services[service], service, method, payload)
    _still_serving(services)


@FUZZ
@given(target=st.sampled_from(sorted(SEEDS)), seed=st.integers(0, 2 ** 32 - 1),
       edits=st.integers(1, 12))
def test_mutated_valid_messages_get_clear_errors(services, target, seed, edits):
    data = bytearray(SEEDS[target])
    rng = random.Random(seed)
    for _ in range(edits):  # flip, insert, delete or duplicate bytes, the way byte mutators do
        kind, at = rng.randrange(4), rng.randrange(len(data) + 1)
        if kind == 0 and at < len(data):
            data[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            data[at:at] = bytes([rng.randrange(256)])
        elif kind == 2 and at < len(data):
            del data[at]
        else:
            data[at:at] = data[at:at + rng.randrange(1, 16)]
    service, method = target
    _call(services[service], service, method, bytes(data))
    _still_serving(services)


# -- structured messages ------------------------------------------------------------------------

texts = st.text(max_size=40)
numbers = st.one_of(st.integers(-2 ** 40, 2 ** 40), st.floats(allow_nan=True, allow_infinity=True))
json_values = st.recursive(st.one_of(st.none(), st.booleans(), numbers, texts),
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(texts, inner, max_size=4)), max_leaves=12)


@st.composite
def env_specs(draw) -> env_pb2.EnvSpec:
    message = env_pb2.EnvSpec(
        name=draw(st.one_of(texts, st.sampled_from(["calc-a", "files-x", ""]))),
        kind=draw(st.one_of(texts, st.sampled_from(["calc", "code", "files", "remote"]))),
        remote_address=draw(st.one_of(st.just(""), texts, st.sampled_from(["127.0.0.1:1", "x:99999"]))),
        mixture_weight=draw(st.floats(allow_nan=True, allow_infinity=True)),
        eval_fraction=draw(st.floats(allow_nan=True, allow_infinity=True)),
    )
    args = draw(st.dictionaries(st.sampled_from(["num_tasks", "level", "seed", "kind"]) | texts,
                                st.one_of(numbers, texts), max_size=4))
    message.args.update(args)
    budgets = message.budgets
    budgets.max_turns = draw(st.integers(0, 100))
    budgets.max_new_tokens_per_turn = draw(st.integers(0, 10 ** 6))
    budgets.max_total_tokens = draw(st.integers(0, 10 ** 7))
    for _ in range(draw(st.integers(0, 3))):
        task = message.tasks.add(task_id=draw(texts), prompt=draw(texts), split=draw(st.sampled_from(["", "train",
                                                                                                    "eval", "x"])))
        files = draw(st.dictionaries(st.sampled_from(["a.txt", "../x", "/etc/x", "d/../../y"]) | texts, texts,
                                     max_size=3))
        task.verifier.update({"files": files, "answer": draw(numbers)})  # NaN too: not JSON
    for path in draw(st.lists(st.sampled_from(["ok.txt", "../up", "/abs"]) | texts, max_size=2)):
        message.safety.protected_paths.append(path)
    return message


@FUZZ
@given(spec=env_specs())
def test_random_specs_are_accepted_or_refused_with_field_and_value(services, spec):
    channel = services["ControllerService"]
    request = controller_pb2.SubmitEnvRequest(spec=spec, replace=True)
    try:
        _raw(channel, "ControllerService", "SubmitEnv")(request.SerializeToString(), timeout=30)
    except grpc.RpcError as error:
        assert error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS), \
            f"{error.code().name}: {error.details()}"
        if error.code() is grpc.StatusCode.INVALID_ARGUMENT:
            assert error.details().startswith("EnvSpec"), error.details()  # names the field
    _still_serving(services)


@FUZZ
@given(spec=env_specs(), group_size=st.integers(0, 5000))
def test_random_groups_and_env_resets_get_clear_errors(services, spec, group_size):
    task = spec.tasks[0] if spec.tasks else env_pb2.Task(task_id="t", prompt="What is 1 + 1?")
    group = rollout_pb2.RolloutGroupRequest(group_id="g", env=spec, task=task, group_size=group_size)
    _call(services["RolloutService"], "RolloutService", "RolloutGroup", group.SerializeToString())
    reset = env_service_pb2.ResetRequest(task=task, args=spec.args, safety=spec.safety)
    _call(services["EnvService"], "EnvService", "Reset", reset.SerializeToString())
    _still_serving(services)


def test_a_valid_client_was_served_throughout(services):
    """Runs after the fuzzing tests above (file order): the background client never failed."""
    record = services["valid_client"]
    assert record["failures"] == []
    assert record["served"] > 0


# -- the validators alone -------------------------------------------------------------------------

plain = st.recursive(st.one_of(st.none(), st.booleans(), numbers, texts),
                     lambda inner: st.one_of(st.lists(inner, max_size=3),
                                             st.dictionaries(st.one_of(texts, st.integers()), inner, max_size=3)),
                     max_leaves=16)
spec_keys = st.sampled_from(["name", "kind", "args", "tasks", "tools", "budgets", "reward", "safety", "sampling",
                             "mixture_weight", "eval_fraction", "remote_address", "bogus"])


@settings(max_examples=EXAMPLES * 5, deadline=None, derandomize=True)
@given(data=st.dictionaries(spec_keys, plain, max_size=8))
def test_validators_take_any_plain_data(data):
    """What a client's env.yaml can hold: refused with EnvFileError or SpecError, or valid."""
    try:
        spec = env_spec_from_dict(data)
        validation.validate_env_spec(spec, known_kinds=("calc", "code", "files"))
    except (EnvFileError, validation.SpecError):
        pass


@settings(max_examples=EXAMPLES * 5, deadline=None, derandomize=True)
@given(spec=env_specs())
def test_validators_take_any_proto(spec):
    """As the servers convert: a Struct that is not plain JSON (NaN) is a ValueError they answer
    with INVALID_ARGUMENT; everything else is valid or a SpecError."""
    try:
        converted = wire.env_spec_from_proto(spec)
    except ValueError as error:
        assert "Fail to serialize" in str(error)
        return
    try:
        validation.validate_env_spec(converted, known_kinds=("calc", "code", "files"))
    except validation.SpecError:
        pass
