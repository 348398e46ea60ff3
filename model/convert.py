"""Convert model folders between HF safetensors and an Orbax params checkpoint.

    python -m model.convert hf-to-orbax SRC_HF_DIR DST_DIR
    python -m model.convert orbax-to-hf SRC_DIR DST_HF_DIR [--dtype float32|bfloat16]

The Orbax folder layout is

    DST/config.json    HF config.json (so ModelConfig.from_hf_file reads it)
    DST/params/        Orbax PyTree checkpoint of the params tree (host numpy float32)
    DST/tokenizer*.json copied from the source when present

What it is not: a training-checkpoint tool (learner/ saves optimiser state and friends).
Invariant: hf -> orbax -> hf in float32 reproduces every tensor bit-exactly.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np

from model.config import ModelConfig
from model.hf_io import TOKENIZER_FILES, load_hf, save_hf

logger = logging.getLogger(__name__)

PARAMS_DIR = "params"


def save_orbax(folder: str | Path, config: ModelConfig, params: Any, *,
               tokenizer_dir: str | Path | None = None,
               hf_extra: dict[str, Any] | None = None) -> Path:
    """Write config.json (+ `hf_extra` keys) + params/ (Orbax) (+ tokenizer files) into
    `folder`, which must not hold params/ yet."""
    import orbax.checkpoint as ocp

    folder = Path(folder).absolute()
    if (folder / PARAMS_DIR).exists():
        raise ValueError(f"save_orbax folder must not already hold {PARAMS_DIR}/, got {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), params)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(folder / PARAMS_DIR, host)
    checkpointer.wait_until_finished()
    checkpointer.close()
    hf = {**config.to_hf(), **(hf_extra or {})}
    (folder / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).is_file():
                shutil.copyfile(Path(tokenizer_dir) / name, folder / name)
    return folder


def load_orbax(folder: str | Path, *, dtype: str = "float32") -> tuple[ModelConfig, Any]:
    """(config, params as host numpy) from a folder written by `save_orbax`."""
    import orbax.checkpoint as ocp

    folder = Path(folder).absolute()
    config = ModelConfig.from_hf_file(folder / "config.json", dtype=dtype)
    with ocp.PyTreeCheckpointer() as checkpointer:
        tree = checkpointer.metadata(folder / PARAMS_DIR).item_metadata.tree
        args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        params = checkpointer.restore(folder / PARAMS_DIR, restore_args=args)
    return config, params


_TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _token_ids(folder: str | Path) -> dict[str, Any]:
    """The special-token ids of a config.json, carried across a conversion unchanged."""
    hf = json.loads((Path(folder) / "config.json").read_text())
    return {k: hf[k] for k in _TOKEN_ID_KEYS if hf.get(k) is not None}


def hf_to_orbax(src: str | Path, dst: str | Path) -> Path:
    config, params = load_hf(src)
    return save_orbax(dst, config, params, tokenizer_dir=src, hf_extra=_token_ids(src))


def orbax_to_hf(src: str | Path, dst: str | Path, dtype: str = "float32") -> Path:
    config, params = load_orbax(src)
    return save_hf(dst, config, params, tokenizer_dir=src, dtype=dtype,
                   hf_extra=_token_ids(src))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Convert HF safetensors <-> Orbax params.")
    sub = parser.add_subparsers(dest="command", required=True)
    to_orbax = sub.add_parser("hf-to-orbax", help="HF folder -> Orbax folder")
    to_hf = sub.add_parser("orbax-to-hf", help="Orbax folder -> HF folder")
    to_hf.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    for p in (to_orbax, to_hf):
        p.add_argument("src")
        p.add_argument("dst")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if args.command == "hf-to-orbax":
        print(hf_to_orbax(args.src, args.dst))
    else:
        print(orbax_to_hf(args.src, args.dst, args.dtype))


if __name__ == "__main__":
    main()
