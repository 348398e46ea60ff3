"""Paths never on trust, and every size bounded with a clear error.

Proves: a WeightVersion outside the worker's weights roots (directly, through `..`, or through a
symlink inside the root) is refused over real gRPC with INVALID_ARGUMENT naming
`WeightVersion.location`, and a worker without roots loads nothing; a `files` task whose
starting files leave the workspace is refused by validation and, if it got past, by the env
itself (no file is written outside); `args.num_tasks`, group sizes, requests over the size limit
and remote env outputs are capped, each with a message naming the field and value; SGLang beyond
loopback needs an API key, which is then sent on every call and never shown.

Run: .venv/bin/python -m pytest tests/security/test_paths_and_limits.py -q
"""

from __future__ import annotations

import http.server
import json
import os
import threading

import grpc
import pytest

from model.weights import WeightVersion
from orrery.security import SecurityError, inside_roots
from orrery.v1 import env_service_pb2, env_service_pb2_grpc, rollout_pb2, rollout_pb2_grpc
from rollout import wire as rollout_wire
from rollout.api import GroupRequest, SamplingParams
from sandbox import api, validation
from sandbox import wire as sandbox_wire
from sandbox.service import BuiltinEnvHost, serve_env

CALC = api.EnvSpec(name="calc", kind="calc", args={"num_tasks": 4},
                   budgets=api.Budgets(max_turns=2, max_new_tokens_per_turn=8))
TASK = api.Task("t-1", "What is 1 + 1?", {"answer": 2})


def _version(location) -> WeightVersion:
    return WeightVersion(version=1, step=1, location=str(location), format="orbax",
                         digest="sha256:" + "0" * 64, created_at=0.0)


# -- weights roots ---------------------------------------------------------------------------


def test_inside_roots_resolves_links_and_dots(tmp_path):
    root, outside = tmp_path / "weights", tmp_path / "secrets"
    (root / "v1").mkdir(parents=True)
    outside.mkdir()
    (root / "link").symlink_to(outside)
    assert inside_roots(root / "v1", [root], "f") == str((root / "v1").resolve())
    for bad in (outside, root / ".." / "secrets", root / "link", root / "link" / "v2", "/etc"):
        with pytest.raises(SecurityError, match=r"^f: must be inside .*weights \(symlinks resolved\), got "):
            inside_roots(bad, [root], "f")
    with pytest.raises(SecurityError, match=r"resolves|-> '.*secrets'"):
        inside_roots(root / "link", [root], "f")  # the message shows where the link leads
    linked_root = tmp_path / "weights-link"
    linked_root.symlink_to(root)  # a root that is itself a link: both sides are resolved
    assert inside_roots(root / "v1", [linked_root], "f") == str((root / "v1").resolve())
    with pytest.raises(SecurityError, match="none configured"):
        inside_roots(root / "v1", [], "f")
    with pytest.raises(SecurityError, match="must be a non-empty path"):
        inside_roots("a\x00b", [root], "f")


@pytest.fixture
def rollout_server(tiny_model_dir, tmp_path):
    """An in-process RolloutService on a FakeEngine, weights root tmp_path/weights."""
    from model.tokenizer import Tokenizer
    from rollout.agent import AgentLoop
    from rollout.config import RolloutConfig
    from rollout.fake import FakeEngine
    from rollout.service import serve
    from rollout.worker import RolloutWorker
    from sandbox.client import open_env

    config = RolloutConfig(engine="fake", worker_id="w-sec")
    engine = FakeEngine()
    worker = RolloutWorker(engine, AgentLoop(engine, Tokenizer.from_dir(tiny_model_dir), open_env, config.agent),
                           config)
    roots = (str(tmp_path / "weights"),)
    (tmp_path / "weights").mkdir()
    servers = []

    def start(weights_roots=roots):
        running = serve(worker, "127.0.0.1:0", weights_roots=weights_roots)
        servers.append(running)
        channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
        return rollout_pb2_grpc.RolloutServiceStub(channel), engine

    yield start
    for running in servers:
        running.stop(0)


def _update(stub, location):
    request = rollout_pb2.UpdateWeightsRequest(version=rollout_wire.weight_version_to_proto(_version(location)))
    return stub.UpdateWeights(request, timeout=30)


def test_worker_loads_weights_only_from_its_roots(rollout_server, tmp_path):
    stub, engine = rollout_server()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "weights" / "v00000001").symlink_to(tmp_path / "elsewhere")
    for location in (tmp_path / "elsewhere", tmp_path / "weights" / ".." / "elsewhere",
                     tmp_path / "weights" / "v00000001", "/etc/passwd"):
        with pytest.raises(grpc.RpcError) as refused:
            _update(stub, location)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("WeightVersion.location: must be inside ")
        assert engine.version == 0  # nothing was loaded
    assert _update(stub, tmp_path / "weights" / "v00000002").version == 1


