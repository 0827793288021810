"""megatron_rlep: RL with experience replay (RLEP) on Megatron-Core."""
