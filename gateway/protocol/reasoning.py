"""How much a reasoning model thinks: each API's control (an effort, a budget, on or off) resolved against the
model's default into what the engine takes: chat template variables and our worker's thinking budget.

    chat `reasoning_effort` ─┐
    Responses `reasoning.effort` ─┼─▶ ReasoningAsk ──resolve(ask, model default)──▶ Reasoning ──▶ engine fields
    Messages `thinking`, `output_config.effort` ─┘

A template reads the switch its family knows, so the one set of variables serves every family (each template
ignores the others'): `enable_thinking` (Qwen3, GLM, Granite), `thinking` (DeepSeek V3.1+) and
`reasoning_effort` (gpt-oss harmony: low, medium or high). The budget is what our llama.cpp worker enforces
(past it the worker closes the thinking and the answer follows); TurboMind has none (docs/reasoning.md).
Imports no wire type, so `gateway.protocol` can import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from backends.request import MAX_BUDGET_MESSAGE_CHARS

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
"""OpenAI's reasoning efforts (chat `reasoning_effort`, Responses `reasoning.effort`)."""

EFFORTS: tuple[Effort, ...] = ("none", "minimal", "low", "medium", "high", "xhigh")

EFFORT_BUDGETS: dict[Effort, int | None] = {
    "none": 0,
    "minimal": 256,
    "low": 1024,
    "medium": 4096,
    "high": None,
    "xhigh": None,
}
"""The thinking budget an effort stands for when neither the request nor the model names one (None: the
model thinks as long as it wants, up to `max_tokens`)."""

_HARMONY: dict[Effort, str] = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}
"""gpt-oss's template knows low, medium and high."""


class ReasoningDefault(BaseModel):
    """A model's reasoning defaults (config `reasoning`, shown in /v1/models): the effort and budget a request
    that names neither gets (both None: the chat template's own default; most reasoning templates think), and
    the name chat answers give the thinking."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    effort: Effort | None = Field(
        default=None, description="the effort a request that names none gets (null: the chat template's default)"
    )
    budget_tokens: int | None = Field(
        default=None, ge=0, description="thinking tokens before the worker closes the thinking (0: no thinking)"
    )
    budget_message: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_BUDGET_MESSAGE_CHARS,
        description="text written into the thinking where the budget cuts it, before the closing: the model reads "
        "it as its own last thought and wraps up (llama-server's --reasoning-budget-message; the wording that works "
        "is the model's: none by default)",
    )
    field: Literal["reasoning_content", "reasoning"] = Field(
        default="reasoning_content",
        description="the chat answer's thinking field: llama.cpp's and LMDeploy's name, or vLLM's and Ollama's",
    )

    def thinking_tokens(self) -> int | None:
        """The most tokens a request served with this default thinks before its answer: its budget, else its
        effort's (`EFFORT_BUDGETS`), 0 when it does not think; None when nothing bounds it (no default, or an
        effort with no budget: the model thinks as long as it wants)."""
        return resolve(ReasoningAsk(), self).budget_tokens


@dataclass(frozen=True)
class ReasoningAsk:
    """What one request asked for: an effort, a budget (Anthropic's `budget_tokens`), thinking off
    (`disabled`), or nothing (all None: the model's default)."""

    effort: Effort | None = None
    budget_tokens: int | None = None
    disabled: bool = False


@dataclass(frozen=True)
class Reasoning:
    """The reasoning a request is served with: `effort` as the Responses API echoes it (None: none named),
    `enabled` the template switch (None: left to the template), `budget_tokens` the worker's limit and
    `budget_message` what it writes into the thinking where it cuts it."""

    effort: Effort | None = None
    enabled: bool | None = None
    budget_tokens: int | None = None
    budget_message: str | None = None

    def engine_fields(self, client_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`chat_template_kwargs`, `thinking_budget_tokens` (and its message) for the engine request; the client's own
        template variables (`client_kwargs`) win over ours."""
        kwargs: dict[str, Any] = {}
        if self.enabled is not None:
            kwargs |= {"enable_thinking": self.enabled, "thinking": self.enabled}
        if self.enabled and self.effort in _HARMONY:
            kwargs["reasoning_effort"] = _HARMONY[self.effort]
        kwargs |= dict(client_kwargs or {})
        out: dict[str, Any] = {}
        if kwargs:
            out["chat_template_kwargs"] = kwargs
        if self.budget_tokens is not None:
            out["thinking_budget_tokens"] = self.budget_tokens
        if self.budget_tokens and self.budget_message:
            out["thinking_budget_message"] = self.budget_message
        return out


def resolve(ask: ReasoningAsk, default: ReasoningDefault) -> Reasoning:
    """The reasoning to serve: the request's effort or budget, else the model's default.

    Off (`disabled`, effort "none", budget 0) turns the template's switch off with budget 0. An effort turns
    it on, with the budget the request names, else the model's when the effort is the model's own, else the
    effort's (`EFFORT_BUDGETS`). A budget alone turns thinking on with that budget.
    """
    if ask.disabled:
        return Reasoning(effort="none", enabled=False, budget_tokens=0)
    effort = ask.effort if ask.effort is not None else default.effort
    budget = ask.budget_tokens
    if budget is None and (ask.effort is None or ask.effort == default.effort):
        budget = default.budget_tokens  # the model's budget goes with the model's effort, asked or not
    if budget is None and effort is not None:
        budget = EFFORT_BUDGETS[effort]
    if effort == "none" or budget == 0:
        return Reasoning(effort="none", enabled=False, budget_tokens=0)
    if effort is None and budget is None:
        return Reasoning()
    return Reasoning(effort=effort, enabled=True, budget_tokens=budget, budget_message=default.budget_message)
