"""Learner throughput: train-step tokens/s at ~1M, ~10M and ~50M parameters, and the achieved
FLOP rate as a fraction of this machine's matmul rate measured in the same run.

    .venv/bin/python bench/learner_bench.py                 # all local devices, ~2-3 min on 2 CPUs
    .venv/bin/python bench/learner_bench.py --sizes 1m --steps 5 --mesh fsdp=-1
    .venv/bin/python bench/learner_bench.py --dtype bfloat16  # GPU: bf16 compute and bf16 peak

What it measures. The reference rate is the best of several large square matmuls through
`jax.jit` (n = 2048 on CPU, 8192 on GPU) in the compute dtype: the rate XLA's GEMM reaches on
this machine, not a datasheet peak. Each size then runs the real `Learner.train_step` (GRPO
loss, token-mean, AdamW; no KL, so no reference forward pass) on full-length random
sequences, timed after a warm-up (compile) step. Model FLOPs per token are the usual
6 x (matmul parameters: every projection and the LM head, not the embedding lookup) plus
attention scores and values, 12 x layers x T x heads x head_dim (forward 4 L T h e, backward
twice that; causal masking not discounted, as in the PaLM MFU convention). The ratio is
(model FLOPs / step time) / matmul rate. A forward-only pass (`Learner.compute_logprobs`) is
timed too, to show how the step splits.

Where the rest goes (CPU, measured here on 2 shared cores; see the NOTES below):
- Work that is not a big GEMM: RMSNorm, RoPE, SiLU*up, residual adds, the float32
  log-softmax over the vocabulary for logprobs *and* entropy (read twice: forward and
  backward), attention's softmax and masking. All are memory-bound elementwise passes over
  [b, t, d] / [b, t, v] activations; on CPU they run at memory bandwidth, not FLOP rate.
- Attention via `jax.nn.dot_product_attention` is not fused on CPU (XLA's reference
  implementation materialises the [b, h, t, t] scores); on GPU it can use cuDNN flash attention.
- Small GEMMs: the 1M model's 128-wide projections are far below the size where XLA:CPU's
  GEMM reaches its peak, so the smallest model has the lowest ratio; the ratio rises with size.
- The optimiser: AdamW + clipping reads and writes ~5 float32 copies of every parameter per
  step (memory-bound; it matters most for the small-batch 50M case).
- The non-finite guard (a select over the state) and per-step host sync for metrics.
On GPUs the flags in learner/gpu.py (latency-hiding scheduler, collective overlap) and bf16
compute (`--dtype bfloat16`) are the levers; with one device there are no collectives.

NOTES (figures recorded from runs; update them when you rerun on new hardware):
- 2 CPU cores shared with other jobs (load average ~9 during the run, so every number is
  pessimistic and noisy by +-30%), float32, one device, defaults (2 timed steps):

      matmul rate: 33.9 GFLOP/s
        1m:  1.0M params  4096 tok/step  1230 tok/s   8.7 GFLOP/s = 0.26  (forward 22%)
       10m: 11.0M params  1024 tok/step   219 tok/s  13.7 GFLOP/s = 0.40  (forward 18%)
       50m: 44.9M params   512 tok/step    80 tok/s  20.4 GFLOP/s = 0.60  (forward 26%)

  Measured split for 1m (separate jits): the optimiser update is ~4 ms of a ~2-3 s step;
  forward+backward is all of it, with backward ~3-4x the forward instead of the ideal 2x.
  That excess is in the non-GEMM work listed above (XLA:CPU runs attention's backward and
  the elementwise/log-softmax backward passes unfused), which is why the ratio climbs from
  0.26 to 0.60 as GEMMs dominate with size. Compile takes 25-30 s per size on these cores.
- GPU (H200): not yet measured -- no GPU was lent to the session that wrote this. Run
  `bench/learner_bench.py` and `--dtype bfloat16` there and record both tables here.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).absolute().parent.parent))

from learner.gpu import apply_gpu_flags  # noqa: E402  (must precede backend start)

apply_gpu_flags()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from learner.api import Batch  # noqa: E402
from learner.config import LearnerConfig  # noqa: E402
from learner.learner import Learner  # noqa: E402
from learner.sharding import describe, make_mesh  # noqa: E402
from model import decoder  # noqa: E402
from model.config import ModelConfig  # noqa: E402

# name -> (model shape, rows, tokens per row). Batches shrink with size to keep the default
# run to a few minutes on two CPU cores.
SIZES: dict[str, tuple[dict, int, int]] = {
    "1m": (dict(vocab_size=1024, hidden_size=128, intermediate_size=384, num_layers=4,
                num_heads=4, num_kv_heads=2), 16, 256),
    "10m": (dict(vocab_size=4096, hidden_size=384, intermediate_size=1024, num_layers=5,
                 num_heads=6, num_kv_heads=2), 4, 256),
    "50m": (dict(vocab_size=8192, hidden_size=640, intermediate_size=1728, num_layers=8,
                 num_heads=10, num_kv_heads=2), 2, 256),
}


def matmul_rate(dtype: str, repeats: int = 5) -> float:
    """Best FLOP/s of an n x n x n matmul through jax.jit, in `dtype`."""
    n = 8192 if jax.default_backend() == "gpu" else 2048
    key_a, key_b = jax.random.split(jax.random.PRNGKey(0))
    a = jax.random.normal(key_a, (n, n), dtype)
    b = jax.random.normal(key_b, (n, n), dtype)
    matmul = jax.jit(lambda x, y: x @ y)
    matmul(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def model_flops_per_token(c: ModelConfig, tokens: int) -> tuple[int, float]:
    """(parameter count, training FLOPs per token) for a sequence of `tokens`."""
    d, f, h, k, e, v, layers = (c.hidden_size, c.intermediate_size, c.num_heads,
                                c.num_kv_heads, c.head_dim, c.vocab_size, c.num_layers)
    per_layer = d * h * e + 2 * d * k * e + h * e * d + 3 * d * f
    matmul_params = layers * per_layer + d * v  # + LM head (tied or not, it is a matmul)
    params = layers * (per_layer + 2 * d) + d + v * d + (0 if c.tie_embeddings else d * v)
    attention = 12 * layers * tokens * h * e
    return params, 6 * matmul_params + attention


def random_batch(rows: int, tokens: int, vocab: int, row_multiple: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    prompt = min(16, tokens // 4)
    seqs, masks, logps, advs = [], [], [], []
    for _ in range(rows):
        seqs.append(rng.integers(0, vocab, tokens))
        mask = np.ones(tokens, np.float32)
        mask[:prompt] = 0
        masks.append(mask)
        logps.append(np.full(tokens, -np.log(vocab), np.float32))
        advs.append(float(rng.normal()))
    return Batch.from_sequences(seqs, masks, logps, advs, row_multiple=row_multiple,
                                min_tokens=tokens)


def bench_size(name: str, mesh, dtype: str, steps: int, peak: float) -> dict:
    shape, rows, tokens = SIZES[name]
    model_config = ModelConfig(**shape)
    config = LearnerConfig(compute_dtype=dtype, learning_rate=1e-5)
    params = decoder.init_params(model_config, jax.random.PRNGKey(0))
    learner = Learner(config, model_config, params, mesh)
    batch = random_batch(rows, tokens, model_config.vocab_size, learner.row_multiple)
    n_params, flops_per_token = model_flops_per_token(model_config, batch.num_tokens)
    real_tokens = int(batch.attention_mask_bt.sum())

    start = time.perf_counter()
    learner.train_step(batch)  # compile + first step
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        learner.train_step(batch)
        times.append(time.perf_counter() - start)
    step_s = min(times)

    learner.compute_logprobs(batch)  # compile
    fwd = []
    for _ in range(max(2, steps)):
        start = time.perf_counter()
        learner.compute_logprobs(batch)
        fwd.append(time.perf_counter() - start)
    forward_s = min(fwd)

    achieved = flops_per_token * real_tokens / step_s
    return {"size": name, "params": n_params, "tokens": real_tokens, "step_s": step_s,
            "tokens_per_s": real_tokens / step_s, "achieved": achieved, "ratio": achieved / peak,
            "forward_frac": forward_s / step_s, "compile_s": compile_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m,50m", help=f"comma list of {list(SIZES)}")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per size (best kept)")
    parser.add_argument("--mesh", default="", help="mesh spec (default: all devices on fsdp)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="compute dtype of the train step and of the reference matmul")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    mesh = make_mesh(args.mesh or None)
    peak = matmul_rate(args.dtype)
    print(f"backend {jax.default_backend()} x{jax.device_count()} ({jax.devices()[0].device_kind}),"
          f" mesh {describe(mesh)}, dtype {args.dtype}")
    print(f"matmul rate: {peak / 1e9:.1f} GFLOP/s (best {args.dtype} square matmul via jax.jit)")
    for name in args.sizes.split(","):
        r = bench_size(name.strip(), mesh, args.dtype, args.steps, peak)
        print(f"{r['size']:>4}: {r['params'] / 1e6:5.1f}M params  {r['tokens']:5d} tok/step  "
              f"step {r['step_s'] * 1e3:8.1f} ms  {r['tokens_per_s']:9.0f} tok/s  "
              f"{r['achieved'] / 1e9:7.1f} GFLOP/s  = {r['ratio']:.2f} of matmul rate  "
              f"(forward {r['forward_frac']:.0%} of step; compile {r['compile_s']:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()