def test_worker_without_roots_loads_nothing(rollout_server, tmp_path):
    stub, engine = rollout_server(weights_roots=())
    with pytest.raises(grpc.RpcError) as refused:
        _update(stub, tmp_path / "weights" / "v00000001")
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "started without --weights-root" in refused.value.details() and engine.version == 0


def test_worker_validates_the_group_it_is_sent(rollout_server):
    stub, engine = rollout_server()
    cases = {
        "RolloutGroupRequest.group_size: must be between 1 and 1024, got 5000":
            GroupRequest("g", CALC, TASK, 5000, SamplingParams()),
        "EnvSpec.args.num_tasks: must be an integer between 1 and 20000, got 1000000000":
            GroupRequest("g", api.EnvSpec(name="calc", kind="calc", args={"num_tasks": 10 ** 9}), TASK, 2,
                         SamplingParams()),
        "RolloutGroupRequest.task.prompt: must be non-empty, got ''":
            GroupRequest("g", CALC, api.Task("t", "", {}), 2, SamplingParams()),
    }
    for message, group in cases.items():
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.RolloutGroup(rollout_wire.group_request_to_proto(group), timeout=30))
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == f"RolloutGroup request: {message}"
    assert engine.requests == []  # nothing reached the engine


# -- workspace paths of the files env ------------------------------------------------------------


def _files_task(files):
    return api.Task("f-1", "Tidy the logs.", {"files": files, "error_logs": [], "ok_logs": []})


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/cron.d/x", "a/../../x", "logs/\x00x", ""])
def test_files_tasks_must_stay_in_the_workspace(path):
    spec = api.EnvSpec(name="files-x", kind="files", tasks=(_files_task({"ok.txt": "fine", path: "owned"}),))
    with pytest.raises(validation.SpecError) as error:
        validation.validate_env_spec(spec)
    assert str(error.value).startswith("EnvSpec.tasks[0].verifier.files[")
    assert "must be a relative path inside the workspace, got" in str(error.value)


def test_files_env_refuses_an_escaping_path_even_past_validation(tmp_path):
    from sandbox.config import SandboxConfig
    from sandbox.envs import make_env
    from sandbox.tools import OutsideWorkspaceError

    target = tmp_path / "escaped.txt"
    spec = api.EnvSpec(name="files-x", kind="files")
    env = make_env(spec, _files_task({"../../../../../../../" + str(target).lstrip("/"): "owned"}),
                   SandboxConfig(isolation="none"))
    try:
        with pytest.raises(OutsideWorkspaceError):
            env.reset()
    finally:
        env.close()
    assert not target.exists()


# -- sizes and counts ----------------------------------------------------------------------------


def test_caps_name_field_and_value():
    with pytest.raises(validation.SpecError, match=r"^EnvSpec.args.num_tasks: must be an integer between 1 and "
                                                   r"20000, got 20001$"):
        validation.validate_env_spec(api.EnvSpec(name="c", kind="calc", args={"num_tasks": 20_001}))
    with pytest.raises(validation.SpecError, match=r"^EnvSpec.tasks: at most 3 tasks, got 4$"):
        validation.validate_env_spec(
            api.EnvSpec(name="c", kind="calc", tasks=tuple(api.Task(f"t{i}", "q") for i in range(4))),
            limits=validation.SpecLimits(max_tasks=3))
    with pytest.raises(validation.SpecError, match=r"^EnvSpec.budgets.max_total_tokens: must be an integer "
                                                   r"between 16 and 131072, got 1000000$"):
        validation.validate_env_spec(api.EnvSpec(name="c", kind="calc", budgets=api.Budgets(max_total_tokens=10 ** 6)))


