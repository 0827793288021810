"""A scorer worker: ``python -m megatron_rlep.reward.worker SETTINGS_JSON``, started by
``scorer.py``. It builds the rules (``rules.py``) once, says ``ready`` (or one JSON line
``{"fail": ...}`` when the rules cannot be built: a reward file that does not import), then
scores one JSON item a line, replying one JSON line each: the rule's result, or ``error`` with
the exception's type and message. The scorer kills a worker that passes an answer's deadline
and starts another."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    settings = json.loads(sys.argv[1])
    # the replies get stdout's pipe to themselves; anything else written to stdout, by Python or
    # by C code, goes to stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        from megatron_rlep.reward.rules import Rules

        rules = Rules(settings)
    except Exception as err:  # noqa: BLE001 - said to the scorer in one line
        out.write(json.dumps({"fail": str(err) if isinstance(err, ValueError) else
                              f"{type(err).__name__}: {err}"}) + "\n")
        out.flush()
        os._exit(1)
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        item = json.loads(line)
        try:
            reply = rules.score(item)
        except Exception as err:  # noqa: BLE001 - a raising reward scores 0, counted
            reply = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    rules.close()


if __name__ == "__main__":
    main()
