"""Decode throughput of the embedded-sampler path: model.decoder.forward_with_cache.

Measures, for one model size, a ragged prefill and then `--steps` decode steps of one token
per row (greedy argmax, jitted with the cache donated), and prints tokens/s. It exists to
catch regressions in the KV-cache layout (e.g. a cache copy per step), not as a sampler.

Run: .venv/bin/python bench/model_decode.py --size tiny --batch 8 --max-len 256 --steps 64
"""

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from model.config import ModelConfig
from model.decoder import forward_with_cache, init_cache, init_params

SIZES = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_layers=2,
                 num_heads=4, num_kv_heads=2),
    "small": dict(vocab_size=2048, hidden_size=256, intermediate_size=688, num_layers=4,
                  num_heads=8, num_kv_heads=4),
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_layers=16,
               num_heads=32, num_kv_heads=8),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()

    config = ModelConfig(**SIZES[args.size], dtype=args.dtype)
    params = init_params(config, jax.random.key(0))

    @functools.partial(jax.jit, donate_argnums=1)
    def step(params, cache, tokens_bt, positions_bt):
        logits, cache = forward_with_cache(params, config, tokens_bt, positions_bt, cache)
        return jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32), cache

    b = args.batch
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.prompt // 2, args.prompt + 1, size=b)
    cols = np.arange(args.prompt)[None]
    prompt = rng.integers(0, config.vocab_size, size=(b, args.prompt))
    positions = np.where(cols < lengths[:, None], cols, -1)
    cache = init_cache(config, b, args.max_len)

    t0 = time.perf_counter()
    _, cache = step(params, cache, prompt, positions)
    jax.block_until_ready(cache)
    prefill_s = time.perf_counter() - t0
    tokens = jnp.asarray(prompt[np.arange(b), lengths - 1][:, None], jnp.int32)
    pos = jnp.asarray(lengths[:, None], jnp.int32)
    tokens, cache = step(params, cache, tokens[:, :1], pos)  # compile decode
    jax.block_until_ready(tokens)
    t0 = time.perf_counter()
    for i in range(args.steps):
        tokens, cache = step(params, cache, tokens[:, None], pos + 1 + i)
    jax.block_until_ready(tokens)
    decode_s = time.perf_counter() - t0
    print(json.dumps({"size": args.size, "dtype": args.dtype, "batch": b,
                      "max_len": args.max_len, "device": str(jax.devices()[0]),
                      "prefill_with_compile_s": round(prefill_s, 3),
                      "decode_step_ms": round(1e3 * decode_s / args.steps, 3),
                      "decode_tokens_per_s": round(b * args.steps / decode_s, 1)}))


if __name__ == "__main__":
    main()
