"""Which reward a data source's answers take: verl's default_compute_score routes by these
names, and this project's own sets are named to match."""

from __future__ import annotations

import re

MATH_SOURCES = re.compile(r"(?i)(gsm8k|math|aime|amc|dapo|numina|olympiad|arithmetic|minerva|"
                          r"deepscaler|orz|omni)")
CODE_SOURCES = re.compile(r"(?i)(code|apps|taco|leetcode|humaneval|mbpp|livecodebench|"
                          r"primeintellect|deepcoder|kodcode|codeforces|codecontests)")


def source_kind(data_source: str) -> str:
    """``code``, ``math`` or ``other``: code names are checked first (``codecontests``,
    ``deepcoder``; a name with both, such as ``math_code``, is code)."""
    if CODE_SOURCES.search(data_source or ""):
        return "code"
    if MATH_SOURCES.search(data_source or ""):
        return "math"
    return "other"
