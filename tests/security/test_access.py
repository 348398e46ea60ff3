"""Who gets in: loopback unless locked, TLS (and mutual TLS), tokens with roles, rate limits.

Every server here is real gRPC on 127.0.0.1, with real TLS from the throw-away PKI in
conftest.py. Proves: each of the three servers (and their CLIs) refuses a non-loopback address
without TLS and tokens, with a one-line reason; a call without a token or with an unknown one
is UNAUTHENTICATED, one without the method's role is PERMISSION_DENIED, and either is logged
and changes nothing; health is open and reflection needs a token; plaintext, a certificate from
another CA and a missing client certificate (mutual TLS) are refused; a client never sends its
token in clear beyond loopback; env changes are rate-limited per client with
RESOURCE_EXHAUSTED; the fleet's spawned worker accepts only the fleet's token.

Run: .venv/bin/python -m pytest tests/security/test_access.py -q
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from controller.client import ControllerClient, ControllerError
from controller.registry import EnvRegistry
from controller.service import RunStatus, serve_controller
from orrery.security import (METHOD_ROLES, ClientSecurity, RateLimiter, SecurityError, ServerSecurity,
                             TokenTable, check_listen, client_channel, token_sha256)
from orrery.v1 import controller_pb2, env_service_pb2, env_service_pb2_grpc, rollout_pb2
from sandbox import api
from sandbox.service import BuiltinEnvHost, serve_env
from tests.security.conftest import TOKENS, client_security

ROOT = pathlib.Path(__file__).resolve().parents[2]
KINDS = ("calc", "code", "files")


def calc(name: str) -> api.EnvSpec:
    return api.EnvSpec(name=name, kind="calc", args={"level": 1, "num_tasks": 8})


@pytest.fixture
def controller(tls_security):
    registry = EnvRegistry(known_kinds=KINDS)
    server, port = serve_controller(registry, RunStatus(total_steps=3), "127.0.0.1:0", security=tls_security)
    yield registry, f"127.0.0.1:{port}"
    server.stop(0)


def _client(pki, address, token_file=None, **overrides) -> ControllerClient:
    return ControllerClient(address, deadline_s=10, security=client_security(pki, token_file, **overrides))


# -- the listen rule ---------------------------------------------------------------------------


@pytest.mark.parametrize("security,missing", [
    (ServerSecurity(), "needs a TLS certificate (tls_cert, tls_key) and a tokens file (tokens_file)"),
    (ServerSecurity(tls_cert="c.pem", tls_key="k.pem"), "needs a tokens file (tokens_file)"),
    (ServerSecurity(tokens_file="t.yaml"), "needs a TLS certificate (tls_cert, tls_key)"),
])
def test_non_loopback_needs_tls_and_tokens(security, missing):
    for address in ("0.0.0.0:50051", "[::]:1", "10.1.2.3:9", "example.org:443"):
        with pytest.raises(SecurityError) as error:
            check_listen("RolloutService", address, security)
        assert str(error.value) == (f"RolloutService: listen {address!r} is not a loopback address; "
                                    f"listening there {missing}")
    for address in ("127.0.0.1:0", "localhost:5", "[::1]:7", "127.3.4.5:1"):
        check_listen("RolloutService", address, security)  # loopback: fine either way
    check_listen("X", "10.1.2.3:9", ServerSecurity(tls_cert="c", tls_key="k", tokens_file="t"))


def test_every_server_refuses_a_non_loopback_address_before_binding():
    with pytest.raises(SecurityError, match="ControllerService: listen '0.0.0.0:0' is not a loopback"):
        serve_controller(EnvRegistry(known_kinds=KINDS), RunStatus(), "0.0.0.0:0")
    with pytest.raises(SecurityError, match="EnvService: listen '0.0.0.0:0' is not a loopback"):
        serve_env(BuiltinEnvHost("calc"), "0.0.0.0:0")
    from rollout.service import serve

    with pytest.raises(SecurityError, match="RolloutService: listen '0.0.0.0:0' is not a loopback"):
        serve(None, "0.0.0.0:0")  # refused before the worker is even looked at


@pytest.mark.parametrize("command,service", [
    (["-m", "rollout.server", "--engine", "fake", "--model", "/nonexistent", "--listen", "0.0.0.0:0"],
     "RolloutService"),
    (["-m", "sandbox.service", "--listen", "0.0.0.0:0"], "EnvService"),
    (["-m", "controller.main", "--listen", "0.0.0.0:0", "--run-dir", "/nonexistent/run"], "ControllerService"),
])
def test_clis_refuse_a_non_loopback_address_in_one_line(command, service):
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu"))
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: {service}: listen '0.0.0.0:0' is not a loopback address; listening there needs "
                     "a TLS certificate (tls_cert, tls_key) and a tokens file (tokens_file)"], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


# -- tokens and roles --------------------------------------------------------------------------


def test_roles_decide_who_may_change_and_who_may_look(controller, pki, token_files, caplog):
    registry, address = controller
    with _client(pki, address, token_files["writer"]) as writer:
        writer.submit(calc("calc-a"))
    with _client(pki, address, token_files["reader"]) as reader:
        assert [r.name for r in reader.list_envs()] == ["calc-a"]
        assert reader.status().total_steps == 3
        caplog.set_level(logging.WARNING, logger="orrery.security")
        for call in (lambda: reader.submit(calc("calc-b")), lambda: reader.pause("calc-a"),
                     lambda: reader.remove("calc-a")):
            with pytest.raises(ControllerError) as denied:
                call()
            assert denied.value.code is grpc.StatusCode.PERMISSION_DENIED
            assert "token 'reader' has roles ['read'], needs envs.write" in denied.value.details
    assert [r.name for r in registry.list()] == ["calc-a"] and registry.get("calc-a").state.value == "active"
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 3 and all("PERMISSION_DENIED" in m and "'reader'" in m for m in refusals), refusals

    with _client(pki, address, token_files["internal"]) as internal:  # a worker's token is no client's
        with pytest.raises(ControllerError) as denied:
            internal.list_envs()
        assert denied.value.code is grpc.StatusCode.PERMISSION_DENIED


def test_missing_malformed_and_unknown_tokens_are_unauthenticated(controller, pki, tmp_path, monkeypatch):
    registry, address = controller
    with _client(pki, address) as anonymous:
        with pytest.raises(ControllerError) as refused:
            anonymous.submit(calc("calc-x"))
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    assert "no bearer token; send 'authorization: Bearer <token>'" in refused.value.details
    monkeypatch.setenv("ORRERY_TEST_TOKEN", "tok-writer-" + "w" * 31 + "x")  # one character off
    with _client(pki, address, token_env="ORRERY_TEST_TOKEN") as guesser:
        with pytest.raises(ControllerError) as refused:
            guesser.list_envs()
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED and refused.value.details.endswith("unknown token")
    channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(pki.ca.read_bytes()))
    list_envs = channel.unary_unary("/orrery.v1.ControllerService/ListEnvs",
                                    request_serializer=controller_pb2.ListEnvsRequest.SerializeToString)
    with pytest.raises(grpc.RpcError) as refused:
        list_envs(controller_pb2.ListEnvsRequest(), metadata=[("authorization", "Basic dXNlcjpwYXNz")], timeout=10)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "malformed authorization header" in refused.value.details()
    channel.close()
    assert registry.list() == []


def test_health_is_open_and_reflection_needs_a_token(controller, pki, token_files):
    _, address = controller
    credentials = grpc.ssl_channel_credentials(pki.ca.read_bytes())
    with grpc.secure_channel(address, credentials) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    channel = client_channel(address, client_security(pki, token_files["reader"]))
    responses = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(iter([request]), timeout=10)
    names = {s.name for r in responses for s in r.list_services_response.service}
    channel.close()
    assert "orrery.v1.ControllerService" in names


def test_every_method_of_every_service_has_roles():
    from orrery.v1 import controller_pb2 as c, env_service_pb2 as e, rollout_pb2 as r

    methods = {f"/{s.full_name}/{m.name}" for d in (c.DESCRIPTOR, e.DESCRIPTOR, r.DESCRIPTOR)
               for s in d.services_by_name.values() for m in s.methods}
    assert methods == set(METHOD_ROLES)


def test_token_table_rejects_bad_entries_naming_them(tmp_path):
    path = tmp_path / "tokens.yaml"
    cases = {
        "tokens: []": "must list at least one token",
        "tokens: [{name: a, sha256: abc, roles: [read]}]": "tokens[0].sha256: must be 64 lowercase hex digits",
        f"tokens: [{{name: a, sha256: {'a' * 64}, roles: [admin]}}]": "tokens[0].roles: must be a non-empty list",
        f"tokens: [{{name: a, sha256: {'a' * 64}, roles: [read], token: x}}]": "must have exactly the keys",
        "[1, 2]": "must be a mapping with a 'tokens' list",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(SecurityError, match=message.replace("[", r"\[")):
            TokenTable.load(path)
    table = TokenTable([("a", token_sha256("secret-a"), ["read"]), ("b", token_sha256("secret-b"), ["internal"])])
    assert table.lookup("secret-b").name == "b" and table.lookup("secret-") is None and table.lookup("") is None


# -- TLS -----------------------------------------------------------------------------------------


def test_plaintext_and_foreign_certificates_are_refused(controller, pki, token_files):
    _, address = controller
    with ControllerClient(address, deadline_s=5) as plaintext:  # no TLS at all
        with pytest.raises(ControllerError) as refused:
            plaintext.list_envs()
        assert refused.value.code is grpc.StatusCode.UNAVAILABLE
    with _client(pki, address, token_files["reader"], tls_ca=str(pki.other_ca)) as fooled:  # wrong CA
        with pytest.raises(ControllerError) as refused:
            fooled.list_envs()
        assert refused.value.code is grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_needs_a_client_certificate_from_the_ca(pki, tokens_file, token_files):
    security = ServerSecurity(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key),
                              tls_client_ca=str(pki.ca), tokens_file=str(tokens_file))
    server, port = serve_controller(EnvRegistry(known_kinds=KINDS), RunStatus(), "127.0.0.1:0", security=security)
    address = f"127.0.0.1:{port}"
    try:
        for overrides in ({}, {"tls_cert": str(pki.other_client_cert), "tls_key": str(pki.other_client_key)}):
            with _client(pki, address, token_files["reader"], **overrides) as stranger:
                with pytest.raises(ControllerError) as refused:
                    stranger.list_envs()
                assert refused.value.code is grpc.StatusCode.UNAVAILABLE
        with _client(pki, address, token_files["reader"], tls_cert=str(pki.client_cert),
                     tls_key=str(pki.client_key)) as member:
            assert member.list_envs() == []
    finally:
        server.stop(0)


def test_tokens_never_travel_in_clear_beyond_loopback(monkeypatch):
    monkeypatch.setenv("ORRERY_TEST_TOKEN", "secret")
    security = ClientSecurity(token_env="ORRERY_TEST_TOKEN")
    for address in ("10.1.2.3:50051", "controller.example:443"):
        with pytest.raises(SecurityError, match="refusing to send a token in clear to a non-loopback address"):
            client_channel(address, security)
    client_channel("127.0.0.1:1", security).close()  # loopback: allowed
    client_channel("10.1.2.3:50051", ClientSecurity()).close()  # no token, nothing to leak (no call is made)


def test_server_settings_errors_are_one_line():
    with pytest.raises(SecurityError, match="tls_cert and tls_key must be given together"):
        check_listen("EnvService", "127.0.0.1:0", ServerSecurity(tls_cert="c.pem"))
    with pytest.raises(SecurityError, match=r"tls_client_ca \(mutual TLS\) needs tls_cert and tls_key"):
        check_listen("EnvService", "127.0.0.1:0", ServerSecurity(tls_client_ca="ca.pem"))
    with pytest.raises(SecurityError, match="tokens file /nonexistent/t.yaml: cannot read"):
        serve_env(BuiltinEnvHost("calc"), "127.0.0.1:0", security=ServerSecurity(tokens_file="/nonexistent/t.yaml"))


# -- rate limits ---------------------------------------------------------------------------------


def test_env_changes_are_rate_limited_per_client(pki, tokens_file, token_files, tmp_path):
    # A second writer token, so two clients can be told apart.
    extra = tmp_path / "tokens.json"
    import json

    data = json.loads(tokens_file.read_text())
    data["tokens"].append({"name": "writer2", "sha256": token_sha256("tok-second-writer"), "roles": ["envs.write"]})
    extra.write_text(json.dumps(data))
    (tmp_path / "writer2.token").write_text("tok-second-writer\n")
    security = ServerSecurity(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key), tokens_file=str(extra),
                              submit_per_minute=0.001, submit_burst=2)  # about one refill a day
    registry = EnvRegistry(known_kinds=KINDS)
    server, port = serve_controller(registry, RunStatus(), "127.0.0.1:0", security=security)
    address = f"127.0.0.1:{port}"
    try:
        with _client(pki, address, token_files["writer"]) as writer:
            writer.submit(calc("calc-1"))
            writer.pause("calc-1")
            with pytest.raises(ControllerError) as limited:
                writer.submit(calc("calc-2"))
            assert limited.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert ("SubmitEnv: rate limit of 2 at once and 0.001 per minute exceeded for token:writer; retry in"
                    in limited.value.details)
            assert writer.list_envs()  # reading is not metered
        with _client(pki, address, tmp_path / "writer2.token") as other:  # another client has its own bucket
            other.submit(calc("calc-3"))
        assert sorted(r.name for r in registry.list()) == ["calc-1", "calc-3"]
    finally:
        server.stop(0)


def test_rate_limiter_refills_with_time():
    now = [0.0]
    limiter = RateLimiter(per_minute=60, burst=2, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("a") == pytest.approx(1.0)  # one call per second: the next in 1 s
    assert limiter.take("b") == 0.0
    now[0] = 1.0
    assert limiter.take("a") == 0.0 and limiter.take("a") > 0


def test_without_tokens_a_loopback_server_meters_each_peer_address(caplog):
    security = ServerSecurity(submit_per_minute=0.001, submit_burst=1)
    server, port = serve_controller(EnvRegistry(known_kinds=KINDS), RunStatus(), "127.0.0.1:0", security=security)
    try:
        with ControllerClient(f"127.0.0.1:{port}", deadline_s=10) as client:
            client.submit(calc("calc-1"))
            with pytest.raises(ControllerError) as limited:
                client.remove("calc-1")
        assert limited.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED and "peer:127.0.0.1" in limited.value.details
    finally:
        server.stop(0)


# -- EnvService and RolloutService ------------------------------------------------------------


def test_env_service_needs_the_internal_role(pki, tls_security, token_files):
    server, port, servicer = serve_env(BuiltinEnvHost("calc"), "127.0.0.1:0", security=tls_security)
    request = env_service_pb2.ListTasksRequest()
    request.args.update({"num_tasks": 4})
    try:
        for name, code in (("reader", grpc.StatusCode.PERMISSION_DENIED), (None, grpc.StatusCode.UNAUTHENTICATED)):
            channel = client_channel(f"127.0.0.1:{port}", client_security(pki, token_files[name] if name else None))
            with pytest.raises(grpc.RpcError) as refused:
                env_service_pb2_grpc.EnvServiceStub(channel).ListTasks(request, timeout=10)
            assert refused.value.code() is code
            channel.close()
        channel = client_channel(f"127.0.0.1:{port}", client_security(pki, token_files["internal"]))
        assert len(env_service_pb2_grpc.EnvServiceStub(channel).ListTasks(request, timeout=10).tasks) == 4
        channel.close()
    finally:
        server.stop(0)
        servicer.shutdown()


def test_remote_env_reaches_a_guarded_env_service_with_its_environment(pki, tls_security, token_files,
                                                                       monkeypatch):
    from sandbox import client as sandbox_client

    server, port, servicer = serve_env(BuiltinEnvHost("calc"), "127.0.0.1:0", security=tls_security)
    spec = api.EnvSpec(name="remote-calc", kind="remote", remote_address=f"127.0.0.1:{port}",
                       args={"num_tasks": 3})
    try:
        monkeypatch.setattr(sandbox_client, "_channels", {})
        monkeypatch.setenv("ORRERY_ENV_TLS_CA", str(pki.ca))
        monkeypatch.setenv("ORRERY_ENV_TOKEN_FILE", str(token_files["reader"]))
        with pytest.raises(api.EnvInfraError, match="PERMISSION_DENIED"):
            sandbox_client.list_remote_tasks(spec)
        monkeypatch.setattr(sandbox_client, "_channels", {})
        monkeypatch.setenv("ORRERY_ENV_TOKEN_FILE", str(token_files["internal"]))
        assert len(sandbox_client.list_remote_tasks(spec)) == 3
    finally:
        server.stop(0)
        servicer.shutdown()


def test_fleet_spawned_worker_accepts_only_the_fleets_token(tiny_model_dir, tmp_path):
    """A real `python -m rollout.server --engine fake` spawned by the Fleet: the fleet's calls
    pass, a call without the token is UNAUTHENTICATED, and weights outside run_dir/weights are
    refused naming the field."""
    from controller.config import FleetConfig
    from controller.fleet import Fleet
    from model.weights import WeightVersion
    from rollout.client import RolloutClient, RolloutError

    fleet = Fleet(FleetConfig(workers=1, engine="fake", start_timeout_s=120), tiny_model_dir, tmp_path / "run")
    try:
        fleet.start()
        (info,) = fleet.infos()
        assert info.engine == "fake"
        token_file = tmp_path / "run" / "workers" / "internal.token"
        assert token_file.stat().st_mode & 0o077 == 0  # only the controller's user can read it
        assert token_file.read_text().strip() not in (tmp_path / "run" / "workers" / "tokens.json").read_text()
        address = fleet._workers[0].address
        with RolloutClient(address) as anonymous:
            with pytest.raises(RolloutError) as refused:
                anonymous.info(deadline_s=10)
        assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
        outside = WeightVersion(version=1, step=1, location=str(tmp_path / "elsewhere" / "v00000001"),
                                format="orbax", digest="sha256:" + "0" * 64, created_at=0.0)
        with pytest.raises(RolloutError) as refused:
            fleet._workers[0].client.update_weights(outside, deadline_s=30)
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "WeightVersion.location: must be inside" in refused.value.details
        assert str((tmp_path / "run" / "weights").resolve()) in refused.value.details
        inside = dataclasses.replace(outside, location=str(tmp_path / "run" / "weights" / "v00000001"))
        assert fleet._workers[0].client.update_weights(inside, deadline_s=30).version == 1  # the fake engine loads it
    finally:
        fleet.close()
