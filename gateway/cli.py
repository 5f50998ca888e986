"""The `voltgate` command line: serve, plan, models, connect, keys. Parses arguments and dispatches; nothing else."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from gateway.config import (
    Config,
    ConfigError,
    EnvOverrides,
    RemoteSource,
    env_overrides,
    load_config,
    package_resource,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gateway.placement import Inventory, PlacementReport
    from gateway.reload import Desired

DEFAULT_CONFIG = Path("configs/default.yaml")
ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="YAML config file \\[env: VOLTGATE_CONFIG; default: configs/default.yaml]"),
]
GpusOption = Annotated[
    str | None,
    typer.Option(
        "--gpus",
        help="GPU inventory: 'auto' (NVML), 'none', or simulated like 'v100-16gb', '2xv100-16gb', "
        "'4xv100-32gb-pcie' (-sxm2: NVLink, the default; -pcie: through the CPU; -pcie-switch), "
        "'name:memory_gib:capability[:nvlink|pcie|pcie-switch]' \\[env: VOLTGATE_GPUS]",
    ),
]

cli = typer.Typer(
    help="voltgate: one OpenAI-compatible endpoint for V100 GPUs. TurboMind FP16 when a model fits, "
    "llama.cpp GGUF when it does not; every placement decision explained.",
    no_args_is_help=True,
    add_completion=False,
)
keys_cli = typer.Typer(help="Manage API keys (only their sha256 hashes are stored).", no_args_is_help=True)
cli.add_typer(keys_cli, name="keys")
err = Console(stderr=True)


def _load(config: Path | None, gpus: str | None = None, host: str | None = None, port: int | None = None) -> Config:
    try:
        env = env_overrides()
        overrides = EnvOverrides(
            host=host or env.host, port=port if port is not None else env.port, gpus=gpus or env.gpus, config=None
        )
        return load_config(config or env.config or DEFAULT_CONFIG, overrides=overrides)
    except ConfigError as exc:
        _config_error(str(exc))


def _config_error(message: str) -> NoReturn:
    """A configuration error: the message alone (it names the key), no traceback, exit status 2."""
    err.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _inventory(cfg: Config) -> Inventory:
    from gateway.placement import InventoryError, inventory_from_spec

    try:
        return inventory_from_spec(cfg.gpus)
    except InventoryError as exc:  # load_config checks the layout; this is the backstop
        _config_error(f"gpus: {exc}")


@cli.command()
def serve(
    config: ConfigOption = None,
    gpus: GpusOption = None,
    host: Annotated[str | None, typer.Option(help="bind address \\[env: VOLTGATE_HOST]")] = None,
    port: Annotated[int | None, typer.Option(help="port \\[env: VOLTGATE_PORT]")] = None,
    log_format: Annotated[str, typer.Option(help="text or json")] = "text",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING")] = "INFO",
    watch_config: Annotated[
        bool, typer.Option("--watch-config", help="reload the config whenever its file changes (also: SIGHUP)")
    ] = False,
    cluster: Annotated[
        str | None,
        typer.Option(help="serve on every host of a Ray cluster: 'ray' or 'ray:HOST:PORT' (docs/cluster.md)"),
    ] = None,
) -> None:
    """Place every configured model, start its worker, and serve the OpenAI API."""
    import uvicorn

    from gateway.ops.logs import setup_logging
    from gateway.serving.connections import ClientConnections, server_options

    setup_logging(log_format, log_level.upper())
    cfg = _load(config, gpus, host, port)
    app = _cluster_app(cfg, cluster) if cluster is not None else _local_app(cfg, config, watch_config)
    _raise_open_file_limit()
    connections = ClientConnections(cfg.server.max_connections_per_client, cfg.server.header_timeout_s)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=cfg.server.host,
            port=cfg.server.port,
            log_config=None,
            access_log=False,
            # 0 means no grace at all (uvicorn's None would mean wait forever).
            timeout_graceful_shutdown=math.ceil(cfg.server.shutdown_grace_s),
            **server_options(connections, cfg.server.idle_timeout_s),
        )
    )
    logging.getLogger("voltgate").info("serving on http://%s:%s/v1", cfg.server.host, cfg.server.port)
    gc.freeze()  # the start-up heap (modules, schemas, plans) is never garbage: no collection walks it again
    _exit_zero_after_drain()
    server.run()


def _exit_zero_after_drain() -> None:
    """A SIGTERM or SIGINT stop that drained cleanly exits 0 (what systemd and Kubernetes count as a clean stop).
    uvicorn catches the signal, drains, then restores the handler it found and raises the signal again: that
    handler is this one. Without it the default handler ends the process by the signal, or, in `--cluster` mode,
    Ray's handler (installed by `ray.init`) exits with status 15."""

    def clean_exit(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, clean_exit)


