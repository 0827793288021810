"""A patch of Megatron-Core or torch as a named unit, gated on the versions it was written for.

Each compatibility shim (``shims.py``) and CPU speed-up (``cpu_speedups.py``) is a ``Patch``: its
number (the one the docs cite), its name, the megatron-core and torch versions it was written for,
and what it relies on in them (``Expect``: an attribute, the parameters a function takes, a line
of a module's source). Installing a patch checks both first; where the versions are outside its
range or what it relies on has changed, it stops with one sentence naming itself, the versions
found and what changed, instead of patching blind.

This module patches nothing itself and imports Megatron-Core only when a check asks for it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

# the two lines setup.py installs: megatron-core 0.16.x on Python 3.11, 0.19.x on 3.12
MEGATRON_CORE = (">=0.16.1,<0.17", ">=0.19,<0.20")
TORCH = (">=2.13,<2.14",)  # setup.py pins torch 2.13.0 (its CPU or its CUDA build)


def installed_versions() -> dict[str, str]:
    """The megatron-core and torch versions of this process, as their packages report them."""
    import megatron.core

    return {"megatron-core": megatron.core.__version__, "torch": torch.__version__}


def within(version: str, ranges: tuple[str, ...]) -> bool:
    """Whether ``version`` (a local build such as ``2.13.0+cpu`` included) is in one of ``ranges``."""
    try:
        found = Version(version)
    except InvalidVersion:
        return False
    return any(SpecifierSet(r).contains(found, prereleases=True) for r in ranges)


@dataclass(frozen=True)
class Expect:
    """One thing a patch relies on: ``module`` imports and has ``attribute`` (dotted within it)
    taking at least ``parameters``, or the source file of ``module`` holds the line ``source``
    (read without importing the module)."""

    module: str
    attribute: str | None = None
    parameters: tuple[str, ...] = ()
    source: str | None = None

    def problem(self) -> str | None:
        """What has changed, in a few words, or None where it is as expected."""
        if self.source is not None:
            text = _source_text(self.module)
            if text is None:
                return f"there is no module {self.module}"
            return None if self.source in text else f"{self.module} no longer holds `{self.source}`"
        try:
            target = importlib.import_module(self.module)
        except ImportError:
            return f"there is no module {self.module}"
        for part in (self.attribute or "").split(".") if self.attribute else ():
            try:
                target = getattr(target, part)
            except Exception:  # torch.ops answers a missing operator with a RuntimeError
                return f"{self.module} has no {self.attribute}"
        if self.parameters:
            try:
                taken = inspect.signature(target).parameters
            except (TypeError, ValueError):
                return f"{self.module}.{self.attribute} no longer has a signature to read"
            missing = [p for p in self.parameters if p not in taken]
            if missing:
                return f"{self.module}.{self.attribute} no longer takes {', '.join(missing)}"
        return None


def _source_text(module: str) -> str | None:
    loaded = sys.modules.get(module)
    path = getattr(loaded, "__file__", None)
    if path is None:
        top, *rest = module.split(".")
        spec = importlib.util.find_spec(top)
        for base in (spec.submodule_search_locations or []) if spec else []:
            stem = Path(base, *rest)
            path = next((p for p in (Path(f"{stem}.py"), stem / "__init__.py") if p.is_file()),
                        None)
            if path:
                break
    try:
        return Path(path).read_text()
    except (TypeError, OSError):
        return None


@dataclass(frozen=True)
class Patch:
    """A named patch: ``kind`` "shim" (Megatron-Core made to run on the CPU) or "CPU speed-up",
    ``number`` as the docs cite it (None: not one of the CPU's numbered ones), ``apply`` what it
    patches (None: nothing at start-up, a function of ours is used in Megatron-Core's place), and
    ``home`` the module that holds it. Calling it installs it: the check, then ``apply``."""

    kind: str
    number: int | None
    name: str
    relies_on: tuple[Expect, ...]
    home: str
    apply: Callable[[], None] | None = None
    megatron_core: tuple[str, ...] = MEGATRON_CORE
    torch: tuple[str, ...] = TORCH

    @property
    def title(self) -> str:
        if self.number is None:
            return f"{self.kind} {self.name}"
        return f"{self.kind} {self.number} ({self.name})"

    def problem(self) -> str | None:
        """Why this patch must not be applied here (one sentence), or None where it fits."""
        found = installed_versions()
        changed = [f"{name} {found[name]} is outside that range"
                   for name, ranges in (("megatron-core", self.megatron_core), ("torch", self.torch))
                   if not within(found[name], ranges)]
        changed += [p for p in (expect.problem() for expect in self.relies_on) if p]
        if not changed:
            return None
        written = (f"megatron-core {' or '.join(self.megatron_core)} and torch "
                   f"{' or '.join(self.torch)}")
        return (f"Platform {self.title}, written for {written}, does not fit megatron-core "
                f"{found['megatron-core']} with torch {found['torch']}: {'; '.join(changed)}; it "
                f"stops here instead of patching blind (check it against these versions in "
                f"{self.home.replace('.', '/')}.py).")

    def check(self) -> None:
        problem = self.problem()
        if problem:
            raise RuntimeError(problem)

    def __call__(self) -> None:
        self.check()
        if self.apply is not None:
            self.apply()


def patch(kind: str, number: int | None, *relies_on: Expect, **versions) -> Callable:
    """Decorator: the function that applies a patch becomes the ``Patch`` of its name."""
    def make(apply: Callable[[], None]) -> Patch:
        return Patch(kind, number, apply.__name__, relies_on, apply.__module__, apply, **versions)
    return make
