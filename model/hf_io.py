"""HF safetensors import / export for the decoder (Llama and Qwen2 parameter names).

What it is: the mapping between our params tree (see `model.decoder`) and HuggingFace
tensor names in PyTorch layouts (`nn.Linear.weight` is [out, in]):

    model.embed_tokens.weight                     [v, d]    = embed/embedding
    model.layers.N.self_attn.q_proj.weight        [h*e, d]  = q_kernel[N] [d, h, e] -> T
    model.layers.N.self_attn.{k,v}_proj.weight    [k*e, d]  = {k,v}_kernel[N] -> T
    model.layers.N.self_attn.{q,k,v}_proj.bias    [*]       = {q,k,v}_bias[N] (Qwen2)
    model.layers.N.self_attn.o_proj.weight        [d, h*e]  = o_kernel[N] [h, e, d] -> T
    model.layers.N.mlp.{gate,up}_proj.weight      [f, d]    = {gate,up}_kernel[N].T
    model.layers.N.mlp.down_proj.weight           [d, f]    = down_kernel[N].T
    model.layers.N.input_layernorm.weight         [d]       = input_norm/scale[N]
    model.layers.N.post_attention_layernorm.weight [d]      = post_attn_norm/scale[N]
    model.norm.weight                             [d]       = final_norm/scale
    lm_head.weight                                [v, d]    = lm_head/kernel.T (untied only)

`save_hf` writes config.json + model.safetensors (metadata format=pt) that
`transformers.AutoModelForCausalLM.from_pretrained` and SGLang's
`update_weights_from_disk` load as-is; `load_hf` reads one file or a sharded
`model.safetensors.index.json`.

What it is not: a general converter (other architectures, quantised weights, and GGUF are
out of scope) and not the weight-sync format between learner and rollout (`model.weights`).

Invariants: save then load in float32 is bit-exact (only reshapes and transposes); loaded
params are host numpy float32 whatever the file dtype; a missing or unexpected tensor
raises ValueError naming it.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from model.config import ModelConfig

logger = logging.getLogger(__name__)

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")
EXPORT_DTYPES = ("float32", "bfloat16")

_NORMS = (("input_norm", "input_layernorm"), ("post_attn_norm", "post_attention_layernorm"))
_MLP = ("gate", "up")


def to_hf_tensors(config: ModelConfig, params: Any, dtype: str = "float32"
                  ) -> dict[str, np.ndarray]:
    """HF name -> contiguous numpy tensor in PyTorch layout, cast to `dtype`."""
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"save_hf dtype must be one of {EXPORT_DTYPES}, got {dtype!r}")
    out_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float32)
    p = _to_numpy(params)
    layers, attn, mlp = p["layers"], p["layers"]["attn"], p["layers"]["mlp"]
    c = config
    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": p["embed"]["embedding"],
                                      "model.norm.weight": p["final_norm"]["scale"]}
    for n in range(c.num_layers):
        prefix = f"model.layers.{n}."
        for name in ("q", "k", "v"):
            kernel = attn[f"{name}_kernel"][n]  # [d, heads, e]
            tensors[f"{prefix}self_attn.{name}_proj.weight"] = kernel.reshape(c.hidden_size,
                                                                              -1).T
            if c.qkv_bias:
                tensors[f"{prefix}self_attn.{name}_proj.bias"] = attn[f"{name}_bias"][n].reshape(-1)
        tensors[f"{prefix}self_attn.o_proj.weight"] = attn["o_kernel"][n].reshape(
            -1, c.hidden_size).T
        for name in _MLP:
            tensors[f"{prefix}mlp.{name}_proj.weight"] = mlp[f"{name}_kernel"][n].T
        tensors[f"{prefix}mlp.down_proj.weight"] = mlp["down_kernel"][n].T
        for ours, theirs in _NORMS:
            tensors[f"{prefix}{theirs}.weight"] = layers[ours]["scale"][n]
    if not c.tie_embeddings:
        tensors["lm_head.weight"] = p["lm_head"]["kernel"].T
    return {k: np.ascontiguousarray(v.astype(out_dtype)) for k, v in tensors.items()}


def from_hf_tensors(config: ModelConfig, tensors: dict[str, np.ndarray]) -> dict[str, Any]:
    """Our params tree (host numpy float32) from HF-named tensors in PyTorch layout."""
    c = config
    d, h, k, e = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    used: set[str] = set()

    def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"safetensors must contain tensor {name!r} for this config, "
                             f"got none")
        value = np.asarray(tensors[name]).astype(np.float32)
        if value.shape != shape:
            raise ValueError(f"safetensors tensor {name!r} must have shape {shape}, "
                             f"got {value.shape}")
        used.add(name)
        return value

    def stack(fn) -> np.ndarray:
        return np.stack([fn(n, f"model.layers.{n}.") for n in range(c.num_layers)])

    heads = {"q": h, "k": k, "v": k}
    attn = {}
    for name, nh in heads.items():
        attn[f"{name}_kernel"] = stack(lambda n, pre: take(
            f"{pre}self_attn.{name}_proj.weight", (nh * e, d)).T.reshape(d, nh, e))
        if c.qkv_bias:
            attn[f"{name}_bias"] = stack(lambda n, pre: take(
                f"{pre}self_attn.{name}_proj.bias", (nh * e,)).reshape(nh, e))
    attn["o_kernel"] = stack(lambda n, pre: take(
        f"{pre}self_attn.o_proj.weight", (d, h * e)).T.reshape(h, e, d))
    mlp = {f"{name}_kernel": stack(lambda n, pre: take(
        f"{pre}mlp.{name}_proj.weight", (c.intermediate_size, d)).T) for name in _MLP}
    mlp["down_kernel"] = stack(lambda n, pre: take(
        f"{pre}mlp.down_proj.weight", (d, c.intermediate_size)).T)
    layers: dict[str, Any] = {"attn": attn, "mlp": mlp}
    for ours, theirs in _NORMS:
        layers[ours] = {"scale": stack(lambda n, pre: take(f"{pre}{theirs}.weight", (d,)))}
    params: dict[str, Any] = {
        "embed": {"embedding": take("model.embed_tokens.weight", (c.vocab_size, d))},
        "final_norm": {"scale": take("model.norm.weight", (d,))},
        "layers": layers,
    }
    if not c.tie_embeddings:
        params["lm_head"] = {"kernel": take("lm_head.weight", (c.vocab_size, d)).T.copy()}
    elif "lm_head.weight" in tensors:
        used.add("lm_head.weight")  # tied checkpoints sometimes carry a copy; ignore it
        logger.info("tie_embeddings is set: ignoring lm_head.weight in the checkpoint")
    extra = sorted(set(tensors) - used - {n for n in tensors if n.endswith("rotary_emb.inv_freq")})
    if extra:
        raise ValueError(f"safetensors must only contain tensors of this config, got "
                         f"unexpected {extra[:5]}{' ...' if len(extra) > 5 else ''}")
    return params


def read_safetensors(folder: str | Path) -> dict[str, np.ndarray]:
    """All tensors of `folder` (model.safetensors, or the shards of the index) as numpy."""
    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / SAFETENSORS).is_file():
        files = [SAFETENSORS]
    else:
        raise FileNotFoundError(f"HF folder must contain {SAFETENSORS} or {SAFETENSORS_INDEX}, "
                                f"got neither in {folder}")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        with safe_open(str(folder / name), framework="numpy") as f:
            for key in f.keys():
                tensors[key] = f.get_tensor(key)
    return tensors


def load_hf(folder: str | Path, *, dtype: str = "float32") -> tuple[ModelConfig, dict[str, Any]]:
    """(config, params) from a HF folder. `dtype` is the compute dtype put in the config;
    params are always host numpy float32."""
    config = ModelConfig.from_hf_file(Path(folder) / "config.json", dtype=dtype)
    params = from_hf_tensors(config, read_safetensors(folder))
    logger.info("loaded %s (%d layers, hidden %d) from %s", config.arch, config.num_layers,
                config.hidden_size, folder)
    return config, params


def save_hf(folder: str | Path, config: ModelConfig, params: Any, *,
            tokenizer_dir: str | Path | None = None, dtype: str = "float32",
            hf_extra: dict[str, Any] | None = None) -> Path:
    """Write config.json + model.safetensors (+ tokenizer files copied from tokenizer_dir).

    `dtype` is the stored tensor dtype ('float32' round-trips bit-exactly; 'bfloat16' halves
    the size for serving). `hf_extra` adds keys to config.json (e.g. eos_token_id)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf = config.to_hf(torch_dtype=dtype)
    hf.update(hf_extra or {})
    save_file(to_hf_tensors(config, params, dtype), str(folder / SAFETENSORS),
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.is_file() and src.resolve() != (folder / name).resolve():
                shutil.copyfile(src, folder / name)
    logger.info("saved %s (%s) to %s", config.arch, dtype, folder)
    return folder


def _to_numpy(params: Any) -> Any:
    if isinstance(params, dict):
        return {k: _to_numpy(v) for k, v in params.items()}
    return np.asarray(params)
