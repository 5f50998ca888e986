"""Tools for recording real clients (Codex CLI, Claude Code) and the fixtures made from them."""
