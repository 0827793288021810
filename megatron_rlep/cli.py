"""Entry points over Hydra: check the command line first, then hand the typed config to a job.

A ``ConfigError``, ``DataError`` or ``RunError`` (anything the user can fix) is printed as one line on
stderr with exit status 2, never as a traceback.
"""

from __future__ import annotations

import sys
from typing import Callable

from megatron_rlep.config import (CONF_DIR, SCHEMAS, Config, ConfigError, RunError,
                                   check_overrides, load_config)
from megatron_rlep.data import DataError

USER_ERRORS = (ConfigError, DataError, FileNotFoundError, RunError)


def fail(err: Exception) -> None:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(2)


def hydra_entry(job: Callable[[Config], object], config_name: str = "config") -> None:
    """Run ``job(config)`` under Hydra (``-m`` sweeps included) with user errors as one line."""
    import hydra

    try:
        check_overrides(sys.argv[1:], config_name)
    except USER_ERRORS as err:
        fail(err)

    @hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base=None)
    def _main(raw):
        try:
            return job(load_config(raw, SCHEMAS[config_name]))
        except USER_ERRORS as err:
            fail(err)

    _main()
