"""Sizes the training code uses and the memory plan must count the same way (torch-free, shared by both)."""

# The vocabulary projection runs over chunks of tokens whose float32 `[chunk, vocab / TP]` logits take at most
# this many bytes (rlcore.models.logits): a 150k vocabulary never needs `[tokens, vocab]` logits per micro-batch.
LOGITS_CHUNK_BYTES = 128 * 2**20

# Bytes per element of the dtype names configs use
DTYPE_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float32": 4, "fp32": 4}
