"""What a resume needs besides the learner's checkpoint: which checkpoint, and the run dir around it.

What it is: the choice of checkpoint (`--resume`, `--resume STEP`), a fresh start's clean-up of a
previous run's files, the append-only streams (metrics.jsonl, trajectories.jsonl) whose lengths a
checkpoint records and a resume cuts back to, and the weight snapshots a resume discards or reuses.

What it is not: the checkpoint itself (`Pipeline.checkpoint` says what it holds; the learner
writes it with Orbax, learner/learner.py) nor the loop-side state (`Pipeline._load_extra`).
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil

from controller.config import RunConfig
from learner.multihost import learner_type
from model.weights import WeightVersion

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = 2
STREAMS = ("metrics.jsonl", "trajectories.jsonl")
"""Append-only files a checkpoint records the length of; a resumed run cuts them back to it."""


class ResumeError(ValueError):
    """A resume the run directory cannot give: the named checkpoint does not exist."""


def resume_step(config: RunConfig, checkpoints: pathlib.Path) -> int | None:
    """The checkpoint step to resume from, or None to start fresh (no resume asked, or none saved yet)."""
    if not config.resume:
        return None
    steps = learner_type().checkpoint_steps(checkpoints)
    if config.resume_step == -1:
        if not steps:
            logger.info("--resume: no checkpoint in %s yet; starting fresh", checkpoints)
        return steps[-1] if steps else None
    if config.resume_step not in steps:
        raise ResumeError(f"--resume {config.resume_step}: no checkpoint {config.resume_step} in {checkpoints}; "
                          f"the checkpoints there are {steps or 'none'}")
    return config.resume_step


def start_fresh(run_dir: pathlib.Path) -> None:
    """A fresh run owns its run dir: a previous run's checkpoints, weight snapshots and streams go."""
    old = [name for name in ("checkpoints", "weights", *STREAMS) if (run_dir / name).exists()]
    if old:
        logger.warning("starting fresh in %s: removing the previous run's %s (pass --resume to continue it)",
                       run_dir, ", ".join(old))
    for name in ("checkpoints", "weights"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    cut_streams(run_dir, {})


def length(path: pathlib.Path) -> int:
    return path.stat().st_size if path.exists() else 0


def cut_streams(run_dir: pathlib.Path, lengths: dict[str, int] | None) -> None:
    """Cut each append-only stream back to its length at the checkpoint (0 when it had none)."""
    if lengths is None:  # a checkpoint older than stream positions: leave the files as they are
        return
    for name in STREAMS:
        path = run_dir / name
        if path.exists():
            with open(path, "r+b") as f:
                f.truncate(min(int(lengths.get(name, 0)), os.fstat(f.fileno()).st_size))


def discard_snapshots_after(root: pathlib.Path, version: int) -> None:
    """Delete weight snapshots newer than `version`: the killed run published them after the checkpoint."""
    if not root.exists():
        return
    for folder in root.iterdir():
        name = folder.name
        if folder.is_dir() and name.startswith("v") and name[1:].isdigit() and int(name[1:]) > version:
            shutil.rmtree(folder, ignore_errors=True)


def snapshot_holds(version: WeightVersion) -> bool:
    """The snapshot folder of `version` exists and records the same digest."""
    try:
        return WeightVersion.read(version.location).digest == version.digest
    except (OSError, ValueError, KeyError):
        return False