def _local_app(cfg: Config, config: Path | None, watch_config: bool) -> FastAPI:
    from gateway.app import create_app
    from gateway.placement import render_plan_table

    inventory = _inventory(cfg)
    desired, report = _place(cfg, inventory)
    render_plan_table(report, err)
    if not desired.plans:
        err.print("[red]error:[/red] no model could be placed; see the plan above")
        raise typer.Exit(1)
    path = config or env_overrides().config or DEFAULT_CONFIG
    overrides = EnvOverrides(host=cfg.server.host, port=cfg.server.port, gpus=cfg.gpus, config=None)

    def planner() -> Desired:  # a reload: the same file, overrides and inventory as at start
        return _place(load_config(path, overrides=overrides), inventory)[0]

    return create_app(  # desired.config: with each `replicas: auto` resolved and its replicas made
        desired.config, desired.plans, refused=desired.refused, placement=desired.placement, planner=planner,
        watch=path if watch_config else None,
    )  # fmt: skip


def _cluster_app(cfg: Config, target: str) -> FastAPI:
    """`serve --cluster`: plan over the cluster's hosts; each host's models run there (gateway.cluster.serve).
    No config reload in this mode (a restart applies a changed config)."""
    from gateway.app import create_app
    from gateway.cluster.live import ClusterUnavailable
    from gateway.cluster.render import render_cluster_plan
    from gateway.cluster.serve import open_cluster

    try:
        serving = open_cluster(target, cfg)
    except ClusterUnavailable as exc:
        _config_error(str(exc))
    plans, refused = serving.initial()
    assert serving.report is not None
    render_cluster_plan(serving.report, err)
    if not plans:
        err.print("[red]error:[/red] no model could be placed on any host; see the plan above")
        raise typer.Exit(1)
    # serving.config: with each `replicas: auto` resolved over the hosts and its replicas made
    return create_app(serving.config, plans, refused=refused, placement=serving.placement(), cluster=serving)


def _place(cfg: Config, inventory: Inventory) -> tuple[Desired, PlacementReport]:
    """Place `cfg` on `inventory`: the plans to serve, the models refused (with why), the report."""
    from gateway.placement.replica_choice import plan_with_replicas
    from gateway.reload import Desired

    cfg, report = plan_with_replicas(cfg, inventory)
    refused = {d.model: d.refusal for d in report.decisions if d.plan is None and d.refusal}
    plans = []
    for plan in report.plans:
        problem = _engine_missing(plan)
        if problem:
            refused[plan.model] = problem
        else:
            plans.append(plan)
    return Desired(cfg, tuple(plans), refused, json.loads(report.model_dump_json())), report


