"""A real rollout worker process on loopback, driven through RolloutClient.

Starts `python -m rollout.server --engine jax` on the tiny model (one process for the module),
then: GetInfo; standard health says SERVING; reflection lists RolloutService; a group rolls
out over gRPC with token-exact trajectories; weights update from an Orbax snapshot (and a bad
digest or a lower version is refused with the right status code, the old weights kept); a
deadline and an unreachable worker become RolloutError with method, peer and code.

Run: .venv/bin/python -m pytest tests/rollout/test_service.py -q
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from model.hf_io import load_hf
from model.weights import save_snapshot
from rollout.api import GroupRequest, SamplingParams, Termination, token_stream
from rollout.client import RolloutClient, RolloutError
from sandbox.api import Budgets, EnvSpec, Task
from tests.rollout.conftest import COMPILE_CACHE_ENV, ENGINE_CONFIG, sharpen

ROOT = Path(__file__).resolve().parents[2]
TASK = Task("t-2+3", "What is 2 + 3?", {"answer": 5, "expression": "2 + 3"})
SPEC = EnvSpec("calc", "calc", tasks=(TASK,), budgets=Budgets(max_turns=2,
                                                              max_new_tokens_per_turn=8))


@pytest.fixture(scope="module")
def weights_root(tmp_path_factory):
    return tmp_path_factory.mktemp("weights")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory, weights_root):
    folder = tmp_path_factory.mktemp("server")
    port_file, log_path = folder / "port", folder / "server.log"
    command = [sys.executable, "-m", "rollout.server", "--engine", "jax",
               "--listen", "127.0.0.1:0", "--port-file", str(port_file),
               "--model", str(tiny_model_dir), "--worker-id", "w-test",
               "--slots", str(ENGINE_CONFIG.slots), "--max-seq-len", str(ENGINE_CONFIG.max_seq_len),
               "--prefill-buckets", ",".join(map(str, ENGINE_CONFIG.prefill_buckets)),
               "--decode-steps", str(ENGINE_CONFIG.decode_steps_per_call),
               "--weights-root", str(weights_root)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", **COMPILE_CACHE_ENV)
    with open(log_path, "wb") as log:  # a file, not a pipe: a full pipe would block the server
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                   stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not (port_file.exists() and port_file.read_text().strip()):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"rollout.server did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.1)
    address = f"127.0.0.1:{int(port_file.read_text())}"
    yield address
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    assert process.returncode == 0, log_path.read_text()[-3000:]


@pytest.fixture
def client(server):
    with RolloutClient(server) as c:
        yield c


def test_info_health_and_reflection(server, client):
    info = client.info(deadline_s=10)
    assert (info.worker_id, info.engine, info.version, info.healthy) == ("w-test", "jax", 0, True)
    with grpc.insecure_channel(server) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "orrery.v1.RolloutService"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10)
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"orrery.v1.RolloutService", "grpc.health.v1.Health"} <= names


def test_group_over_grpc_then_weight_update(client, tiny_model_dir, weights_root):
    request = GroupRequest("svc", SPEC, TASK, 3, SamplingParams(temperature=1.0, seed=1))
    trajectories = list(client.rollout_group(request, deadline_s=120))
    assert sorted(t.trajectory_id for t in trajectories) == ["svc:0:0", "svc:0:1", "svc:0:2"]
    for t in trajectories:
        assert t.termination is not Termination.INFRA_ERROR, t
        stream = token_stream(t)
        assert stream.loss_mask.sum() == t.num_policy_tokens > 0
        assert set(stream.versions[stream.loss_mask > 0]) == {0}

    config, params = load_hf(tiny_model_dir)
    wv = save_snapshot(sharpen(params, seed=5), weights_root, version=1, step=10)
    bad = dataclasses.replace(wv, digest="sha256:" + "0" * 64)
    with pytest.raises(RolloutError) as refused:
        client.update_weights(bad, deadline_s=60)
    assert refused.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.method == "UpdateWeights" and refused.value.peer == client.address
    assert client.info(deadline_s=10).version == 0

    ack = client.update_weights(wv, deadline_s=60)
    assert (ack.worker_id, ack.version) == ("w-test", 1) and ack.load_s > 0
    with pytest.raises(RolloutError) as backwards:
        client.update_weights(dataclasses.replace(wv, version=0), deadline_s=60)
    assert backwards.value.code is grpc.StatusCode.INVALID_ARGUMENT
    again = list(client.rollout_group(dataclasses.replace(request, group_id="svc2",
                                                          group_size=1), deadline_s=120))
    stream = token_stream(again[0])
    assert set(stream.versions[stream.loss_mask > 0]) == {1}
    assert client.info(deadline_s=10).version == 1


def test_deadlines_and_unreachable_workers_raise_rollout_error(client):
    request = GroupRequest("slow", SPEC, TASK, 2, SamplingParams(temperature=1.0))
    with pytest.raises(RolloutError) as late:
        list(client.rollout_group(request, deadline_s=0.001))
    assert late.value.code is grpc.StatusCode.DEADLINE_EXCEEDED
    assert late.value.method == "RolloutGroup"
    with RolloutClient("127.0.0.1:1") as nowhere:
        with pytest.raises(RolloutError) as lost:
            nowhere.info(deadline_s=2)
    assert lost.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert lost.value.peer == "127.0.0.1:1"
    assert client.abort("no-such-group") == 0
    assert client.info(deadline_s=10).healthy  # the abandoned group left the worker well
