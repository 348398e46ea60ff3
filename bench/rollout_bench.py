"""Rollout throughput: the embedded JaxEngine against HF transformers, and continuous vs static batching.

Part 1, decode tokens/s at batch 1, 16 and 64 on the same weights (a model.factory folder):
JaxEngine (greedy, `decode_steps_per_call` fused steps, one slot per sequence) against
transformers `generate` (PyTorch CPU, greedy, KV cache on). Both produce exactly `--new-tokens`
tokens per sequence after a `--prompt`-token prompt; times include prefill. The HF column is
skipped when torch/transformers are not installed. (The SGLang CPU server column belongs to
`rollout/sglang.py`'s benchmark.)

Part 2, multi-turn agent throughput (trajectories/s): `--episodes` synthetic episodes of
`--turns` policy turns whose lengths are drawn uneven (4..`--max-turn` tokens), each followed
by a tool call of uneven latency (0..`--tool-ms`) and an 8-token observation, on one engine
with `--agent-slots` slots. Continuous: every episode is a thread feeding the scheduler (other
episodes decode while one waits for its tool; sessions reuse KV). Static: episodes run in
batches of `slots`; each turn waits for the batch's longest turn and slowest tool, and the next
batch waits for the whole batch (what a static-batch sampler does).

Part 3, the memory-bandwidth bound: a decode step reads every weight once (shared by the
batch) plus each row's KV cache. This engine attends over whole cache rows, so it reads
`max_seq_len` KV slots per row, not just the context. Bound tokens/s = batch * bandwidth /
(weight bytes + batch * KV bytes per row), with bandwidth measured by a large numpy copy. Tiny
models fit in CPU caches, so on them the DRAM bound is far away and dispatch overhead rules.

Run: .venv/bin/python bench/rollout_bench.py            (about 2 minutes on 2 CPU cores)
     .venv/bin/python bench/rollout_bench.py --size tiny --batches 1,16 --skip-hf
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from model.factory import SIZES, make_tiny_model
from model.hf_io import load_hf
from rollout.api import GenerationRequest, SamplingParams
from rollout.config import JaxEngineConfig
from rollout.engine_jax import JaxEngine


def jax_decode_tps(config, params, batch: int, prompt: int, new: int, steps: int) -> float:
    engine_config = JaxEngineConfig(slots=batch, max_seq_len=prompt + new + 8,
                                    prefill_buckets=(prompt,), decode_steps_per_call=steps)
    rng = np.random.default_rng(0)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=new)

    def requests(tag):
        return [GenerationRequest(f"{tag}{i}", tuple(int(t) for t in rng.integers(
            10, config.vocab_size, prompt)), sampling) for i in range(batch)]

    with JaxEngine(config, params, engine_config) as engine:
        engine.warmup()  # compile every shape
        engine.generate(requests("warm"))
        start = time.perf_counter()
        out = engine.generate(requests("run"))
        elapsed = time.perf_counter() - start
    assert all(len(g.token_ids) == new for g in out)
    return batch * new / elapsed


def hf_decode_tps(model_dir: Path, batches: list[int], prompt: int, new: int,
                  vocab: int) -> list[float]:
    """transformers generate in a fresh process: XLA's CPU thread pools, once started, slow
    PyTorch in the same process several-fold, which would flatter the JAX column. Each batch
    reports the better of 1 and all torch threads (on a busy machine threads oversubscribe)."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import rollout_bench as b; print(json.dumps([b._hf_one({str(model_dir)!r}, n, "
            f"{prompt}, {new}, {vocab}) for n in {batches!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _hf_one(model_dir: str, batch: int, prompt: int, new: int, vocab: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    threads = torch.get_num_threads()
    best = 0.0
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        best = max(best, _hf_run(model_dir, batch, prompt, new, vocab))
    torch.set_num_threads(threads)
    return best


def _hf_run(model_dir: str, batch: int, prompt: int, new: int, vocab: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    ids = torch.tensor(rng.integers(10, vocab, (batch, prompt)), dtype=torch.long)
    kwargs = dict(min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0,
                  attention_mask=torch.ones_like(ids))
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=4, **{**kwargs, "min_new_tokens": 4})  # warm
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, **kwargs)
        elapsed = time.perf_counter() - start
    assert out.shape[1] == prompt + new
    return batch * new / elapsed


