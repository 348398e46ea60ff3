"""model: the decoder family shared by the learner and the rollout engine.

Modules (import them directly; this package imports nothing on its own):

- `model.config`    ModelConfig, a frozen hashable dataclass; HF config.json in and out.
- `model.decoder`   Flax linen Llama/Qwen2 decoder behind pure functions: init_params,
                    param_logical_axes, forward, init_cache, forward_with_cache,
                    token_logprobs, logprobs_from_logits (the one behaviour-logprob definition).
- `model.tokenizer` Tokenizer: a `tokenizers.Tokenizer` plus special tokens and the ChatML
                    chat template rendered in Python.
- `model.factory`   train a byte-level BPE tokenizer and write tiny deterministic HF-style
                    model folders (`python -m model.factory --out DIR --size tiny`).
- `model.hf_io`     load_hf / save_hf: HF safetensors (Llama and Qwen2 names, PyTorch layouts).
- `model.convert`   CLI: `python -m model.convert hf-to-orbax|orbax-to-hf SRC DST`.
- `model.weights`   WeightVersion, params_digest, save_snapshot / load_snapshot: the weight
                    snapshot the learner publishes and rollout workers load.

What it is not: sharding policy (learner/sharding.py maps logical names to a mesh) or a
sampler (rollout/ owns sampling). Nothing here imports learner/, rollout/ or sandbox/.
"""
