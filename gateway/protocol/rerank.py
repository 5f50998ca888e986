"""Wire types of /v1/rerank: the shape llama.cpp's server, Jina and Cohere share (OpenAI has no rerank API).

Request: `{model, query, documents, top_n?, return_documents?}`. Response: `{model, object: "list", results:
[{index, relevance_score, document?: {text}}], usage: {prompt_tokens, total_tokens}}`, results by descending
`relevance_score` (the reranker's raw score, as llama.cpp reports it: a logit, not a probability), at most
`top_n` of them, `document` only when `return_documents` was asked for.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from backends.base import EngineCapabilities
from backends.request import MAX_INPUTS, Count, EngineRerankRequest, RequestKind
from gateway.protocol.engine_requests import EngineTarget, check_kind
from gateway.protocol.parsing import parse_body

MAX_DOCUMENTS = MAX_INPUTS
"""Documents per request: the one limit in backends/request.py, which the worker enforces too."""


class RerankRequest(BaseModel):
    """A client's rerank body. Unknown fields are ignored, like the gateway's other request types."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    model: str = Field(min_length=1)
    query: str
    documents: list[str] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    top_n: Count | None = Field(default=None, ge=1)
    return_documents: bool = False
    stream: Literal[False] = False  # a ranking is one answer: `stream: true` is a 400

    kind: ClassVar[RequestKind] = RequestKind.RERANK
    units: ClassVar[int] = 1
    include_usage: ClassVar[bool] = False

    def check(self, caps: EngineCapabilities, label: str) -> None:
        check_kind(self.kind, caps, label)

    def to_engine(self, target: EngineTarget) -> EngineRerankRequest:
        """The worker's request (the same fields, validated by the worker with the same bounds), addressed to
        the name the worker knows."""
        return EngineRerankRequest(
            model=target.model,
            query=self.query,
            documents=self.documents,
            top_n=self.top_n,
            return_documents=self.return_documents,
        )

    def log_prompt(self) -> Any:
        return {"query": self.query, "documents": self.documents}

    def unsupported(self) -> list[tuple[str, str]]:
        return []


def parse_rerank_request(raw: bytes) -> RerankRequest:
    """Decode and validate a rerank body, or raise a 400 `GatewayError` naming the offending parameter."""
    return parse_body(raw, RerankRequest)


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RerankDocument(_Out):
    text: str


class RerankResult(_Out):
    index: int = Field(ge=0, description="the document's position in the request's `documents`")
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(_Out):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(_Out):
    """What a rerank worker answers and the gateway re-emits (`render()` leaves out absent documents)."""

    model: str
    object: Literal["list"] = "list"
    results: list[RerankResult]
    usage: RerankUsage

    def render(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)
