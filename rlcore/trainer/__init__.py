"""The controller-side loops (PPO/GRPO fit, reward-model and SFT training), checkpointing and metric tracking."""
