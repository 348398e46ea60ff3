"""A learned reward model: the `model/` decoder plus a scalar head, scored in a killable worker.

What it is: the Flax decoder of `model/` (`model.hf_io.load_hf`, `model.decoder.forward`) with a
linear head on the final hidden state (the output of the decoder's `final_norm`, the LM head's
input) of the LAST token: `score = h[-1] . weight + bias`. model/ exposes only logits, so the
hidden state is read with `flax.linen.intercept_methods` around `model.decoder.forward`, the same
idea as the learner's value head (learner/step.py), without importing learner.

Stored as an HF folder (config.json + model.safetensors, as `model.hf_io.save_hf` writes it)
plus `reward_head.safetensors` with `weight` [hidden] and `bias` [] (float32):

    save_reward_model(folder, config, params, head)   head = {"weight": [d], "bias": []}
    load_reward_model(folder) -> (config, params, head)
    score_tokens(params, head, config, tokens_bt, mask_bt) -> [b] float32 (pure; jit it)
    RewardModelScorer(folder, timeout_s).score(tokens) -> float

`RewardModelScorer` runs the model in a separate worker process (multiprocessing "spawn"
context: a fresh interpreter, never a fork of a process that holds JAX state). The worker loads
the model once and answers one sequence at a time with a jitted scorer; sequences are right-
padded to a power-of-two bucket (>= 64) so few programs are compiled (the first call of a bucket
compiles, and `timeout_s` must cover that). Failures are infrastructure errors, never a reward
(DESIGN.md rule 3), and nothing waits forever (rule 4):

- the answer misses `timeout_s`       -> the worker is killed and a fresh one started,
                                         EnvInfraError(VERIFIER_TIMEOUT)
- the worker misses `startup_timeout_s` while loading -> killed, EnvInfraError(VERIFIER_TIMEOUT)
- the worker dies, fails to load, raises, or returns a non-finite score
                                      -> EnvInfraError(VERIFIER_CRASH)
- waiting more than `timeout_s` for another thread's call to finish -> VERIFIER_TIMEOUT

One scorer is thread-safe (calls are serialised: one worker, one sequence at a time).
The agent loop (`rollout/agent.py`) uses it when an env's `EnvSpec.args` has `reward_model`.

What it is not: a trainer for the reward model, and not batched (one trajectory per call).
Test hook: the environment variable ORRERY_REWARD_MODEL_TEST_DELAY_S (seconds), read by the worker
when it starts, delays every answer so tests can make a worker miss its deadline.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from sandbox.api import EnvInfraError, InfraErrorClass

logger = logging.getLogger(__name__)

HEAD_FILE = "reward_head.safetensors"
TEST_DELAY_ENV = "ORRERY_REWARD_MODEL_TEST_DELAY_S"
MIN_BUCKET = 64


# --------------------------------------------------------------------------- model and head


def save_reward_model(folder: str | Path, config, params, head: dict[str, Any], *,
                      tokenizer_dir: str | Path | None = None) -> Path:
    """Write the HF folder (`model.hf_io.save_hf`) plus reward_head.safetensors."""
    from safetensors.numpy import save_file

    from model.hf_io import save_hf

    weight = np.asarray(head["weight"], np.float32)
    bias = np.asarray(head["bias"], np.float32)
    if weight.shape != (config.hidden_size,) or bias.shape != ():
        raise ValueError(f"reward head must have weight [{config.hidden_size}] and bias [], got "
                         f"{weight.shape} and {bias.shape}")
    folder = save_hf(folder, config, params, tokenizer_dir=tokenizer_dir)
    save_file({"weight": np.ascontiguousarray(weight), "bias": bias}, str(folder / HEAD_FILE),
              metadata={"format": "pt"})
    return folder


def load_reward_model(folder: str | Path):
    """(config, params, head) from a folder written by `save_reward_model` (host numpy float32)."""
    from safetensors.numpy import load_file

    from model.hf_io import load_hf

    config, params = load_hf(folder)
    tensors = load_file(str(Path(folder) / HEAD_FILE))
    head = {"weight": np.asarray(tensors["weight"], np.float32),
            "bias": np.asarray(tensors["bias"], np.float32)}
    if head["weight"].shape != (config.hidden_size,) or head["bias"].shape != ():
        raise ValueError(f"{HEAD_FILE} must hold weight [{config.hidden_size}] and bias [], got "
                         f"{head['weight'].shape} and {head['bias'].shape}")
    return config, params, head


def score_tokens(params, head, config, tokens_bt, attention_mask_bt):
    """[b] float32 scores: head applied to the hidden state of each row's last real token
    (rows right-padded; attention_mask 1 on real tokens). Pure; jit with config static."""
    import jax.numpy as jnp

    from model.decoder import forward_with_hidden

    _, hidden = forward_with_hidden(params, config, tokens_bt, attention_mask_bt=attention_mask_bt)
    hidden = hidden.astype(jnp.float32)
    last = jnp.sum(attention_mask_bt.astype(jnp.int32), axis=1) - 1  # [b]
    h_last = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]  # [b, d]
    return h_last @ head["weight"].astype(jnp.float32) + head["bias"].astype(jnp.float32)


def bucket_length(n: int) -> int:
    """The padded length for a sequence of n tokens: the next power of two, at least MIN_BUCKET."""
    return max(MIN_BUCKET, 1 << max(0, n - 1).bit_length())


class _Model:
    """The worker's loaded model with its jitted scorer."""

    def __init__(self, folder: str):
        import jax

        self.config, params, head = load_reward_model(folder)
        self.params = jax.device_put(params)
        self.head = jax.device_put(head)
        self._score = jax.jit(score_tokens, static_argnums=2)

    def score(self, tokens: Sequence[int]) -> float:
        n = len(tokens)
        length = bucket_length(n)
        padded = np.zeros((1, length), np.int32)
        mask = np.zeros((1, length), np.int32)
        padded[0, :n], mask[0, :n] = np.asarray(tokens, np.int32), 1
        return float(np.asarray(self._score(self.params, self.head, self.config, padded, mask))[0])


