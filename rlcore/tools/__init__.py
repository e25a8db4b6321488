"""Tools for multi-turn rollouts (verl's tool interface): the BaseTool lifecycle, hermes tool-call parsing, a runner
that executes calls in isolated processes with a time limit, and built-in tools (add, calculator)."""
