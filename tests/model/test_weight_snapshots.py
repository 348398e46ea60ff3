"""model.weights: snapshots round-trip, and a corrupted or tampered one is refused.

Proves: save_snapshot then load_snapshot returns bit-identical host numpy params (Orbax and
HF formats); params_digest depends on values, dtypes, shapes and paths but not on dict
insertion order; flipping one byte of the stored data raises SnapshotDigestError naming
version, expected and actual digest; a tampered WeightVersion digest, a wrong expected
structure and re-publishing an existing version are refused; no temp folders remain.

Run: .venv/bin/python -m pytest tests/model/test_weight_snapshots.py -q
"""

import dataclasses
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from model.decoder import init_params
from model.weights import (SnapshotDigestError, SnapshotError, WeightVersion, load_snapshot,
                           params_digest, save_hf_snapshot, save_snapshot)


def _params():
    # Deterministic values, so the byte flip below always lands in the same place.
    return {"embed": {"embedding": np.linspace(-1, 1, 4096, dtype=np.float32).reshape(64, 64)},
            "final_norm": {"scale": jnp.ones(64)}}


def test_round_trip_and_version_file(tmp_path):
    params = _params()
    wv = save_snapshot(params, tmp_path, version=3, step=30)
    assert wv.location == str(tmp_path / "v00000003") and wv.format == "orbax"
    assert WeightVersion.read(wv.location) == wv
    loaded = load_snapshot(wv, expected_structure=params)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(loaded))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
        assert np.array_equal(np.asarray(a), b)
    assert params_digest(loaded) == wv.digest
    assert os.listdir(tmp_path) == ["v00000003"]  # the temp folder was renamed away
    with pytest.raises(ValueError, match="version must be new .* got 3 which already exists"):
        save_snapshot(params, tmp_path, version=3, step=31)


def test_digest_covers_values_dtypes_shapes_and_paths():
    params = _params()
    base = params_digest(params)
    assert params_digest({"final_norm": params["final_norm"], "embed": params["embed"]}) == base
    changed = jax.tree.map(lambda x: x, params)
    changed["final_norm"]["scale"] = changed["final_norm"]["scale"].at[5].add(1e-7)
    assert params_digest(changed) != base
    assert params_digest({**params, "final_norm": {"scale": jnp.ones(64, jnp.bfloat16)}}) != base
    assert params_digest({**params, "final_norm": {"scale": jnp.ones((8, 8))}}) != base
    assert params_digest({**params, "final_norm": {"weight": jnp.ones(64)}}) != base


def test_corrupted_file_raises_digest_error(tmp_path):
    wv = save_snapshot(_params(), tmp_path, version=1, step=1)
    data_files = [p for p in Path(wv.location, "params").rglob("*")
                  if p.is_file() and "/d/" in str(p)]
    target = max(data_files, key=lambda p: p.stat().st_size)  # the embedding chunk
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    target.write_bytes(bytes(raw))
    with pytest.raises(SnapshotDigestError,
                       match=f"v1 at .* digest must be {wv.digest}, got sha256:"):
        load_snapshot(wv)


def test_tampered_version_and_wrong_structure_are_refused(tmp_path):
    params = _params()
    wv = save_snapshot(params, tmp_path, version=2, step=2)
    with pytest.raises(SnapshotDigestError):
        load_snapshot(dataclasses.replace(wv, digest="sha256:" + "0" * 64))
    with pytest.raises(SnapshotError, match="must match expected_structure"):
        load_snapshot(wv, expected_structure={**params, "lm_head": {"kernel": np.zeros(3)}})
    with pytest.raises(SnapshotError, match="must be readable"):
        load_snapshot(dataclasses.replace(wv, location=str(tmp_path / "missing")))
    assert issubclass(SnapshotDigestError, ValueError)


def test_hf_snapshot_round_trip(make_config, random_params, tmp_path):
    config = make_config()
    params = random_params(jax.eval_shape(lambda: init_params(config, jax.random.key(0))))
    wv = save_hf_snapshot(params, config, tmp_path, version=7, step=70)
    assert wv.format == "hf_safetensors"
    assert (Path(wv.location) / "model.safetensors").is_file()
    assert params_digest(load_snapshot(wv)) == params_digest(params)
