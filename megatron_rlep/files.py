"""Files written whole or not at all, and directories that prove they are whole.

Write to a temporary file beside the target, then rename: a reader (or a rerun after a kill)
sees either the old file or the complete new one, never half a file. Used by the pool builder,
the pool tools and evaluation. A directory's manifest (``file_entry`` for each file: its size and
CRC-32) is written after every file it lists; ``damage`` says what no longer matches it: a
missing file, another size (cheap: one stat a file) or, when asked, another checksum. CRC-32
catches truncation and flipped bits at about 3 GB/s here (SHA-256: 83 MB/s); it is no defence
against a forger, which a checkpoint on the job's own file system does not need. No other logic
here.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
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


CHECKPOINT_MANIFEST = "actor_checkpoint.json"  # a checkpoint's metadata and manifest, written last


def file_crc32(path: Path) -> str:
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 << 20), b""):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def file_entry(path: Path) -> dict:
    """What a manifest records of a file: its size in bytes and its CRC-32."""
    return {"size": Path(path).stat().st_size, "crc32": file_crc32(path)}


def file_entries(directory: Path, names: list[str]) -> dict:
    """{name: ``file_entry``} for ``names`` under ``directory``, the files read by parallel
    threads (file reads and zlib's CRC-32 release the GIL): a checkpoint's few large files are
    checked side by side, not one after another (benchmarks/checkpoint_verify.py)."""
    from concurrent.futures import ThreadPoolExecutor

    if not names:
        return {}
    with ThreadPoolExecutor(min(len(names), os.cpu_count() or 1)) as pool:
        return dict(zip(names, pool.map(lambda n: file_entry(Path(directory) / n), names)))


def listed_files(directory: Path, leave_out: tuple[str, ...] = ()) -> list[str]:
    """Every file under ``directory`` (relative paths, sorted), but those named in
    ``leave_out``."""
    directory = Path(directory)
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                  if p.is_file() and p.name not in leave_out)


def damage(directory: Path, files: dict, checksums: bool = False,
           share: tuple[int, int] = (0, 1)) -> str | None:
    """The first way ``directory`` differs from its manifest ``files`` ({relative path:
    ``file_entry``}), or None: a listed file missing, or of another size; with ``checksums``,
    also a CRC-32 that does not match, for the files of this ``share`` (index, count: file i
    belongs to share i % count), so ranks split the reading."""
    directory, names = Path(directory), sorted(files)
    for name in names:
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != files[name]["size"]:
            return f"{name} is {size:,} bytes, its manifest says {files[name]['size']:,}"
    mine = [n for i, n in enumerate(names) if i % share[1] == share[0]] if checksums else []
    now = file_entries(directory, mine)
    changed = [n for n in mine if now[n]["crc32"] != files[n]["crc32"]]
    return f"{changed[0]} does not match its manifest's checksum (its bytes changed)" \
        if changed else None


def checkpoint_damage(directory: Path, checksums: bool = False,
                      share: tuple[int, int] = (0, 1)) -> tuple[str | None, bool]:
    """(what is wrong with the checkpoint ``directory`` or None, whether it could be checked):
    its manifest ``CHECKPOINT_MANIFEST`` must be there and readable, then ``damage``. One from
    before manifests (no ``files`` in it) cannot be checked: (None, False)."""
    try:
        meta = json.loads((Path(directory) / CHECKPOINT_MANIFEST).read_text())
    except FileNotFoundError:
        return f"its manifest {CHECKPOINT_MANIFEST} is missing", True
    except (OSError, ValueError) as err:
        return f"its manifest {CHECKPOINT_MANIFEST} is unreadable ({type(err).__name__})", True
    if "files" not in meta:
        return None, False
    return damage(directory, meta["files"], checksums, share), True
