"""megatron_rlep: RL with experience replay (RLEP) on Megatron-Core."""

import warnings

# Megatron-Core warns at import, once per module, that Transformer Engine and Apex are missing;
# the actor says it once, in one line, with the reason (megatron_rlep/actor/actor.py).
warnings.filterwarnings("ignore", message=r"(Transformer Engine and )?Apex (is|are) not installed",
                        category=UserWarning)
