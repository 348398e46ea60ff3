"""SGLangEngine's client side against a scripted fake SGLang server (http.server on loopback).

Proves: what the engine sends (token ids, sampling fields, rid, the pause / update / continue
order of a weight update) and how it reads answers (per-token versions from weight_versions
spans, finish reasons, malformed answers), deadlines, retries and error messages. It says
nothing about SGLang itself: tests/rollout/test_sglang_engine.py runs the same engine against
a real server. Fast, no SGLang needed:

    .venv/bin/python -m pytest tests/rollout/test_sglang_client.py -q
"""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time

import pytest

from model.weights import WeightVersion
from rollout.api import FinishReason, GenerationRequest, SamplingParams
from rollout.sglang import (SGLangConfig, SGLangEngine, SGLangError, generate_payload,
                            parse_generation)


class FakeSGLang:
    """Answers like SGLang; `routes[path]` maps a request body to (status, JSON or text)."""

    def __init__(self, vocab_size: int = 100, model_path: str = "/nonexistent"):
        self.calls: list[tuple[str, str, object]] = []
        self.info = {"model_path": model_path, "weight_version": "0"}
        self.routes = {
            "/get_model_info": lambda body: (200, dict(self.info)),
            "/server_info": lambda body: (200, {"max_req_input_len": 50, "version": "fake"}),
            "/health": lambda body: (200, ""),
            "/abort_request": lambda body: (200, ""),
            "/pause_generation": lambda body: (200, {"status": "ok"}),
            "/continue_generation": lambda body: (200, {"status": "ok"}),
            "/update_weights_from_disk": self._update,
            "/generate": lambda body: (200, answer(body, [7, 8, 9])),
        }
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                fake.calls.append((self.command, self.path, body))
                route = fake.routes.get(self.path)
                status, payload = route(body) if route else (404, {"detail": "Not Found"})
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up first (the deadline tests)

            do_GET = do_POST = _serve

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _update(self, body):
        self.info["weight_version"] = body["weight_version"]
        return 200, {"success": True, "message": "ok", "num_paused_requests": 0}

    def paths(self) -> list[str]:
        return [path for _, path, _ in self.calls]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def answer(body, ids, finish="length", spans=None, version="0"):
    """An SGLang /generate answer for `ids` with logprobs -0.1 * (i + 1)."""
    meta = {"id": body["rid"], "finish_reason": {"type": finish},
            "output_token_logprobs": [[-0.1 * (i + 1), t, None] for i, t in enumerate(ids)],
            "weight_version": version}
    if spans is not None:
        meta["weight_versions"] = spans
    return {"output_ids": ids, "meta_info": meta}


@pytest.fixture
def fake():
    server = FakeSGLang()
    yield server
    server.close()


def make_engine(fake, **overrides) -> SGLangEngine:
    fields = dict(base_url=fake.url, vocab_size=100, retry_backoff_s=0.0,
                  control_timeout_s=5.0, request_timeout_s=5.0, verify_digest=False)
    fields.update(overrides)
    return SGLangEngine(SGLangConfig(**fields))


def request(rid="r0", prompt=(1, 2, 3), **sampling) -> GenerationRequest:
    return GenerationRequest(rid, tuple(prompt), SamplingParams(**sampling))


def hf_version(version: int, location="/exports/v", digest="sha256:" + "0" * 64) -> WeightVersion:
    return WeightVersion(version=version, step=version, location=f"{location}{version}",
                         format="hf_safetensors", digest=digest, created_at=0.0)


# ------------------------------------------------------------------ generate


def test_generate_sends_token_ids_and_reads_tokens_logprobs_versions(fake):
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 3}]
    fake.routes["/generate"] = lambda body: (200, answer(body, [7, 8, 9], "stop", spans))
    with make_engine(fake) as engine:
        [gen] = engine.generate([request("a", (1, 2, 3), temperature=0.5, top_k=0,
                                         max_new_tokens=5, stop_token_ids=(9, 9, 4))])
    assert gen.token_ids == (7, 8, 9)
    assert gen.logprobs == pytest.approx((-0.1, -0.2, -0.3))
    assert gen.versions == (3, 3, 4)  # a turn that spans an update keeps both versions
    assert gen.finish_reason is FinishReason.STOP
    sent = [body for _, path, body in fake.calls if path == "/generate"][0]
    assert sent["rid"] == "a" and sent["input_ids"] == [1, 2, 3]
    assert sent["return_logprob"] is True and "text" not in sent
    params = sent["sampling_params"]
    assert params["top_k"] == -1  # Orrery's 0 (off) is SGLang's -1
    assert params["stop_token_ids"] == [4, 9] and "ignore_eos" not in params
    assert params["temperature"] == 0.5 and params["max_new_tokens"] == 5


