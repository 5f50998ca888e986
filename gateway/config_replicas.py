"""A model's replicas (config `replicas: N`, docs/replicas.md): N workers of the same model, each planned, started
and supervised as a model of its own. Replica k >= 2 of `m` is the model `m@k` (the first keeps the name), with
no aliases of its own: clients name `m`, and the service picks the replica (`gateway.serving.replicas`). `@`
is not allowed in a configured name, so `m@k` is always a replica of `m`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

SEPARATOR = "@"
MOST_REPLICAS = 16


class ReplicaRange(BaseModel):
    """`replicas: {min: a, max: b}`: `auto`, choosing N between a and b (docs/replicas.md). `min` is kept even
    where the plan would choose fewer (replicas that must then share a GPU say so in their warnings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min: int = Field(default=1, ge=1, le=MOST_REPLICAS)
    max: int = Field(default=MOST_REPLICAS, ge=1, le=MOST_REPLICAS)

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaRange:
        if self.min > self.max:
            raise ValueError(f"replicas: min {self.min} is over max {self.max}")
        return self


Replicas = Annotated[int, Field(ge=1, le=MOST_REPLICAS)] | Literal["auto"] | ReplicaRange
"""A model's `replicas`: a number, `auto` (the default: 1 to 16, chosen by the plan) or a range to choose in."""


def fewest(replicas: Replicas) -> int:
    """The fewest replicas `replicas` allows: the number itself, or the range's `min` (`auto`: 1)."""
    if isinstance(replicas, int):
        return replicas
    return 1 if replicas == "auto" else replicas.min


def chosen_between(replicas: Replicas) -> tuple[int, int] | None:
    """The range the plan chooses N in, or None for a fixed number."""
    if isinstance(replicas, int):
        return None
    return (1, MOST_REPLICAS) if replicas == "auto" else (replicas.min, replicas.max)


class _Replicable(Protocol):  # gateway.config.ModelSpec, which imports this module
    @property
    def name(self) -> str: ...
    @property
    def replicas(self) -> Replicas: ...
    @property
    def concurrency(self) -> int: ...
    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Self: ...


ModelSpec = TypeVar("ModelSpec", bound=_Replicable)


def replica_name(model: str, k: int) -> str:
    """Replica k (1-based) of `model`: the model's own name for the first."""
    return model if k == 1 else f"{model}{SEPARATOR}{k}"


def replica_of(name: str) -> str | None:
    """The model `name` is a replica of (None: `name` is a model, or its first replica)."""
    base, sep, k = name.rpartition(SEPARATOR)
    return base if sep and k.isdigit() else None


def model_of(name: str) -> str:
    """The model `name` serves: its own name, or for a replica `m@k`, `m`."""
    return replica_of(name) or name


def expand(models: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
    """Every model followed by its replicas 2..N as models of their own, each serving ceil(concurrency / N) of
    the model's sessions (idempotent: an `m@k` already listed, as in a dumped configuration read back, is kept
    and not made again, and then the sessions are taken as already split)."""
    listed = {spec.name: spec for spec in models}
    for name in listed:
        base = replica_of(name)
        most = listed[base].replicas if base in listed else 0
        if base is not None and (not isinstance(most, int) or int(name.rpartition(SEPARATOR)[2]) > most):
            raise ValueError(f"{name!r}: '@' names a replica (k of `replicas: N` of {base!r}), not a model")
    out: list[ModelSpec] = []
    for spec in models:
        n = spec.replicas if isinstance(spec.replicas, int) else 1  # auto or a range: by the plan
        names = [replica_name(spec.name, k) for k in range(2, n + 1)]
        if names and not any(name in listed for name in names):  # `concurrency` is the model's: split it
            spec = spec.model_copy(update={"concurrency": -(-spec.concurrency // n)})
        out.append(spec)
        for name in names:
            if name not in listed:
                out.append(spec.model_copy(update={"name": name, "aliases": (), "alias_patterns": (), "replicas": 1}))
    return tuple(out)
