"""How the operator and the sweeper reach the Kubernetes API (kubernetes_asyncio), the same way in both:

1. in a pod, the service account (`KUBERNETES_SERVICE_HOST`/`_PORT` and the mounted token, refreshed as
   it rotates);
2. otherwise `$KUBECONFIG` (one or more files, `:`-separated) or `~/.kube/config`, its current context.

So a sweeper or an operator can run outside the cluster, next to a database in another network, with a
kubeconfig. kopf logs in the same order (`kopf.login_with_service_account`, then `login_with_kubeconfig`).

`describe_error` turns an API error into one log line: status code, reason and the server's message,
never the response headers and body that `str(ApiException)` dumps over several lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ignis.logs import one_line

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeConfigError(Exception):
    """No usable Kubernetes configuration: the message says what was tried, on one line."""


def kubeconfig_path() -> str:
    """$KUBECONFIG as it is now (kubernetes_asyncio reads it once, at import), else ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def in_cluster(service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (service_account_dir / "token").is_file()


async def load_configuration(service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> Any:
    """A kubernetes_asyncio `Configuration`: in-cluster first, then $KUBECONFIG / ~/.kube/config.
    Raises KubeConfigError naming what was tried."""
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    if in_cluster(service_account_dir):
        try:
            config.load_incluster_config(client_configuration=configuration,
                                         token_filename=str(service_account_dir / "token"),
                                         cert_filename=str(service_account_dir / "ca.crt"))
        except config.ConfigException as exc:
            raise KubeConfigError(f"in-cluster service account ({service_account_dir}): {one_line(exc)}") from None
        return configuration
    path = kubeconfig_path()
    files = [p for p in path.split(os.pathsep) if p]
    if not any(Path(p).expanduser().is_file() for p in files):
        raise KubeConfigError(f"no Kubernetes configuration: not in a cluster (KUBERNETES_SERVICE_HOST unset or no "
                              f"service account token in {service_account_dir}) and no kubeconfig at {path} "
                              f"(set KUBECONFIG)")
    try:  # several files are merged (kubernetes_asyncio's KubeConfigMerger)
        await config.load_kube_config(config_file=path, client_configuration=configuration, persist_config=False)
    except (config.ConfigException, OSError, ValueError, KeyError, TypeError) as exc:
        raise KubeConfigError(f"kubeconfig {path}: {type(exc).__name__}: {one_line(exc)}") from None
    return configuration


def describe_error(exc: BaseException) -> str:
    """One line for a failed API call: `HTTP 403 Forbidden: <the server's message>` for an ApiException,
    `ClientConnectorError: <text>` for anything else."""
    status = getattr(exc, "status", None)
    if status is not None and hasattr(exc, "reason") and hasattr(exc, "body"):
        return f"HTTP {status} {one_line(exc.reason or '')}".rstrip() + (f": {message}" if (message := api_message(exc))
                                                                         else "")
    return f"{type(exc).__name__}: {one_line(exc) or repr(exc)}"


def api_message(exc: BaseException) -> str:
    """The `message` of the Status object an API server answers an error with ("" if there is none)."""
    body = getattr(exc, "body", None)
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        doc = json.loads(body)
    except (TypeError, ValueError):
        return one_line(body)[:300]
    return one_line(doc.get("message", "")) if isinstance(doc, dict) else ""
