"""The tiny shape every family's CPU-suite model starts from (each family module keeps what distinguishes it)."""

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
