"""ModelConfig: the shape and numerics of one decoder of the Llama / Qwen2 family.

What it is: a frozen, hashable dataclass of plain scalars. Being hashable is the point:
callers pass it to `jax.jit` as a static argument, so every field here *changes the
compiled program* (a new value means a recompile). It reads and writes HuggingFace
`config.json` (`from_hf`, `from_hf_file`, `to_hf`) for `LlamaForCausalLM` and
`Qwen2ForCausalLM`, accepting both the classic `rope_theta` + `rope_scaling` layout and
the newer `rope_parameters` layout.

What it is not: a training or sampling config (learning rates, temperatures, batch sizes
live with the learner and the rollout engine), and not a general HF config parser: keys
that would change the maths in ways this decoder does not implement (sliding windows,
biases on o_proj / MLP, non-SiLU activations) are rejected loudly instead of ignored.

Invariants (checked in `__post_init__`, errors name field, rule and value):
- sizes are positive ints; `num_heads % num_kv_heads == 0` (grouped-query attention);
- `head_dim` is derived as `hidden_size // num_heads` when None, and is even (RoPE);
- `qkv_bias` is derived from `arch` when None and must agree with it (Qwen2 True, Llama
  False), so every valid config exports to a HF layout;
- `rope_scaling` is None or a mapping with `rope_type` in `ROPE_TYPES`; it is stored as a
  `flax.core.FrozenDict` (hashable, compares equal to the plain dict);
- `dtype` is the compute dtype; parameters are always stored in `param_dtype` (float32).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flax.core import FrozenDict

logger = logging.getLogger(__name__)

ARCHS = ("llama", "qwen2")
DTYPES = ("float32", "bfloat16")
ROPE_TYPES = ("default", "linear", "llama3")

# Required keys per rope type (beyond `rope_type`); values are validated as numbers.
_ROPE_REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
}
_HF_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _freeze(value: Any) -> Any:
    """Mappings -> FrozenDict, lists -> tuples, recursively (so the config hashes)."""
    if isinstance(value, Mapping):
        return FrozenDict({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Decoder hyper-parameters. Every field is static under jit (changing one recompiles)."""

    vocab_size: int
    """Rows of the embedding / columns of the LM head (tokens)."""
    hidden_size: int
    """Residual stream width D."""
    intermediate_size: int
    """SwiGLU inner width F."""
    num_layers: int
    """Decoder blocks L."""
    num_heads: int
    """Query heads H."""
    num_kv_heads: int
    """Key/value heads K (GQA: H % K == 0; K == H is plain multi-head attention)."""
    head_dim: int | None = None
    """Per-head width; None derives hidden_size // num_heads."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rope_scaling: Mapping[str, Any] | None = None
    """None, or HF-style {'rope_type': 'linear'|'llama3'|'default', ...} frequency scaling."""
    rms_norm_eps: float = 1e-6
    """Epsilon inside RMSNorm's rsqrt."""
    tie_embeddings: bool = False
    """True: the LM head reuses the embedding matrix (no `lm_head` parameter)."""
    qkv_bias: bool | None = None
    """Bias on q/k/v projections; None derives it from arch (Qwen2 has it, Llama does not)."""
    max_position_embeddings: int = 4096
    """Longest position the model is meant to see (informational; RoPE is not truncated)."""
    dtype: str = "float32"
    """Compute dtype of activations: 'float32' or 'bfloat16'. Logits are always float32."""
    param_dtype: str = "float32"
    """Storage dtype of parameters; only 'float32' is supported."""
    arch: str = "llama"
    """HF architecture written by to_hf: 'llama' (LlamaForCausalLM) or 'qwen2'."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"ModelConfig.num_heads must be a multiple of num_kv_heads, got "
                f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads != 0:
                raise ValueError(
                    f"ModelConfig.head_dim is None so hidden_size must divide by num_heads, "
                    f"got hidden_size={self.hidden_size}, num_heads={self.num_heads}")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if isinstance(self.head_dim, bool) or not isinstance(self.head_dim, int) \
                or self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be a positive even int (RoPE rotates "
                             f"pairs), got {self.head_dim!r}")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive finite number, "
                                 f"got {value!r}")
        object.__setattr__(self, "rope_theta", float(self.rope_theta))
        object.__setattr__(self, "rms_norm_eps", float(self.rms_norm_eps))
        if self.dtype not in DTYPES:
            raise ValueError(f"ModelConfig.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.param_dtype != "float32":
            raise ValueError(f"ModelConfig.param_dtype must be 'float32', "
                             f"got {self.param_dtype!r}")
        if self.arch not in ARCHS:
            raise ValueError(f"ModelConfig.arch must be one of {ARCHS}, got {self.arch!r}")
        if self.qkv_bias is None:
            object.__setattr__(self, "qkv_bias", self.arch == "qwen2")
        if self.qkv_bias != (self.arch == "qwen2"):
            raise ValueError(f"ModelConfig.qkv_bias must be {self.arch == 'qwen2'} for arch "
                             f"{self.arch!r} (the HF layout it exports to), got {self.qkv_bias!r}")
        for name in ("tie_embeddings", "qkv_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ModelConfig.{name} must be a bool, "
                                 f"got {getattr(self, name)!r}")
        object.__setattr__(self, "rope_scaling", self._check_rope_scaling(self.rope_scaling))

    @staticmethod
    def _check_rope_scaling(scaling: Mapping[str, Any] | None) -> FrozenDict | None:
        if scaling is None:
            return None
        if not isinstance(scaling, Mapping):
            raise ValueError(f"ModelConfig.rope_scaling must be None or a mapping, "
                             f"got {scaling!r}")
        scaling = dict(scaling)
        # HF's older key is `type`; the newer one is `rope_type`.
        rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
        scaling.pop("type", None)
        scaling.pop("rope_theta", None)  # lives in ModelConfig.rope_theta
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"ModelConfig.rope_scaling['rope_type'] must be one of "
                             f"{ROPE_TYPES}, got {rope_type!r}")
        for key in _ROPE_REQUIRED[rope_type]:
            value = scaling.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"ModelConfig.rope_scaling[{key!r}] must be a positive number "
                                 f"for rope_type {rope_type!r}, got {value!r}")
        if rope_type == "default":
            return None
        return _freeze({"rope_type": rope_type, **scaling})

    # ------------------------------------------------------------------ HF config.json

    @classmethod
    def from_hf(cls, hf: Mapping[str, Any], *, dtype: str = "float32") -> ModelConfig:
        """Build from a HF `config.json` dict (Llama or Qwen2). `dtype` is the compute dtype."""
        model_type = hf.get("model_type")
        if model_type not in ARCHS:
            raise ValueError(f"config.json model_type must be one of {ARCHS}, "
                             f"got {model_type!r}")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json hidden_act must be 'silu', got {act!r}")
        for key in ("attention_bias", "mlp_bias"):  # Llama biases on o_proj / MLP
            if model_type == "llama" and hf.get(key, False):
                raise ValueError(f"config.json {key} must be false (not implemented), "
                                 f"got {hf[key]!r}")
        if hf.get("use_sliding_window", False):
            raise ValueError(f"config.json use_sliding_window must be false (not implemented), "
                             f"got {hf['use_sliding_window']!r}")
        # Newer transformers write `rope_parameters` (with rope_theta inside) instead of
        # top-level `rope_theta` + `rope_scaling`.
        rope = hf.get("rope_parameters")
        if rope is not None:
            rope = dict(rope)
            theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
        else:
            rope = hf.get("rope_scaling")
            theta = hf.get("rope_theta", 10000.0)
        num_heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim"),
            rope_theta=theta,
            rope_scaling=rope,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),  # HF's default
            qkv_bias=model_type == "qwen2",
            max_position_embeddings=hf.get("max_position_embeddings", 4096),
            dtype=dtype,
            arch=model_type,
        )

    @classmethod
    def from_hf_file(cls, path: str | Path, *, dtype: str = "float32") -> ModelConfig:
        """Read `path` (a config.json, or a folder holding one)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return cls.from_hf(json.loads(path.read_text()), dtype=dtype)

    def to_hf(self, *, bos_token_id: int | None = None, eos_token_id: int | None = None,
              pad_token_id: int | None = None, torch_dtype: str = "float32") -> dict[str, Any]:
        """A HF `config.json` dict (classic `rope_theta` + `rope_scaling` layout, which both
        transformers 4.x and 5.x read)."""
        hf: dict[str, Any] = {
            "architectures": [_HF_ARCH[self.arch]],
            "model_type": self.arch,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rope_scaling": _thaw(self.rope_scaling) if self.rope_scaling else None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
            "torch_dtype": torch_dtype,
        }
        if self.arch == "llama":
            hf.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
        else:
            hf.update(use_sliding_window=False, sliding_window=None,
                      max_window_layers=self.num_layers)
        for key, value in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id),
                           ("pad_token_id", pad_token_id)):
            if value is not None:
                hf[key] = value
        return hf