def _worker_main(folder: str, conn) -> None:
    """The worker process: load once, then answer ("ok", score) / ("error", traceback) per call."""
    # The worker shares its host (and accelerator) with an engine: never grab the whole device.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        model = _Model(folder)
    except BaseException:  # noqa: BLE001 - reported to the parent as a crash
        conn.send(("error", traceback.format_exc()))
        return
    delay_s = float(os.environ.get(TEST_DELAY_ENV) or 0.0)
    conn.send(("ready", None))
    while True:
        try:
            tokens = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if tokens is None:
            return
        try:
            if delay_s:
                time.sleep(delay_s)
            conn.send(("ok", model.score(tokens)))
        except BaseException:  # noqa: BLE001 - reported to the parent as a crash
            conn.send(("error", traceback.format_exc()))


# --------------------------------------------------------------------------- the scorer


class RewardModelScorer:
    """Scores token sequences with the reward model in `folder`, in a killable worker process."""

    def __init__(self, folder: str | Path, timeout_s: float = 30.0,
                 startup_timeout_s: float = 120.0):
        if not timeout_s > 0 or not startup_timeout_s > 0:
            raise ValueError(f"RewardModelScorer timeouts must be > 0, got timeout_s={timeout_s}, "
                             f"startup_timeout_s={startup_timeout_s}")
        self.folder = str(Path(folder).absolute())
        self.timeout_s, self.startup_timeout_s = float(timeout_s), float(startup_timeout_s)
        self._lock = threading.Lock()
        self._ctx = multiprocessing.get_context("spawn")
        self._proc = None
        self._conn = None
        self._ready = False

    @property
    def pid(self) -> int | None:
        """The worker's process id (None when no worker runs)."""
        return None if self._proc is None else self._proc.pid

    def start(self, wait: bool = False) -> None:
        """Start the worker now (otherwise the first `score` does). With `wait`, block until it
        has loaded the model (at most startup_timeout_s; failures raise as in `score`)."""
        with self._lock:
            self._spawn()
            if wait and not self._ready:
                self._receive(self.startup_timeout_s, "start")
                self._ready = True

    def score(self, tokens: Sequence[int]) -> float:
        """The reward model's score of `tokens` (the trajectory's token stream). Raises
        EnvInfraError (VERIFIER_TIMEOUT / VERIFIER_CRASH) on any failure, never a made-up score."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("RewardModelScorer.score needs at least one token, got none")
        if not self._lock.acquire(timeout=self.timeout_s):
            raise EnvInfraError(InfraErrorClass.VERIFIER_TIMEOUT,
                                f"reward model {self.folder}: waited over {self.timeout_s:.1f}s "
                                f"for the worker")
        try:
            self._spawn()
            if not self._ready:
                self._receive(self.startup_timeout_s, "start")
                self._ready = True
            self._send(tokens)
            value = self._receive(self.timeout_s, "score")
        finally:
            self._lock.release()
        if not math.isfinite(value):
            raise EnvInfraError(InfraErrorClass.VERIFIER_CRASH,
                                f"reward model {self.folder} returned a non-finite score {value}")
        return value

    def close(self) -> None:
        """Stop the worker (a later `score` starts a new one). Safe to call twice."""
        with self._lock:
            self._kill()

    def __enter__(self) -> RewardModelScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Everything below runs with self._lock held.

    def _spawn(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            return
        self._kill()
        if not (Path(self.folder) / HEAD_FILE).is_file():
            raise EnvInfraError(InfraErrorClass.VERIFIER_CRASH,
                                f"reward model folder {self.folder} has no {HEAD_FILE}")
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker_main, args=(self.folder, child), daemon=True,
                                 name=f"reward-model:{Path(self.folder).name}")
        proc.start()
        child.close()  # so the parent sees EOF when the worker dies
        self._proc, self._conn, self._ready = proc, parent, False

    def _kill(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc, self._conn, self._ready = None, None, False
        if proc is not None:
            if proc.is_alive():
                proc.kill()
            proc.join(5.0)
        if conn is not None:
            conn.close()

    def _send(self, tokens: list[int]) -> None:
        try:
            self._conn.send(tokens)
        except (OSError, ValueError) as e:  # the worker died between calls
            self._kill()
            raise EnvInfraError(InfraErrorClass.VERIFIER_CRASH,
                                f"reward model {self.folder}: worker gone ({e})") from e

    def _receive(self, timeout_s: float, what: str) -> Any:
        try:
            arrived = self._conn.poll(timeout_s)
        except (OSError, EOFError):
            arrived = True  # closed: recv below reports it
        if not arrived:
            self._kill()
            try:
                self._spawn()  # a fresh worker starts loading for the next call
            except EnvInfraError:
                pass  # the folder went away: the next call reports it
            raise EnvInfraError(InfraErrorClass.VERIFIER_TIMEOUT,
                                f"reward model {self.folder}: {what} missed its "
                                f"{timeout_s:.1f}s deadline; worker killed and restarted")
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError) as e:
            code = self._proc.exitcode if self._proc is not None else None
            self._kill()
            raise EnvInfraError(InfraErrorClass.VERIFIER_CRASH,
                                f"reward model {self.folder}: worker died during {what} "
                                f"(exit code {code})") from e
        if kind == "error":
            if what == "start":
                self._kill()  # it returned after failing to load; a later call retries
            raise EnvInfraError(InfraErrorClass.VERIFIER_CRASH,
                                f"reward model {self.folder}: {what} failed:\n{payload}")
        return payload
