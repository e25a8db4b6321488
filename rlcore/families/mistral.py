"""Mistral (7B, Nemo 12B, Small): Llama's block; the first releases attend within a sliding window on every layer
(`sliding_window`), Nemo and later do not (null)."""

from rlcore.families.arch import dense_arch, text_config
from rlcore.families.base import Family, Megatron
from rlcore.families.tiny import TINY


def problems(config, strategy):
    c = text_config(config)
    window = c.get("sliding_window")
    if strategy == "megatron" and window and window < (c.get("max_position_embeddings") or window + 1):
        return [f"mistral with sliding_window={window}: rlcore's megatron-core attention has no sliding window; "
                "use strategy=fsdp2 (or sliding_window=null in config.json for a model trained without one)"]
    return []


FAMILY = Family(
    "mistral", "Mistral 7B / Nemo / Small (GQA; a sliding window on every layer in the first releases)", dense_arch,
    # A window of 8 tokens, shorter than the suite's prompt + response, so that the window decides attention
    tiny={"tiny-mistral": dict(TINY, head_dim=32, sliding_window=8, tie_word_embeddings=False, max_position_embeddings=64),
          # Nemo and later: no window (the Llama block megatron-core builds)
          "tiny-mistral-nemo": dict(TINY, head_dim=32, sliding_window=None, tie_word_embeddings=False, max_position_embeddings=64)},
    megatron=Megatron(), problems=problems)