def test_without_stop_ids_only_length_ends_a_turn():
    payload = generate_payload(request(max_new_tokens=10))
    assert payload["sampling_params"]["ignore_eos"] is True
    assert "stop_token_ids" not in payload["sampling_params"]


def test_max_new_tokens_is_cut_to_the_context_limit():
    # 3 prompt tokens + at most 47 new ones = the 50-token context.
    payload = generate_payload(request(prompt=(1, 2, 3), max_new_tokens=100), max_context=50)
    assert payload["sampling_params"]["max_new_tokens"] == 47


@pytest.mark.parametrize("kind,reason", [("stop", FinishReason.STOP),
                                         ("length", FinishReason.LENGTH),
                                         ("abort", FinishReason.ABORT)])
def test_finish_reasons(kind, reason):
    gen = parse_generation("r", answer({"rid": "r"}, [1, 2], kind))
    assert gen.finish_reason is reason


def test_single_weight_version_of_older_servers_covers_every_token():
    gen = parse_generation("r", answer({"rid": "r"}, [1, 2, 3], version="5"))
    assert gen.versions == (5, 5, 5)


def test_default_weight_version_is_zero():
    gen = parse_generation("r", answer({"rid": "r"}, [1], version="default"))
    assert gen.versions == (0,)


@pytest.mark.parametrize("broken", [
    lambda a: a["meta_info"].update(output_token_logprobs=[[-0.1, 99, None]] * 3),  # ids differ
    lambda a: a.update(output_ids=[1, 2]),  # lengths differ
    lambda a: a["meta_info"].update(finish_reason={"type": "exploded"}),
    lambda a: a["meta_info"].update(weight_version="v1.2"),  # not an Orrery version
])
def test_malformed_answers_raise_sglang_error(fake, broken):
    def route(body):
        a = answer(body, [1, 2, 3])
        broken(a)
        return 200, a

    fake.routes["/generate"] = route
    with make_engine(fake) as engine, pytest.raises(SGLangError):
        engine.generate([request()])


def test_http_failure_names_endpoint_status_and_body(fake):
    fake.routes["/generate"] = lambda body: (500, {"error": "scheduler exploded: boom"})
    with make_engine(fake) as engine, pytest.raises(SGLangError) as info:
        engine.generate([request()])
    assert info.value.endpoint == "POST /generate" and info.value.status == 500
    assert "scheduler exploded: boom" in str(info.value) and "status 500" in str(info.value)


def test_unavailable_server_is_retried_then_answers(fake):
    answers = iter([(503, "starting"), (503, "starting")])
    fake.routes["/generate"] = lambda body: next(answers, None) or (200, answer(body, [5]))
    with make_engine(fake, retries=2) as engine:
        [gen] = engine.generate([request()])
    assert gen.token_ids == (5,) and fake.paths().count("/generate") == 3


def test_client_errors_are_not_retried(fake):
    fake.routes["/generate"] = lambda body: (400, {"error": "bad request"})
    with make_engine(fake, retries=3) as engine, pytest.raises(SGLangError):
        engine.generate([request()])
    assert fake.paths().count("/generate") == 1


def test_a_generate_past_its_deadline_fails_and_is_aborted_on_the_server(fake):
    def slow(body):
        time.sleep(2.0)
        return 200, answer(body, [1])

    fake.routes["/generate"] = slow
    with make_engine(fake, request_timeout_s=0.3) as engine:
        start = time.monotonic()
        with pytest.raises(SGLangError) as info:
            engine.generate([request("slow-1")])
        assert time.monotonic() - start < 1.5
    assert info.value.timed_out and "deadline" in str(info.value)
    assert ("POST", "/abort_request", {"rid": "slow-1"}) in fake.calls


def test_unreachable_server_fails_at_construction_with_the_url():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SGLangError, match=f"cannot reach http://127.0.0.1:{port}"):
        SGLangEngine(SGLangConfig(base_url=f"http://127.0.0.1:{port}", retries=1,
                                  retry_backoff_s=0.0))


def test_abort_posts_the_request_id(fake):
    with make_engine(fake) as engine:
        engine.abort(["x", "y"])
    assert [b for _, p, b in fake.calls if p == "/abort_request"] == [{"rid": "x"}, {"rid": "y"}]


# ------------------------------------------------------------------ validation


