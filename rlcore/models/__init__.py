"""HF model loading and the logits -> log-prob / entropy numerics shared by every engine and worker."""
