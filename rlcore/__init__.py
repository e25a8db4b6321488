"""rlcore: reinforcement learning for language models with a single controller over FSDP2/Megatron workers."""
