"""Side effects of a step: snapshot a workspace before and after, diff into `FileChange`s.

A snapshot maps each workspace-relative path to (size, sha256). Symlinks are recorded, never
followed (their "content" is the link target), so a link to a host file cannot make us hash it.
Hashes are reused from the previous snapshot when (inode, size, mtime) did not change, so a
step that touched nothing costs one `stat` per file. A workspace larger than `max_files` is
recorded partially and says so in the log; the limit keeps a file-spraying program from making
the host do unbounded work.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import stat
from pathlib import Path

from sandbox.api import FileChange, FileChangeKind

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Entry:
    size: int
    sha256: str
    key: tuple[int, int, int]  # (inode, size, mtime_ns): unchanged key means unchanged content


Snapshot = dict  # relative path -> Entry


def _hash_file(path: str) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot(workspace: Path, previous: Snapshot | None = None, max_files: int = 10_000) -> Snapshot:
    previous = previous or {}
    result: Snapshot = {}
    root = str(workspace)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            try:
                st = os.lstat(full)
            except FileNotFoundError:
                continue
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            old = previous.get(rel)
            if old is not None and old.key == key:
                result[rel] = old
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(full).encode()
                result[rel] = Entry(len(target), hashlib.sha256(b"symlink:" + target).hexdigest(), key)
            elif stat.S_ISREG(st.st_mode):
                try:
                    result[rel] = Entry(st.st_size, _hash_file(full), key)
                except (FileNotFoundError, PermissionError):
                    continue
            if len(result) >= max_files:
                log.warning("workspace %s has more than %d files; side effects are partial", root, max_files)
                return result
    return result


def diff(before: Snapshot, after: Snapshot) -> tuple[FileChange, ...]:
    changes = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path), after.get(path)
        if old is None:
            changes.append(FileChange(path, FileChangeKind.CREATED, new.size, new.sha256))
        elif new is None:
            changes.append(FileChange(path, FileChangeKind.DELETED))
        elif old.sha256 != new.sha256:
            changes.append(FileChange(path, FileChangeKind.MODIFIED, new.size, new.sha256))
    return tuple(changes)
