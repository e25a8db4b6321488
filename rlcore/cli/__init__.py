"""Command-line tools besides the Hydra trainer (asset preparation for the embedded demo)."""
