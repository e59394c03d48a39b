"""`ignis operator`: the kopf operator against the current cluster, or (with --manifests DIR) the same
reconciler over manifest files without a cluster. Registered on the `ignis` app by `register`, a plug-in
found through the `ignis.cli` entry point group (pyproject.toml)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from ignis import logs
from ignis.cli.render import OutputFormat, emit_json, emit_line
from ignis.errors import InvalidInputError, StoreError
from ignis.probes import ProbeServer
from ignis.settings import service_wait
from ignis.signals import set_on_signals
from ignis.storage import Storage, open_store_waiting
from ignis.version import package_version

log = logging.getLogger(__name__)

EXIT_INVALID = 2  # the CLI's "bad input" code: some manifest was not applied


def register(app: typer.Typer, groups: Mapping[str, typer.Typer]) -> None:
    """Entry point `ignis.cli`: add `ignis operator`."""
    app.command("operator")(operator_command)


def _open_store(ctx: typer.Context) -> tuple[Storage, str]:
    state: Any = ctx.find_root().obj  # ignis.cli.app.State (not imported: app imports this module)
    settings = state.settings()
    store = open_store_waiting(settings.store, service_wait(settings), farm_id=settings.farm_id,
                               client_id=settings.client_id)
    return store, settings.client_id


def _store_ready(store: Storage) -> tuple[bool, str]:
    try:
        store.list_clients()
    except StoreError as exc:
        return False, f"store unreachable: {exc}"
    return True, f"store {store.url} reachable"


def operator_command(
    ctx: typer.Context,
    namespace: Annotated[list[str] | None, typer.Option(
        "--namespace", "-n", help="watch only this namespace (repeat for several) [default: every namespace]")] = None,
    port: Annotated[int, typer.Option(help="port of /metrics, /healthz and /readyz (0 = any free port)")] = 9090,
    manifests: Annotated[Path | None, typer.Option(
        "--manifests", file_okay=False, dir_okay=True, help="run without a cluster: sync IgnisQueue manifests "
        "from this directory (re-read on change)")] = None,
    once: Annotated[bool, typer.Option("--once", help="with --manifests: one pass, print the results, exit "
                                       "(exit code 2 if any manifest was not applied)")] = False,
    interval: Annotated[float, typer.Option(help="with --manifests: seconds between checks for changed files")] = 2.0,
    output: Annotated[OutputFormat, typer.Option("--output", "-o", case_sensitive=False,
                                                 help="--once result format")] = OutputFormat.TABLE,
    log_format: Annotated[str, typer.Option("--log-format", help="text or json (one object per line)")] = "text",
    log_level: Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING or ERROR")] = "INFO",
) -> None:
    """Run the IgnisQueue operator: sync IgnisQueue objects into queue records, keep status, apply
    deletionPolicy on deletion, repair drift.

    With `--manifests DIR` the same reconciler runs over manifest files instead of a cluster (embedded
    mode): a removed file applies the queue's deletionPolicy; an invalid one is reported and skipped."""
    if once and manifests is None:
        raise typer.BadParameter("--once needs --manifests DIR", param_hint="--once")
    if log_format not in logs.FORMATS:
        raise typer.BadParameter(f"{log_format!r}: must be text or json", param_hint="--log-format")
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise typer.BadParameter(f"{log_level!r}: must be DEBUG, INFO, WARNING or ERROR", param_hint="--log-level")
    if not once:
        logs.configure(log_format, log_level)  # --once prints its results; the service logs
    store, client_id = _open_store(ctx)
    try:
        if manifests is not None:
            _run_manifests(store, manifests, client_id, port=port, once=once, interval=interval, output=output)
        else:
            _run_kopf(store, namespace or [], port=port)
    finally:
        store.close()


def announce(mode: str, store: Storage, port: int, **fields: Any) -> None:
    """The start-up line: version, store (its URL never carries a password), what is watched, the port."""
    version = package_version()
    details = ", ".join(f"{k} {v}" for k, v in fields.items())
    log.info("ignis operator %s starting (%s): store %s, %s, probes and metrics on port %d", version, mode,
             store.url, details, port,
             extra={"event": "start", "version": version, "mode": mode, "store": store.url, "port": port, **fields})


def _run_manifests(store: Storage, directory: Path, client_id: str, *, port: int, once: bool, interval: float,
                   output: OutputFormat) -> None:
    from ignis_operator.embedded import ManifestSync

    sync = ManifestSync(store, directory, default_client_id=client_id)
    if once:
        results = sync.sync_once()
        if output is OutputFormat.JSON:
            emit_json([r.as_dict() for r in results])
        else:
            for r in results:
                emit_line(f"{'ok  ' if r.ready else 'FAIL'} {r.client_id or '-'}/{r.name} [{r.reason}] {r.message}"
                          f" ({r.source})")
        if not all(r.ready for r in results):
            raise typer.Exit(EXIT_INVALID)
        return
    from ignis_operator.handlers import OperatorConfig

    stop = threading.Event()
    set_on_signals(stop)
    with ProbeServer(OperatorConfig().probe_host, port, ready=lambda: _store_ready(store)) as probes:
        announce("manifests", store, probes.port, manifests=str(directory))
        sync.run(stop, interval=interval)


def _run_kopf(store: Storage, namespaces: list[str], *, port: int) -> None:
    import kopf

    from ignis.kube import KubeConfigError, load_configuration
    from ignis_operator.handlers import OperatorConfig, OperatorContext
    from ignis_operator.wiring import build_registry, configure

    config = OperatorConfig()
    try:  # the operator's own client (status writes, Events): loaded like kopf's login and the sweeper's
        kube = asyncio.run(load_configuration())
    except KubeConfigError as exc:
        raise InvalidInputError(f"operator: {exc}") from None
    registry = build_registry(OperatorContext(store, config, kube=kube))
    settings = kopf.OperatorSettings()
    configure(settings, scanning=config.scanning)
    with ProbeServer(config.probe_host, port, ready=lambda: _store_ready(store)) as probes:
        announce("kubernetes", store, probes.port, namespaces=",".join(namespaces) or "all",
                 scanning="on" if config.scanning else "off")
        # standalone: no peering objects (one replica, Recreate strategy), so no kopfpeerings RBAC.
        kopf.run(registry=registry, settings=settings, standalone=True, clusterwide=not namespaces,
                 namespaces=namespaces)
