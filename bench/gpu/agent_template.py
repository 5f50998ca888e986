"""Give the random-weight model (`.gpu/make_model.py`) a chat template that renders what agents send.

make_model.py's template renders only each message's text, so a replayed Claude Code, Codex or Open WebUI session
(bench.session_replay) loses its tools, 20-25 KB of JSON: a 4-5k-token prompt shrinks to a few hundred tokens and
no cache has anything to save. This one renders tools, text parts and tool calls, so the prompt is as long as a
real template makes it, and the same text on TurboMind (the HF tokenizer's template) and llama.cpp (the GGUF
converted from the same folder carries it). Each message ends with the end-of-sequence token, as Mistral's and
Llama 2's templates end a turn: every real template writes special tokens between messages, and the worker
tokenizes a prompt in pieces cut before them (`backends/llamacpp/worker/prompt_tokens.py`); with plain-text roles
only, its log said "prompts tokenized whole" (2026-12-06) and a session replay measured the whole tokenization.
Run on the GPU machine after make_model.py, before the GGUF conversion:

    python3 -m bench.gpu.agent_template /tmp/gpu/models/7b
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% if tools %}system: you may call these tools:\n{% for t in tools %}{{ t | tojson }}{{ '\\n' }}{% endfor %}"
    "{% endif %}{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{% if p['type'] == 'text' %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if m['tool_calls'] %}{% for c in m['tool_calls'] %}{{ c['function'] | tojson }}{% endfor %}{% endif %}"
    "{{ eos_token }}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def main(argv: list[str]) -> int:
    path = Path(argv[0]) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=1))
    print(f"{path}: agent chat template set")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
