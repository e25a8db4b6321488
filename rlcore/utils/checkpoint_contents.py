"""What a role's checkpoint can hold (verl's checkpoint.save_contents / load_contents), apart from the checkpoint
code so that config validation reads it without importing torch."""

# "model" the sharded weights (LoRA: the adapters), "optimizer" its state, "extra" the lr schedule and the per-rank
# RNG, "hf_model" an HF model folder beside them (written, never read back). The controller's data.pt (dataloader
# position, KL coefficient) is the trainer's own and always written, as verl's.
CONTENTS = ("model", "optimizer", "extra", "hf_model")
STATE = ("model", "optimizer", "extra")  # what a resume can restore
