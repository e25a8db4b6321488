"""The controller-side loops (PPO/GRPO fit, SFT warm-start), checkpointing and metric tracking."""