def test_out_of_vocabulary_prompts_never_reach_the_server(fake):
    with make_engine(fake, vocab_size=10) as engine:
        with pytest.raises(ValueError, match=r"prompt_ids must lie in \[0, 10\)"):
            engine.submit(request(prompt=(1, 10)))
        with pytest.raises(ValueError, match="shorter than max_context=50"):
            engine.submit(request(prompt=tuple(range(5)) * 10))
    assert "/generate" not in fake.paths()


def test_vocab_size_is_read_from_the_served_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 33}))
    server = FakeSGLang(model_path=str(tmp_path))
    try:
        with make_engine(server, vocab_size=None) as engine:
            assert engine.max_context == 50
            with pytest.raises(ValueError, match=r"\[0, 33\)"):
                engine.submit(request(prompt=(40,)))
    finally:
        server.close()


def test_unscaled_logprob_servers_accept_only_temperatures_0_and_1(fake):
    with make_engine(fake, return_original_logprob=True) as engine:
        with pytest.raises(ValueError, match="temperature must be 0 or 1"):
            engine.submit(request(temperature=0.7))
        assert engine.generate([request(temperature=1.0)])[0].token_ids == (7, 8, 9)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="SGLangConfig.base_url"):
        SGLangConfig(base_url="localhost:30000")
    with pytest.raises(ValueError, match="SGLangConfig.request_timeout_s"):
        SGLangConfig(request_timeout_s=0)
    with pytest.raises(ValueError, match="SGLangConfig.retries"):
        SGLangConfig(retries=-1)


# ------------------------------------------------------------------ weights


def test_update_is_pause_retract_then_load_then_continue(fake):
    with make_engine(fake) as engine:
        assert engine.version == 0
        engine.load_weights(hf_version(1))
        assert engine.version == 1
    paths = fake.paths()
    assert paths[:3] == ["/get_model_info", "/continue_generation", "/server_info"]  # startup
    updates = [p for p in paths[3:] if p != "/get_model_info"]
    assert updates == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
    bodies = {p: b for _, p, b in fake.calls}
    assert bodies["/pause_generation"] == {"mode": "retract"}
    assert bodies["/update_weights_from_disk"] == {"model_path": "/exports/v1",
                                                   "weight_version": "1"}


def test_drain_mode_updates_without_pausing(fake):
    with make_engine(fake, interrupt_on_update=False) as engine:
        engine.load_weights(hf_version(2))
    assert "/pause_generation" not in fake.paths() and engine.version == 2


def test_a_failed_update_still_continues_and_keeps_the_version(fake):
    fake.routes["/update_weights_from_disk"] = lambda body: (
        400, {"success": False, "message": "Failed to update weights: shape mismatch"})
    with make_engine(fake) as engine:
        with pytest.raises(SGLangError, match="shape mismatch"):
            engine.load_weights(hf_version(1))
        assert engine.version == 0
    assert fake.paths()[-1] == "/continue_generation"


def test_versions_only_go_up_and_repeats_are_no_ops(fake):
    with make_engine(fake) as engine:
        engine.load_weights(hf_version(2))
        calls = len(fake.calls)
        assert engine.load_weights(hf_version(2)) >= 0.0
        assert len(fake.calls) == calls
        with pytest.raises(ValueError, match="must not go down"):
            engine.load_weights(hf_version(1))
        with pytest.raises(ValueError, match="different digest"):
            engine.load_weights(hf_version(2, digest="sha256:" + "1" * 64))


def test_only_hf_exports_are_accepted(fake):
    orbax = WeightVersion(version=1, step=1, location="/ckpt/v1", format="orbax",
                          digest="sha256:" + "0" * 64, created_at=0.0)
    with make_engine(fake) as engine, pytest.raises(ValueError, match="hf_safetensors"):
        engine.load_weights(orbax)


def test_an_export_with_a_wrong_digest_is_never_sent_to_the_server(fake, tmp_path):
    import jax

    from model.config import ModelConfig
    from model.decoder import init_params
    from model.weights import SnapshotDigestError, save_hf_snapshot

    config = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                         num_heads=2, num_kv_heads=1)
    good = save_hf_snapshot(init_params(config, jax.random.key(0)), config, tmp_path, 1, 1)
    forged = WeightVersion(**{**good.to_dict(), "digest": "sha256:" + "f" * 64})
    with make_engine(fake, verify_digest=True) as engine:
        with pytest.raises(SnapshotDigestError):
            engine.load_weights(forged)
        assert engine.version == 0
        engine.load_weights(good)
        assert engine.version == 1
    assert fake.paths().count("/update_weights_from_disk") == 1
