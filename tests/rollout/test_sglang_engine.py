"""SGLangEngine against a real SGLang server (CPU, float32): the server side of the client.

Proves: token-in/token-out generation with logprobs and per-token versions; stop tokens and
the context limit; that a weight update from the learner's HF export (model.weights.
save_hf_snapshot) changes outputs and the reported version, and serves exactly those weights;
that SGLang's behaviour logprobs match the JAX decoder's `token_logprobs` on the same weights
(the trainer/inference mismatch, measured and printed); that pause / update / continue stamps
two versions on a request in flight, each token scored by the weights that made it; abort.

Server: ORRERY_SGLANG_URL if set (CI starts it with .ci/sglang_server.sh on a
`python -m model.factory --size tiny` folder); otherwise this module starts one from SGLang's
venv (.ci/sglang_env.sh builds it; about a minute to start) and skips when that venv is
absent. Either way the first step loads known weights as a new version, so a server's history
does not matter; only the tiny model's shapes must match. Run:

    .venv/bin/python -m pytest tests/rollout/test_sglang_engine.py -m sglang -s -q
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import subprocess
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from rollout.api import FinishReason, GenerationRequest, SamplingParams

pytestmark = pytest.mark.sglang

REPO = Path(__file__).resolve().parents[2]
SERVER_SCRIPT = REPO / ".ci" / "sglang_server.sh"
ENV_SCRIPT = REPO / ".ci" / "sglang_env.sh"
START_TIMEOUT_S = 420

# float32 on both sides, different kernels (PyTorch CPU matmuls, SGLang's torch-native
# attention and log(softmax) vs XLA's fused log_softmax), so the logprobs differ by float32
# rounding accumulated through the network. Logits of this tiny model are O(1-10); float32
# carries ~7 significant digits, so rounding shows up around 1e-6..1e-5 per token. 1e-4 leaves
# an order of magnitude of headroom and is still far below any real mismatch: a wrong
# temperature, a stale weight or a misplaced position moves logprobs by 1e-2 or more.
LOGPROB_TOL = 1e-4


@dataclasses.dataclass
class Served:
    """The server, a client engine on it, and the weights it serves now."""

    url: str
    engine: object
    config: object
    params: object
    model_dir: Path
    exports: Path
    vocab: int

    def publish(self, params):
        """Export params as the learner does (HF safetensors + WeightVersion), next version."""
        from model.weights import save_hf_snapshot

        return save_hf_snapshot(params, self.config, self.exports, self.engine.version + 1,
                                step=self.engine.version + 1, tokenizer_dir=self.model_dir)

    def load(self, params) -> float:
        seconds = self.engine.load_weights(self.publish(params))
        self.params = params
        return seconds


def peaked(params, seed: int, scale: float = 0.2):
    """Seeded noise in every leaf (norm scales around 1): a random init's logits are nearly
    uniform, which would make greedy outputs and logprob checks hinge on float noise."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    rng = np.random.default_rng(seed)
    out = []
    for path, leaf in leaves:
        noise = rng.normal(size=np.shape(leaf)).astype(np.float32)
        out.append(1.0 + 0.3 * noise if "scale" in jax.tree_util.keystr(path) else scale * noise)
    return jax.tree_util.tree_unflatten(treedef, out)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(model_dir: Path, state_dir: Path) -> tuple[str, callable]:
    if not SERVER_SCRIPT.is_file():
        pytest.skip(f"{SERVER_SCRIPT} is not here (sandboxed run?); set ORRERY_SGLANG_URL")
    venv = subprocess.run([str(ENV_SCRIPT), "--print-venv"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not (Path(venv) / "bin" / "python").exists():
        pytest.skip(f"no SGLang venv at {venv}: build it with .ci/sglang_env.sh, or point "
                    f"ORRERY_SGLANG_URL at a running server")
    port = str(_free_port())
    env = {**os.environ, "ORRERY_SGLANG_STATE_DIR": str(state_dir)}
    start = time.monotonic()
    run = subprocess.run([str(SERVER_SCRIPT), "start", str(model_dir), port], env=env,
                         capture_output=True, text=True, timeout=START_TIMEOUT_S + 60)
    if run.returncode != 0:
        pytest.fail(f"SGLang server did not start (rc {run.returncode}):\n{run.stderr[-4000:]}")
    print(f"\nSGLang server ready in {time.monotonic() - start:.0f}s at {run.stdout.strip()}")

    def stop():
        subprocess.run([str(SERVER_SCRIPT), "stop", str(model_dir), port], env=env,
                       capture_output=True, timeout=60)

    return run.stdout.strip().splitlines()[-1], stop


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    from model.factory import SIZES, make_tiny_model
    from model.hf_io import load_hf
    from rollout.sglang import SGLangConfig, SGLangEngine

    root = tmp_path_factory.mktemp("sglang")
    model_dir = make_tiny_model(root / "tiny", **SIZES["tiny"])
    url, stop = os.environ.get("ORRERY_SGLANG_URL"), None
    if not url:
        url, stop = _start_server(model_dir, root / "server")
    config, params = load_hf(model_dir)
    engine = SGLangEngine(SGLangConfig(base_url=url, request_timeout_s=300.0))
    try:
        served = Served(url, engine, config, None, model_dir, root / "exports", config.vocab_size)
        served.load(peaked(params, seed=0))  # known weights, whatever the server did before
        yield served
    finally:
        engine.close()
        if stop is not None:
            stop()


@functools.partial(jax.jit, static_argnums=1)
def _padded_logprobs(params, config, tokens_bt, mask_bt, temperature):
    from model.decoder import token_logprobs

    return token_logprobs(params, config, tokens_bt, mask_bt, temperature)


def jax_logprobs(served: Served, params, prompt, output, temperature: float) -> np.ndarray:
    """The learner's logprobs of `output` after `prompt` (greedy scores at T = 1), right-padded
    to a multiple of 256 tokens so lengths share compiled programs."""
    tokens = list(prompt) + list(output)
    length = -(-len(tokens) // 256) * 256
    padded = np.zeros((1, length), np.int32)
    mask = np.zeros((1, length), np.int32)
    padded[0, :len(tokens)], mask[0, :len(tokens)] = tokens, 1
    t = np.float32(temperature if temperature > 0 else 1.0)
    logp = np.asarray(_padded_logprobs(params, served.config, padded, mask, t))[0]
    return logp[len(prompt) - 1:len(tokens) - 1]


def prompt_of(length: int, seed: int, vocab: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(seed).integers(3, vocab, length))


# ------------------------------------------------------------------ generation


def test_generation_is_token_exact_with_logprobs_and_versions(served):
    v = served.engine.version
    requests = [
        GenerationRequest("greedy", prompt_of(12, 1, served.vocab),
                          SamplingParams(temperature=0.0, max_new_tokens=16)),
        GenerationRequest("sampled", prompt_of(30, 2, served.vocab),
                          SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_new_tokens=16)),
        GenerationRequest("greedy-again", prompt_of(12, 1, served.vocab),
                          SamplingParams(temperature=0.0, max_new_tokens=16)),
    ]
    greedy, sampled, again = served.engine.generate(requests)
    for gen in (greedy, sampled):
        assert len(gen.token_ids) == len(gen.logprobs) == len(gen.versions) == 16
        assert all(0 <= t < served.vocab for t in gen.token_ids)
        assert all(np.isfinite(lp) and lp <= 0.0 for lp in gen.logprobs)
        assert set(gen.versions) == {v}
        assert gen.finish_reason is FinishReason.LENGTH
    assert again.token_ids == greedy.token_ids  # greedy is deterministic


def test_stop_token_is_kept_and_ends_the_turn(served):
    prompt = prompt_of(10, 3, served.vocab)
    [free] = served.engine.generate([GenerationRequest(
        "free", prompt, SamplingParams(temperature=0.0, max_new_tokens=12))])
    stop = free.token_ids[4]
    eos = {2}  # the tiny model's eos_token_id also stops once stop ids are given (documented)
    end = next(i for i, t in enumerate(free.token_ids) if t == stop or t in eos)
    [stopped] = served.engine.generate([GenerationRequest(
        "stopped", prompt, SamplingParams(temperature=0.0, max_new_tokens=12,
                                          stop_token_ids=(stop,)))])
    assert stopped.token_ids == free.token_ids[:end + 1]
    assert stopped.finish_reason is FinishReason.STOP


def test_a_turn_reaching_the_context_limit_ends_with_length(served):
    room = 4
    prompt = prompt_of(served.engine.max_context - room, 4, served.vocab)
    [gen] = served.engine.generate([GenerationRequest(
        "long", prompt, SamplingParams(temperature=1.0, max_new_tokens=64))])
    assert len(gen.token_ids) == room and gen.finish_reason is FinishReason.LENGTH


def test_out_of_vocabulary_ids_are_refused_and_the_server_survives(served):
    with pytest.raises(ValueError, match="prompt_ids must lie in"):
        served.engine.generate([GenerationRequest("oov", (5, served.vocab),
                                                  SamplingParams(max_new_tokens=2))])
    assert served.engine.healthy


# ------------------------------------------------------------------ logprobs


def test_logprobs_match_the_jax_decoder_on_the_same_weights(served):
    """The trainer/inference mismatch: SGLang's behaviour logprobs vs the learner's."""
    settings = [(1.0, 1.0, 0), (0.7, 1.0, 0), (1.3, 0.9, 40), (0.0, 1.0, 0)]
    requests = [GenerationRequest(f"lp{i}", prompt_of(8 + 11 * i, 10 + i, served.vocab),
                                  SamplingParams(temperature=t, top_p=p, top_k=k,
                                                 max_new_tokens=32))
                for i, (t, p, k) in enumerate(settings)]
    gens = served.engine.generate(requests)
    gaps = []
    for req, gen in zip(requests, gens):
        ref = jax_logprobs(served, served.params, req.prompt_ids, gen.token_ids,
                           req.sampling.temperature)
        gaps.append(np.abs(np.asarray(gen.logprobs) - ref))
    gap = np.concatenate(gaps)
    print(f"\nSGLang vs JAX logprob gap over {gap.size} tokens: max {gap.max():.2e}, "
          f"mean {gap.mean():.2e}")
    assert gap.max() < LOGPROB_TOL


# ------------------------------------------------------------------ weights


def test_weight_update_changes_outputs_and_the_version(served):
    prompt = prompt_of(16, 5, served.vocab)
    req = GenerationRequest("w", prompt, SamplingParams(temperature=0.0, max_new_tokens=24))
    [before] = served.engine.generate([req])
    old = served.engine.version
    seconds = served.load(peaked(served.params, seed=1))
    [after] = served.engine.generate([req])
    print(f"\nSGLang update_weights_from_disk (pause, load, continue): {seconds:.2f}s")
    assert served.engine.version == old + 1
    assert set(before.versions) == {old} and set(after.versions) == {old + 1}
    assert after.token_ids != before.token_ids
    # The server now serves exactly the exported weights: its logprobs are the learner's.
    ref = jax_logprobs(served, served.params, prompt, after.token_ids, 0.0)
    assert np.abs(np.asarray(after.logprobs) - ref).max() < LOGPROB_TOL


# Long enough that a request is still decoding a second after it was sent, even on an idle
# machine where SGLang's CPU server makes a few hundred tokens a second; within the context.
LONG = 1600


def test_pause_update_continue_stamps_two_versions_on_a_request_in_flight(served):
    prompt = prompt_of(20, 6, served.vocab)
    old_params, old = served.params, served.engine.version
    future = served.engine.submit(GenerationRequest(
        "in-flight", prompt, SamplingParams(temperature=0.0, max_new_tokens=LONG)))
    time.sleep(1.0)  # well inside the LONG decode steps (seconds even on an idle machine)
    assert not future.done()
    served.load(peaked(served.params, seed=2))
    gen = future.result(timeout=600)
    assert gen.finish_reason is FinishReason.LENGTH and len(gen.token_ids) == LONG
    switch = gen.versions.index(old + 1)
    print(f"\nversions: {switch} tokens at v{old}, {len(gen.versions) - switch} at v{old + 1}")
    assert 0 < switch and set(gen.versions[:switch]) == {old}
    assert set(gen.versions[switch:]) == {old + 1}
    # Each token was scored by the weights that made it: the old ones before the switch, the
    # new ones after (the retracted request is re-prefilled under the new weights).
    before = jax_logprobs(served, old_params, prompt, gen.token_ids, 0.0)[:switch]
    after = jax_logprobs(served, served.params, prompt, gen.token_ids, 0.0)[switch:]
    assert np.abs(np.asarray(gen.logprobs[:switch]) - before).max() < LOGPROB_TOL
    assert np.abs(np.asarray(gen.logprobs[switch:]) - after).max() < LOGPROB_TOL


def test_abort_returns_the_tokens_so_far(served):
    future = served.engine.submit(GenerationRequest(
        "to-abort", prompt_of(8, 7, served.vocab), SamplingParams(max_new_tokens=LONG)))
    time.sleep(1.0)
    served.engine.abort(["to-abort"])
    gen = future.result(timeout=60)
    assert gen.finish_reason is FinishReason.ABORT
    assert 0 < len(gen.token_ids) < LONG
    assert len(gen.logprobs) == len(gen.versions) == len(gen.token_ids)
