"""The errors a user can act on, each carrying one sentence that names the input and the fix.

The entry points (``megatron_rlep/cli.py``) print them as one line on stderr with exit status 2,
never as a traceback. This module imports nothing, so any module of the package can import
them at its top without pulling in Hydra, torch or an import circle.
"""


class ConfigError(ValueError):
    """A configuration key or value the user must fix; the message is one sentence."""


class RunError(RuntimeError):
    """A run stopped for a reason the user can act on; the message is one sentence."""


class SaidElsewhere(RunError):
    """A fault that another rank of the job says (its one sentence): this rank exits with
    status 2 and says nothing, so the job's log holds the sentence once."""
