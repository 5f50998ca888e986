"""The model lifecycle: every model's states, loads, restarts and evictions (docs/lifecycle.md)."""