def _raise_open_file_limit() -> None:
    """Lift the soft limit on open descriptors to the hard one (as Go's runtime does): 1,024 is a common soft
    limit, and every client connection and worker connection holds one."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _engine_missing(plan: object) -> str | None:
    from backends.base import DeploymentPlan, EngineName
    from backends.lmdeploy import LMDeployNotInstalled, find_lmdeploy

    assert isinstance(plan, DeploymentPlan)
    if plan.engine is EngineName.LMDEPLOY:
        try:
            find_lmdeploy(plan.lmdeploy.executable)
        except LMDeployNotInstalled as exc:
            return str(exc)
    return None


@cli.command()
def plan(
    config: ConfigOption = None,
    gpus: GpusOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    cluster: Annotated[
        str | None,
        typer.Option(help="plan over several hosts: a cluster file, 'ray' or 'ray:HOST:PORT' (docs/cluster.md)"),
    ] = None,
) -> None:
    """Show where each model would run and why (engine, quant, GPUs, memory by term, rejected options).
    Exits 1 when no model can be placed, as `serve` would."""
    from gateway.placement import render_plan_table
    from gateway.placement.replica_choice import plan_with_replicas

    cfg = _load(config, gpus)
    if cluster is not None:
        _plan_cluster(cfg, cluster, as_json)
        return
    _, report = plan_with_replicas(cfg, _inventory(cfg))
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        render_plan_table(report, Console())
    if not report.plans:
        err.print("[red]error:[/red] no model could be placed; `voltgate serve` would exit too")
        raise typer.Exit(1)


def _plan_cluster(cfg: Config, target: str, as_json: bool) -> None:
    from gateway.cluster import ClusterFileError, plan_cluster_with_replicas
    from gateway.cluster.live import ClusterUnavailable, cluster_hosts_for
    from gateway.cluster.render import render_cluster_plan

    try:
        _, report = plan_cluster_with_replicas(cfg, cluster_hosts_for(target, cfg))
    except (ClusterFileError, ClusterUnavailable) as exc:
        _config_error(str(exc))
    if as_json:
        sys.stdout.write(report.model_dump_json(indent=2) + "\n")
    else:
        render_cluster_plan(report, Console())
    if not report.placed:
        err.print("[red]error:[/red] no model could be placed on any host")
        raise typer.Exit(1)


@cli.command()
def models(config: ConfigOption = None) -> None:
    """List the models a config serves, with aliases and sources."""
    cfg = _load(config)
    console = Console()
    for model in cfg.models:
        aliases = f" (aliases: {', '.join(model.aliases)})" if model.aliases else ""
        console.print(f"[bold]{model.name}[/bold]{aliases}  context={model.context} concurrency={model.concurrency}")
        for source in model.sources:
            if isinstance(source, RemoteSource):
                console.print(f"  - remote: {source.remote} (model {source.model or model.name})", highlight=False)
                continue
            try:
                path = source.resolve(cfg.base_dir)
                state = "ok" if path.exists() else "missing"
            except ConfigError as exc:
                path, state = Path("?"), str(exc)
            console.print(f"  - {type(source).__name__[:-6].lower()}: {path} [{state}]", highlight=False)


@cli.command()
def connect(
    client: Annotated[str, typer.Argument(help="claude-code, codex, opencode or open-webui")],
    config: ConfigOption = None,
    gpus: GpusOption = None,
    model: Annotated[str | None, typer.Option(help="the model (name or alias; default: the first chat model)")] = None,
    small_model: Annotated[str | None, typer.Option(help="the small/fast model (default: --model)")] = None,
    url: Annotated[str | None, typer.Option(help="the gateway's URL as the client reaches it")] = None,
    key_env: Annotated[str, typer.Option(help="the variable that holds the voltgate key")] = "VOLTGATE_API_KEY",
    write: Annotated[
        bool, typer.Option("--write", help="merge into the client's file (the old one backed up)")
    ] = False,
) -> None:
    """Print a client's settings for this gateway: base URL, key variable, models, and the context window and
    compaction limit the plan gives the model; with --write, merge them into the client's own settings file."""
    from gateway.ops.connect import CLIENTS, ConnectError, settings_for, target_for
    from gateway.placement.replica_choice import plan_with_replicas

    if client not in CLIENTS:
        _config_error(f"unknown client {client!r}; one of: {', '.join(CLIENTS)}")
    cfg = _load(config, gpus)
    try:
        plans = plan_with_replicas(cfg, _inventory(cfg))[1].plans
        target = target_for(cfg, plans, model=model, small_model=small_model, url=url, key_env=key_env)
        settings = settings_for(client, target, Path.home())
    except ConnectError as exc:
        _config_error(str(exc))
    summary = (f"# {client}: {target.model} (small: {target.small_model}), context {target.context} tokens, "
               f"replies up to {target.max_output}, compact at {target.compact_window}")  # fmt: skip
    err.print(summary, highlight=False, soft_wrap=True)
    _connect_output(settings, write)


