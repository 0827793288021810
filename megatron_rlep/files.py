"""Files written whole or not at all: write to a temporary file beside the target, then rename.

A reader (or a rerun after a kill) sees either the old file or the complete new one, never
half a file. Used by the pool builder, the pool tools and evaluation. No other logic here.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def temporary_beside(path: Path) -> Path:
    """A hidden, per-process temporary name in ``path``'s directory (same filesystem)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")


def write_text_atomic(text: str, path: Path) -> None:
    tmp = temporary_beside(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json_atomic(data, path: Path) -> None:
    write_text_atomic(json.dumps(data, indent=1) + "\n", path)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
