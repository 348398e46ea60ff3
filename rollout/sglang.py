"""SGLangEngine: the rollout `Engine` as a client of an SGLang server (GPU fleets).

What it is: a thin, thread-safe client of SGLang's native HTTP API, token in and token out:

    POST /generate                  {"rid", "input_ids", "sampling_params", "return_logprob"}
    POST /update_weights_from_disk  {"model_path": <HF export folder>, "weight_version": "<n>"}
    POST /pause_generation          {"mode": "retract"}   (around an update, see below)
    POST /continue_generation       {}
    POST /abort_request             {"rid"}
    GET  /health, /get_model_info, /server_info

Text never crosses: prompts go as `input_ids`, outputs come back as `output_ids` with
`meta_info.output_token_logprobs` ([logprob, token_id, _] per token) and
`meta_info.weight_versions` (spans {version, start, end} of output positions), which become
the per-token `Generation.versions`. Each `generate` request is one HTTP call on a pool
thread; SGLang batches concurrent calls itself (continuous batching, radix prefix cache, so
`session_id` needs no handling here).

Behaviour logprobs (what the learner's importance ratios compare against): SGLang's default is
exactly Orrery's definition (`rollout.api.Engine`): for temperature T > 0,
log softmax(logits / T)[token], the temperature-scaled distribution before top-k / top-p
truncation (sglang/srt/layers/sampler.py: `log(softmax(logits / T))`, taken before the top-k /
top-p filter); for greedy (T == 0) SGLang samples at T = 1 with top_k = 1, so the logprob is
log softmax(logits)[token]. The learner therefore recomputes them with
`model.decoder.token_logprobs(..., temperature=T)` (T = 1 for greedy), as for the JAX engine;
tests/rollout/test_sglang_engine.py measures the gap. A server started with
`SGLANG_RETURN_ORIGINAL_LOGPROB=1` returns log softmax(logits) whatever T is; declare it with
`SGLangConfig.return_original_logprob=True` and the engine refuses temperatures other than 0
and 1, the only ones where the two definitions agree, instead of handing out logprobs of
another distribution.

Sampling: temperature, top_p, top_k, max_new_tokens and stop strings map one to one (stop
strings need a server with a tokenizer). Stop tokens are kept in the output. SGLang cannot
stop on the caller's stop ids alone: its `ignore_eos` also disables `stop_token_ids`, so with
stop ids the model's own EOS ids (config.json `eos_token_id`) stop sampling too; with none,
`ignore_eos` is set and only the length (or a stop string) ends a turn. Orrery's agent always
lists the EOS among its stop ids, so both engines agree there. `SamplingParams.seed` is not
sent: SGLang honours `sampling_seed` only under `--enable-deterministic-inference`.

Weights: `load_weights(WeightVersion)` takes the learner's HF safetensors export
(`model.weights.save_hf_snapshot`), checks its digest here first (`load_snapshot`; optional,
`verify_digest`), then asks the server to load it and stamps the new version. With
`interrupt_on_update` (default) the update is wrapped in pause(mode=retract) / continue:
requests in flight are put back in the queue, the KV cache is flushed, and after the switch
they are re-prefilled and continue on the new weights, so one turn carries two versions (the
same semantics as the JAX engine's interrupt mode). Without it, SGLang's update waits for
in-flight requests to finish on their version (drain). If loading fails, SGLang reloads the
weights it had and this engine keeps its version. Versions only go up; the same version again
is a no-op.

Errors: every HTTP failure raises `SGLangError` (an `EngineError`, so an infra error, never a
reward) naming the endpoint, the status and the start of the body. Every call has a deadline
(`SGLangConfig`); a /generate past its deadline is aborted on the server. Connection refusals
and 503s are retried `retries` times; nothing else is. Out-of-vocabulary prompt ids are
refused before sending, because they crash SGLang's CPU server outright.

What it is not: a launcher. The server is started beside the worker (`.ci/sglang_server.sh`
for tests) or given by address. Never call /release_memory_occupation on CPU: it kills the
server.

Security: SGLang's HTTP API includes administrative endpoints (load weights from any path,
pause, abort, flush) and has no roles, so only the worker next to it may reach it. The
controller never talks to SGLang; it reaches the worker's RolloutService, which is guarded
(orrery/security.py). Start SGLang with `--host 127.0.0.1` (`.ci/sglang_server.sh` does); a
`base_url` whose host is not loopback is refused unless `api_key` is set, the key of a server
started with `--api-key` (SGLang then requires `Authorization: Bearer <key>` on every route but
/health and /metrics). The key is read from `--sglang-api-key-file` or ORRERY_SGLANG_API_KEY,
never from a flag's value, is sent on every call, and is not shown by the config's repr. Over
plain http it still crosses the network in clear: prefer https, or a private network.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from model.weights import WeightVersion, load_snapshot
from orrery.security import is_loopback
from rollout.api import EngineError, FinishReason, Generation, GenerationRequest

logger = logging.getLogger(__name__)

_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}
_RETRY_STATUS = frozenset({503})
_BODY_EXCERPT = 500


@dataclasses.dataclass(frozen=True)
class SGLangConfig:
    """How to reach one SGLang server and how long to wait for it."""

    base_url: str = "http://127.0.0.1:30000"
    """Server address, scheme included; no trailing path."""
    request_timeout_s: float = 300.0
    """Deadline of one /generate call (the whole turn: SGLang answers only when done)."""
    control_timeout_s: float = 30.0
    """Deadline of model info, pause, continue and abort calls."""
    health_timeout_s: float = 5.0
    """Deadline of the /health probe behind `healthy` (worker info calls it)."""
    update_timeout_s: float = 600.0
    """Deadline of /update_weights_from_disk (reading the export into the server)."""
    retries: int = 2
    """Extra attempts after a refused connection or a 503; other failures are not retried."""
    retry_backoff_s: float = 0.5
    """Wait before the first retry; doubles each attempt."""
    max_concurrency: int = 64
    """/generate calls in flight at once (pool threads); more requests queue client-side."""
    interrupt_on_update: bool = True
    """True: pause (retract) / update / continue, so in-flight requests finish on the new
    weights and carry two versions. False: the update waits for them to finish (drain)."""
    verify_digest: bool = True
    """Read the export and check its params digest before the server loads it (reads the
    weights once more on the worker; rule 5 of DESIGN.md)."""
    return_original_logprob: bool = False
    """Declares that the server runs with SGLANG_RETURN_ORIGINAL_LOGPROB=1 (logprobs of the
    unscaled distribution); only temperatures 0 and 1 are then accepted."""
    vocab_size: int | None = None
    """Prompt ids must be below this; None reads it from the served model's config.json when
    that folder is readable here (otherwise ids are not range-checked)."""
    max_context: int | None = None
    """Longest prompt + output in tokens; None asks the server (its max_req_input_len, a few
    tokens under the model's context length). max_new_tokens is cut to fit it."""
    api_key: str = dataclasses.field(default="", repr=False)
    """The SGLang server's --api-key, sent as a bearer token; required when base_url is not
    loopback. Never printed."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"SGLangConfig.base_url must start with http:// or https://, "
                             f"got {self.base_url!r}")
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        host = urllib.parse.urlsplit(self.base_url).hostname or ""
        if not is_loopback(host) and not self.api_key:
            raise ValueError(
                f"SGLangConfig.base_url must be a loopback address unless api_key is set, got "
                f"{self.base_url!r}: SGLang's administrative endpoints (weight loading, pause, abort) "
                f"must be reachable only by this worker; bind SGLang to 127.0.0.1, or start it with "
                f"--api-key and give the key (--sglang-api-key-file or ORRERY_SGLANG_API_KEY)")
        if self.api_key and not is_loopback(host) and self.base_url.startswith("http://"):
            logger.warning("SGLang at %s: the API key crosses the network in clear (http); prefer https",
                           self.base_url)
        for name in ("request_timeout_s", "control_timeout_s", "health_timeout_s",
                     "update_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"SGLangConfig.{name} must be a positive number, got {value!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"SGLangConfig.retries must be an int >= 0, got {self.retries!r}")
        if not self.retry_backoff_s >= 0:
            raise ValueError(f"SGLangConfig.retry_backoff_s must be >= 0, "
                             f"got {self.retry_backoff_s!r}")
        for name in ("max_concurrency", "vocab_size", "max_context"):
            value = getattr(self, name)
            if value is None and name != "max_concurrency":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"SGLangConfig.{name} must be a positive int, got {value!r}")


class SGLangError(EngineError):
    """An SGLang HTTP call failed: which endpoint, which status (None: no answer), what body."""

    def __init__(self, endpoint: str, problem: str, status: int | None = None, body: str = "",
                 *, timed_out: bool = False):
        self.endpoint, self.status, self.body, self.timed_out = endpoint, status, body, timed_out
        excerpt = body if len(body) <= _BODY_EXCERPT else body[:_BODY_EXCERPT] + "..."
        super().__init__(f"SGLang {endpoint}: {problem} (status {status})"
                         + (f": {excerpt}" if excerpt else ""))


# ------------------------------------------------------------------ pure request/response


def parse_version(value: Any) -> int:
    """SGLang's weight version string -> int. A server started without --weight-version
    reports "default": the weights it started with, which Orrery numbers 0."""
    if value is None or value == "default":
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"SGLang weight_version must be an integer string (Orrery versions), "
                         f"got {value!r}") from None


def generate_payload(request: GenerationRequest, max_context: int | None = None) -> dict[str, Any]:
    """The /generate body for one request (token ids in, logprobs of the sampled tokens out).

    With `max_context`, max_new_tokens is cut so prompt + output fits: a turn that reaches the
    context limit ends with LENGTH (SGLang would refuse the whole request with a 400)."""
    s = request.sampling
    max_new = s.max_new_tokens
    if max_context is not None:
        max_new = min(max_new, max_context - len(request.prompt_ids))
    params: dict[str, Any] = {
        "max_new_tokens": max_new,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,  # SGLang: -1 is the whole vocabulary
    }
    if s.stop_token_ids:
        params["stop_token_ids"] = sorted(set(int(t) for t in s.stop_token_ids))
    else:
        params["ignore_eos"] = True  # (it would also disable stop_token_ids)
    if s.stop_strings:
        params["stop"] = list(s.stop_strings)
        params["no_stop_trim"] = True
    return {"rid": request.request_id, "input_ids": [int(t) for t in request.prompt_ids],
            "sampling_params": params, "return_logprob": True, "logprob_start_len": -1,
            "stream": False}


def parse_generation(request_id: str, body: Any) -> Generation:
    """A /generate answer -> Generation; raises SGLangError when it is not well formed."""
    def bad(problem: str) -> SGLangError:
        return SGLangError("POST /generate", f"malformed answer for {request_id!r}: {problem}",
                           200, json.dumps(body)[:_BODY_EXCERPT])

    if not isinstance(body, dict) or not isinstance(body.get("meta_info"), dict):
        raise bad("expected an object with meta_info")
    meta = body["meta_info"]
    ids = body.get("output_ids")
    pairs = meta.get("output_token_logprobs")
    if not isinstance(ids, list) or not isinstance(pairs, list) or len(ids) != len(pairs):
        raise bad("output_ids and meta_info.output_token_logprobs must be lists of one length")
    if [int(p[1]) for p in pairs] != [int(t) for t in ids]:
        raise bad("output_token_logprobs token ids differ from output_ids")
    if any(p[0] is None for p in pairs):
        raise bad("a sampled token has no logprob")
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind not in _FINISH:
        raise bad(f"finish_reason.type must be one of {sorted(_FINISH)}, got {finish!r}")
    n = len(ids)
    versions: list[int | None] = [None] * n
    try:
        for span in meta.get("weight_versions") or ():
            version = parse_version(span["version"])
            for i in range(max(0, int(span["start"])), min(n, int(span["end"]))):
                versions[i] = version
        if None in versions:  # older servers: one version for the whole request
            if "weight_version" not in meta:
                raise bad("no weight_versions span or weight_version covers every output token")
            fallback = parse_version(meta["weight_version"])
            versions = [fallback if v is None else v for v in versions]
    except (ValueError, KeyError, TypeError) as e:
        raise bad(f"weight versions: {e}") from e
    return Generation(request_id=request_id, token_ids=tuple(int(t) for t in ids),
                      logprobs=tuple(float(p[0]) for p in pairs),
                      versions=tuple(int(v) for v in versions), finish_reason=_FINISH[kind])


# ------------------------------------------------------------------ the engine


class SGLangEngine:
    """`rollout.api.Engine` on an SGLang server. Thread-safe; `close()` when done."""

    name = "sglang"

    def __init__(self, config: SGLangConfig):
        self.config = config
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.max_concurrency, thread_name_prefix="sglang-generate")
        self._update_lock = threading.Lock()
        self._lock = threading.Lock()
        self._generated_tokens = 0
        info = self.model_info()
        # A worker that died between pause and continue would leave the server paused, and
        # every request would wait for its deadline. One server serves one worker: resume it.
        self._call("POST", "/continue_generation", {}, config.control_timeout_s)
        self._version = parse_version(info.get("weight_version"))
        self._digest = ""
        self._vocab_size = config.vocab_size or _vocab_from_folder(info.get("model_path"))
        if self._vocab_size is None:
            logger.warning("SGLang model folder %r is not readable here and vocab_size is not "
                           "configured: prompt ids are not range-checked", info.get("model_path"))
        self._max_context = config.max_context or int(
            self._call("GET", "/server_info", None, config.control_timeout_s)["max_req_input_len"])
        logger.info("SGLang engine on %s: weight version %d, vocab %s, max context %d",
                    config.base_url, self._version, self._vocab_size, self._max_context)

    # -------------------------------------------------------------- Engine protocol

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context(self) -> int:
        """Longest prompt + output one request may reach (tokens)."""
        return self._max_context

    @property
    def healthy(self) -> bool:
        try:
            self._call("GET", "/health", None, self.config.health_timeout_s, retries=0)
            return True
        except SGLangError:
            return False

    @property
    def stats(self) -> dict[str, int]:
        return {"generated_tokens": self._generated_tokens}

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        """Validate now (ValueError), then send on a pool thread; the future gives the Generation."""
        self._validate(request)
        return self._pool.submit(self._generate_one, request)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Sample every request to completion, concurrently; order matches input."""
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def abort(self, request_ids: Sequence[str]) -> None:
        """Finish these requests now; their generate calls return the tokens so far with ABORT."""
        for rid in request_ids:
            self._call("POST", "/abort_request", {"rid": rid}, self.config.control_timeout_s)

    def load_weights(self, version: WeightVersion) -> float:
        """Verify the HF export's digest, have the server load it, stamp `version`.

        Returns seconds spent. The same version again is a no-op; a lower one raises ValueError."""
        start = time.perf_counter()
        with self._update_lock:
            if version.version < self._version:
                raise ValueError(f"SGLangEngine.load_weights version must not go down: serving "
                                 f"{self._version}, got {version.version}")
            if version.version == self._version:
                if version.digest and self._digest and version.digest != self._digest:
                    raise ValueError(f"SGLangEngine.load_weights got version {version.version} "
                                     f"again with a different digest")
                return time.perf_counter() - start
            if version.format != "hf_safetensors":
                raise ValueError(f"SGLangEngine.load_weights needs WeightVersion.format "
                                 f"'hf_safetensors' (an HF export), got {version.format!r}")
            if self.config.verify_digest:
                load_snapshot(version)  # SnapshotDigestError: the server is never asked
            self._switch(version)
            self._version, self._digest = version.version, version.digest
        seconds = time.perf_counter() - start
        logger.info("SGLang %s serves weight version %d (%.2fs)", self.config.base_url,
                    version.version, seconds)
        return seconds

    def model_info(self) -> dict[str, Any]:
        """GET /get_model_info: model_path, weight_version, ..."""
        return self._call("GET", "/get_model_info", None, self.config.control_timeout_s)

    def close(self) -> None:
        """Stop sending; queued requests are cancelled (the server is left running)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> SGLangEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------- internals

    def _validate(self, request: GenerationRequest) -> None:
        s, rid = request.sampling, request.request_id
        prompt = request.prompt_ids
        if not prompt:
            raise ValueError(f"GenerationRequest.prompt_ids must be non-empty (request {rid!r})")
        if self._vocab_size is not None and (min(prompt) < 0 or max(prompt) >= self._vocab_size):
            raise ValueError(f"GenerationRequest.prompt_ids must lie in [0, {self._vocab_size}), "
                             f"got min {min(prompt)} max {max(prompt)} (request {rid!r})")
        if len(prompt) >= self._max_context:
            raise ValueError(f"GenerationRequest.prompt_ids must be shorter than max_context="
                             f"{self._max_context}, got {len(prompt)} tokens (request {rid!r})")
        if s.max_new_tokens <= 0 or s.temperature < 0 or not 0 < s.top_p <= 1 or s.top_k < 0:
            raise ValueError(f"SamplingParams must have max_new_tokens > 0, temperature >= 0, "
                             f"0 < top_p <= 1, top_k >= 0, got {s} (request {rid!r})")
        if self.config.return_original_logprob and s.temperature not in (0, 1):
            raise ValueError(f"SamplingParams.temperature must be 0 or 1 on a server that returns "
                             f"unscaled logprobs (return_original_logprob), got {s.temperature}")

    def _generate_one(self, request: GenerationRequest) -> Generation:
        try:
            body = self._call("POST", "/generate", generate_payload(request, self._max_context),
                              self.config.request_timeout_s)
        except SGLangError as e:
            if e.timed_out:
                self._abort_quietly(request.request_id)
            raise
        generation = parse_generation(request.request_id, body)
        with self._lock:
            self._generated_tokens += len(generation.token_ids)
        return generation

    def _abort_quietly(self, rid: str) -> None:
        try:
            self._call("POST", "/abort_request", {"rid": rid}, self.config.control_timeout_s,
                       retries=0)
        except SGLangError as e:
            logger.warning("could not abort %s after its deadline: %s", rid, e)

    def _switch(self, version: WeightVersion) -> None:
        """Have the server load `version` (paused around it when interrupting)."""
        c = self.config
        body = {"model_path": str(version.location), "weight_version": str(version.version)}
        paused = False
        try:
            if c.interrupt_on_update:
                self._call("POST", "/pause_generation", {"mode": "retract"}, c.control_timeout_s)
                paused = True
            answer = self._call("POST", "/update_weights_from_disk", body, c.update_timeout_s,
                                retries=0)
            if not answer.get("success"):
                raise SGLangError("POST /update_weights_from_disk", "the server did not load "
                                  f"{version.location}", 200, json.dumps(answer))
        finally:
            if paused:
                self._call("POST", "/continue_generation", {}, c.control_timeout_s)
        served = self.model_info().get("weight_version")
        if served != str(version.version):
            raise SGLangError("GET /get_model_info", f"after loading version {version.version} "
                              f"the server reports weight_version {served!r}", 200)

    def _call(self, method: str, path: str, payload: dict | None, timeout_s: float,
              retries: int | None = None) -> Any:
        """One HTTP call with a deadline; JSON answer (None if empty) or SGLangError."""
        endpoint = f"{method} {path}"
        url = self.config.base_url + path
        data = None if payload is None else json.dumps(payload).encode()
        retries = self.config.retries if retries is None else retries
        backoff = self.config.retry_backoff_s
        for attempt in range(retries + 1):
            headers = {"Content-Type": "application/json"}
            if self.config.api_key:
                headers["Authorization"] = f"Bearer {self.config.api_key}"
            request = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    raw = response.read().decode("utf-8", "replace")
                return json.loads(raw) if raw.strip() else None
            except urllib.error.HTTPError as e:
                text = e.read().decode("utf-8", "replace")
                if e.code in _RETRY_STATUS and attempt < retries:
                    error = SGLangError(endpoint, "server unavailable", e.code, text)
                else:
                    raise SGLangError(endpoint, "request failed", e.code, text) from None
            except (socket.timeout, TimeoutError) as e:
                raise SGLangError(endpoint, f"no answer within its {timeout_s:g}s deadline "
                                  f"from {url}", timed_out=True) from e
            except urllib.error.URLError as e:
                if isinstance(e.reason, (socket.timeout, TimeoutError)):
                    raise SGLangError(endpoint, f"no answer within its {timeout_s:g}s deadline "
                                      f"from {url}", timed_out=True) from e
                if not isinstance(e.reason, ConnectionRefusedError) or attempt == retries:
                    raise SGLangError(endpoint, f"cannot reach {url}: {e.reason}") from e
                error = SGLangError(endpoint, f"cannot reach {url}: {e.reason}")
            except (http.client.HTTPException, ConnectionError) as e:
                raise SGLangError(endpoint, f"connection to {url} failed: "
                                  f"{type(e).__name__}: {e}") from e
            except json.JSONDecodeError as e:
                raise SGLangError(endpoint, f"answer is not JSON: {e}", 200) from e
            logger.warning("%s (attempt %d of %d); retrying in %.1fs", error, attempt + 1,
                           retries + 1, backoff)
            time.sleep(backoff)
            backoff *= 2
        raise AssertionError("unreachable")


def _vocab_from_folder(model_path: str | None) -> int | None:
    """vocab_size from <model_path>/config.json when this process can read it."""
    if not model_path:
        return None
    try:
        return int(json.loads((Path(model_path) / "config.json").read_text())["vocab_size"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


def build_engine(args: Any) -> SGLangEngine:
    """The engine `python -m rollout.server --engine sglang --sglang-url URL` serves."""
    url = getattr(args, "sglang_url", "")
    key_file = getattr(args, "sglang_api_key_file", "")
    if key_file:
        try:
            api_key = Path(key_file).read_text().strip()
        except OSError as error:
            raise ValueError(f"--sglang-api-key-file {key_file}: cannot read ({error.strerror})") from None
    else:
        api_key = os.environ.get("ORRERY_SGLANG_API_KEY", "").strip()
    if not url:
        raise ValueError("rollout.server --engine sglang needs --sglang-url (the SGLang server "
                         "address, e.g. http://127.0.0.1:30000)")
    return SGLangEngine(SGLangConfig(base_url=url, api_key=api_key))