@pytest.fixture
def env_server():
    server, port, servicer = serve_env(BuiltinEnvHost("calc"), "127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)])
    yield env_service_pb2_grpc.EnvServiceStub(channel), port
    channel.close()
    server.stop(0)
    servicer.shutdown()


def test_env_service_bounds_what_it_is_sent(env_server):
    stub, _ = env_server
    huge = env_service_pb2.ResetRequest(task=sandbox_wire.task_to_proto(api.Task("t", "x" * (9 << 20))))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Reset(huge, timeout=30)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # over the 8 MiB request limit
    request = env_service_pb2.ListTasksRequest()
    request.args.update({"num_tasks": 10 ** 9})
    with pytest.raises(grpc.RpcError) as refused:
        stub.ListTasks(request, timeout=30)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "EnvSpec.args.num_tasks: must be an integer between 1 and 20000, got 1000000000" in refused.value.details()
    bad_files = env_service_pb2.ResetRequest(task=sandbox_wire.task_to_proto(_files_task({"../x": "y"})))
    bad_files.args.update({"kind": "files"})
    with pytest.raises(grpc.RpcError) as refused:
        stub.Reset(bad_files, timeout=30)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "ResetRequest.task.verifier.files['../x']: must be a relative path inside the workspace" in \
        refused.value.details()
    ok = env_service_pb2.ResetRequest(task=sandbox_wire.task_to_proto(api.Task("t", "What is 1 + 1?", {"answer": 2})))
    session = stub.Reset(ok, timeout=30).session_id
    step = env_service_pb2.StepRequest(session_id=session)
    step.call.name, step.call.arguments_json = "calculator", "[1, 2]"
    with pytest.raises(grpc.RpcError) as refused:
        stub.Step(step, timeout=30)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "StepRequest.call.arguments_json: must be a JSON object, got '[1, 2]'"


class _ChattyEnv:
    """A remote env whose every step answers a megabyte."""

    def reset(self):
        return "go"

    def tools(self):
        return ()

    def step(self, call):
        return api.StepResult(observation="o" * (1 << 20), result=api.ToolResult(output="p" * (1 << 20)))

    def outcome(self, answer):
        return api.Outcome(reward=0.0, true_metric=0.0, success=False)

    def close(self):
        pass


class _ChattyHost:
    def list_tasks(self, args):
        return [TASK]

    def open(self, task, args, safety):
        return _ChattyEnv()


def test_remote_env_output_is_cut_like_a_local_tool(monkeypatch):
    from sandbox import client as sandbox_client
    from sandbox.config import SandboxConfig

    monkeypatch.setattr(sandbox_client, "_channels", {})
    server, port, servicer = serve_env(_ChattyHost(), "127.0.0.1:0")
    spec = api.EnvSpec(name="chatty", kind="remote", remote_address=f"127.0.0.1:{port}")
    env = sandbox_client.open_env(spec, TASK, SandboxConfig(max_output_bytes=1000))
    try:
        env.reset()
        step = env.step(api.ToolCall("anything", {}))
    finally:
        env.close()
        server.stop(0)
        servicer.shutdown()
    assert step.observation == "o" * 1000 + "\n[truncated]"
    assert step.result.output == "p" * 1000 + "\n[truncated]"


# -- SGLang ------------------------------------------------------------------------------------


def test_sglang_beyond_loopback_needs_an_api_key():
    from rollout.sglang import SGLangConfig

    with pytest.raises(ValueError, match=r"SGLangConfig.base_url must be a loopback address unless api_key is "
                                         r"set, got 'http://10.0.0.5:30000'"):
        SGLangConfig(base_url="http://10.0.0.5:30000")
    config = SGLangConfig(base_url="https://sglang.internal:30000", api_key="k-123")
    assert "k-123" not in repr(config)
    SGLangConfig(base_url="http://127.0.0.1:30000")
    SGLangConfig(base_url="http://localhost:30000")
    SGLangConfig(base_url="http://[::1]:30000")


class _KeyedSGLang(http.server.BaseHTTPRequestHandler):
    """Answers like SGLang started with --api-key: 401 without `Authorization: Bearer <key>`."""

    key = "k-123"
    seen: list[str] = []

    def _answer(self):
        self.seen.append(self.headers.get("Authorization", ""))
        if self.headers.get("Authorization") != f"Bearer {self.key}":
            body, status = b'{"error": "Unauthorized"}', 401
        else:
            answers = {"/get_model_info": {"weight_version": "default", "model_path": "/nonexistent"},
                       "/server_info": {"max_req_input_len": 64}, "/continue_generation": {}}
            body, status = json.dumps(answers.get(self.path, {})).encode(), 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def test_sglang_api_key_is_sent_from_a_file_or_the_environment(tmp_path, monkeypatch):
    import argparse

    from rollout.sglang import SGLangError, build_engine

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeyedSGLang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        monkeypatch.delenv("ORRERY_SGLANG_API_KEY", raising=False)
        with pytest.raises(SGLangError, match="401"):
            build_engine(argparse.Namespace(sglang_url=url, sglang_api_key_file=""))
        key_file = tmp_path / "sglang.key"
        key_file.write_text("k-123\n")
        build_engine(argparse.Namespace(sglang_url=url, sglang_api_key_file=str(key_file))).close()
        monkeypatch.setenv("ORRERY_SGLANG_API_KEY", "k-123")
        build_engine(argparse.Namespace(sglang_url=url, sglang_api_key_file="")).close()
    finally:
        server.shutdown()
    assert _KeyedSGLang.seen[0] == "" and _KeyedSGLang.seen[-1] == "Bearer k-123"
    assert all(seen == "Bearer k-123" for seen in _KeyedSGLang.seen[1:])
    assert os.environ.get("ORRERY_SGLANG_API_KEY") == "k-123"