def _connect_output(settings: object, write: bool) -> None:
    from gateway.ops.connect import Settings, render, shell_exports
    from gateway.ops.connect import write as write_file

    assert isinstance(settings, Settings)
    for path, body in settings.files.items():
        if not write:
            sys.stdout.write(f"# {path}\n{render(path, body)}")
            continue
        try:
            backup = write_file(path, body)
        except (ValueError, OSError) as exc:
            _config_error(str(exc))
        err.print(f"wrote {path}" + (f" (the old file: {backup})" if backup else ""), highlight=False)
    if settings.env:
        sys.stdout.write(shell_exports(settings.env))
    for note in settings.notes:
        err.print(f"# {note}", highlight=False)


@keys_cli.command("create")
def keys_create(
    key_id: Annotated[str, typer.Argument(help="a short name for the key, shown in logs and metrics")],
    models: Annotated[list[str] | None, typer.Option("--model", help="allowed model (repeatable)")] = None,
    rpm: Annotated[int | None, typer.Option(help="requests per minute")] = None,
    tpm: Annotated[int | None, typer.Option(help="tokens per minute")] = None,
    max_concurrent: Annotated[int | None, typer.Option(help="requests in flight")] = None,
    scopes: Annotated[list[str] | None, typer.Option("--scope", help="extra right (repeatable): admin")] = None,
) -> None:
    """Print a new API key once, and the config entry (hash only) to paste under `auth.keys`."""
    from gateway.ops.auth import hash_key, new_key

    key = new_key()
    entry: dict[str, object] = {"id": key_id, "sha256": hash_key(key)}
    if models:
        entry["models"] = models
    unknown = sorted(set(scopes or ()) - {"admin"})
    if unknown:
        _config_error(f"--scope: unknown scope {', '.join(unknown)} (known: admin)")
    if scopes:
        entry["scopes"] = sorted(set(scopes))
    for name, value in (
        ("requests_per_minute", rpm),
        ("tokens_per_minute", tpm),
        ("max_concurrent", max_concurrent),
    ):
        if value is not None:
            entry[name] = value
    err.print("[bold]New API key (shown once, store it now):[/bold]")
    sys.stdout.write(key + "\n")
    err.print("Add this under `auth: keys:` in your config:")
    import yaml

    sys.stdout.write(yaml.safe_dump([entry], sort_keys=False))


@cli.command()
def selftest(
    model: Annotated[Path | None, typer.Option(help="GGUF to decode (default: the embedded model)")] = None,
) -> None:
    """A short real decode in a child process: proves llama.cpp answers on this host (run after every install)."""
    from backends.llamacpp.selftest import self_test
    from gateway.ops.doctor import EMBEDDED

    try:
        path = model or package_resource(*EMBEDDED)
    except ConfigError as exc:
        _config_error(str(exc))
    outcome = self_test(path)
    (Console() if outcome.ok else err).print(
        f"[{'green' if outcome.ok else 'red'}]self-test:[/] {escape(outcome.message)}", highlight=False, soft_wrap=True
    )
    if not outcome.ok:
        raise typer.Exit(1)


@cli.command()
def doctor(
    config: ConfigOption = None,
    gpus: GpusOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    selftest: Annotated[bool, typer.Option(help="run the decode self-test")] = True,
) -> None:
    """Check this host for everything voltgate needs (Python, llama.cpp build, CPU, GPUs, CUDA, LMDeploy,
    models, disk, config): one row per check; exit status 1 on a blocker."""
    from gateway.ops.doctor import render, run_doctor

    env = env_overrides()
    report = run_doctor(config or env.config or DEFAULT_CONFIG, gpus or env.gpus, selftest=selftest)
    sys.stdout.write(render(report, as_json) + "\n")
    if not report.ok:
        raise typer.Exit(1)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cli()
