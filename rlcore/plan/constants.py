"""Sizes the training code uses and the memory plan must count the same way (torch-free, shared by both)."""

# The vocabulary projection runs over chunks of tokens whose float32 `[chunk, vocab / TP]` logits take at most
# this many bytes (rlcore.models.logits): a 150k vocabulary never needs `[tokens, vocab]` logits per micro-batch.
LOGITS_CHUNK_BYTES = 128 * 2**20
