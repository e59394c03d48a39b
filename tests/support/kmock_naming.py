"""kmock's Kubernetes API emulator, plus what kopf's Event posting needs."""

from __future__ import annotations

import itertools
from typing import Any

from kmock import KubernetesEmulator


class NamingEmulator(KubernetesEmulator):
    """kmock's emulator plus `metadata.generateName`, which kopf uses for every Event it posts: without it
    all Events of a namespace share the name None and the second one is refused as a conflict."""

    _generated = itertools.count(1)

    async def _handle(self, request: Any) -> Any:
        meta = request.data.get("metadata") if isinstance(request.data, dict) else None
        creating = str(request.action).endswith("CREATE") and isinstance(meta, dict)
        if creating and not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{next(self._generated):05d}"
        return await super()._handle(request)