def agent_throughput(config, params, slots: int, episodes: int, turns: int, max_turn: int,
                     steps: int, tool_ms: float) -> tuple[float, float]:
    rng = np.random.default_rng(1)
    prompts = [tuple(int(t) for t in rng.integers(10, config.vocab_size, 24))
               for _ in range(episodes)]
    lengths = rng.integers(4, max_turn + 1, (episodes, turns))
    tool_s = rng.uniform(0, tool_ms / 1000, (episodes, turns))  # each tool call's latency
    observation = tuple(range(20, 28))
    engine_config = JaxEngineConfig(slots=slots, max_seq_len=24 + turns * (max_turn + 8) + 8,
                                    prefill_buckets=(16, 64), decode_steps_per_call=steps)

    def turn_request(e, t, context):
        return GenerationRequest(f"e{e}t{t}", tuple(context), SamplingParams(
            temperature=1.0, max_new_tokens=int(lengths[e, t]), seed=e), session_id=f"e{e}")

    with JaxEngine(config, params, engine_config) as engine:
        engine.warmup()  # compile every shape both modes use

        def episode(e):
            context = list(prompts[e])
            for t in range(turns):
                context += engine.generate([turn_request(e, t, context)])[0].token_ids
                time.sleep(tool_s[e, t])  # the tool runs; other episodes keep decoding
                context += observation
            engine.release_session(f"e{e}")

        start = time.perf_counter()
        threads = [threading.Thread(target=episode, args=(e,)) for e in range(episodes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        continuous = episodes / (time.perf_counter() - start)

        start = time.perf_counter()
        for first in range(0, episodes, slots):
            batch = list(range(first, min(first + slots, episodes)))
            contexts = {e: list(prompts[e]) for e in batch}
            for t in range(turns):
                outs = engine.generate([turn_request(e, t, contexts[e]) for e in batch])
                time.sleep(max(tool_s[e, t] for e in batch))  # tools run in parallel
                for e, gen in zip(batch, outs):
                    contexts[e] += list(gen.token_ids) + list(observation)
            for e in batch:
                engine.release_session(f"e{e}")
        static = episodes / (time.perf_counter() - start)
    return continuous, static


def bandwidth_gbs() -> float:
    src = np.ones(64 << 20, np.float32)  # 256 MiB
    dst = np.empty_like(src)
    np.copyto(dst, src)
    start = time.perf_counter()
    for _ in range(3):
        np.copyto(dst, src)
    return 3 * 2 * src.nbytes / (time.perf_counter() - start) / 1e9  # read + write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-turn", type=int, default=96)
    parser.add_argument("--tool-ms", type=float, default=20.0,
                        help="each tool call takes uniform 0..this many ms")
    parser.add_argument("--agent-slots", type=int, default=8)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / args.size, **SIZES[args.size])
        config, params = load_hf(model_dir)
        n_params = sum(int(np.prod(np.shape(x))) for x in __import__("jax").tree.leaves(params))
        print(f"model {args.size}: {n_params / 1e6:.2f}M params, vocab {config.vocab_size}, "
              f"{config.num_layers} layers, hidden {config.hidden_size}")
        results: dict = {"size": args.size, "params": n_params, "decode": [], "agent": {}}
        hf_ok = not args.skip_hf
        if hf_ok:
            try:
                import torch  # noqa: F401
                import transformers  # noqa: F401
            except ImportError:
                hf_ok = False
                print("torch/transformers not installed: HF column skipped")

        batches = [int(b) for b in args.batches.split(",")]
        t1 = time.perf_counter()
        hf = (hf_decode_tps(model_dir, batches, args.prompt, args.new_tokens, config.vocab_size)
              if hf_ok else [float("nan")] * len(batches))
        print(f"(model {t1 - t0:.0f}s, hf {time.perf_counter() - t1:.0f}s)")
        print(f"\ndecode tokens/s, prompt {args.prompt}, {args.new_tokens} new tokens, greedy")
        print(f"{'batch':>6} {'jax':>10} {'hf':>10} {'jax/hf':>8}")
        for batch, hf_tps in zip(batches, hf):
            jax_tps = jax_decode_tps(config, params, batch, args.prompt, args.new_tokens,
                                     args.decode_steps)
            print(f"{batch:>6} {jax_tps:>10.0f} {hf_tps:>10.0f} {jax_tps / hf_tps:>8.2f}")
            results["decode"].append({"batch": batch, "jax_tps": jax_tps, "hf_tps": hf_tps})

        t2 = time.perf_counter()
        continuous, static = agent_throughput(config, params, args.agent_slots, args.episodes,
                                              args.turns, args.max_turn, args.decode_steps,
                                              args.tool_ms)
        print(f"\nagent episodes/s ({args.episodes} episodes x {args.turns} turns of 4..{args.max_turn}"
              f" tokens, tools 0..{args.tool_ms:g} ms, {args.agent_slots} slots): continuous "
              f"{continuous:.2f}, static {static:.2f}, ratio {continuous / static:.2f}")
        results["agent"] = {"continuous_eps": continuous, "static_eps": static}
        print(f"(agent part {time.perf_counter() - t2:.0f}s)")

        bw = bandwidth_gbs()
        weight_bytes = 4 * n_params
        max_len = args.prompt + args.new_tokens + 8
        kv_row = 2 * config.num_layers * max_len * config.num_kv_heads * config.head_dim * 4
        print(f"\nmemory-bandwidth bound (float32; measured copy bandwidth {bw:.1f} GB/s):")
        print(f"  weights {weight_bytes / 1e6:.1f} MB read per decode step (shared by the batch);"
              f" KV {kv_row / 1e3:.0f} kB per row per step (whole {max_len}-slot rows)")
        for row in results["decode"]:
            b = row["batch"]
            bound = b * bw * 1e9 / (weight_bytes + b * kv_row)
            row["bound_tps"] = bound
            print(f"  batch {b:>3}: bound {bound:>12.0f} tokens/s, jax at "
                  f"{100 * row['jax_tps'] / bound:.2f}% of it")
        results["bandwidth_gbs"] = bw
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
