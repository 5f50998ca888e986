"""serving: see docs/architecture.md."""
