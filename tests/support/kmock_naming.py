"""kmock's Kubernetes API emulator, plus what kopf needs of a real API server: Event names, resourceVersions and
the answer to a JSON patch whose `test` fails."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import jsonpatch
from kmock import KubernetesEmulator
from kmock._internal.dicts import patch_dict
from kmock._internal.k8s import KubernetesError


@attrs.frozen
class PatchTestFailed(KubernetesError):
    """What an API server answers to a JSON patch whose `test` op fails: 422, which kopf reads as "newer changes
    pending, try again on the next cycle" (kopf's patching of `patch.fns`); kmock answers 500, retried 9 times."""

    status: int = 422
    reason: str | None = "Invalid"


class NamingEmulator(KubernetesEmulator):
    """kmock's emulator plus three things a real API server does and kopf relies on:
    - `metadata.generateName`, which kopf uses for every Event it posts: without it all Events of a namespace
      share the name None and the second one is refused as a conflict;
    - a new `metadata.resourceVersion` on every write that changes the object. kmock keeps the one the client
      sent, so kopf cannot tell the body its own patch produced from an older one still in the watch stream:
      after its consistency timeout it handled the older body (a creation a second time, its status without
      what the first pass wrote, so a condition's lastTransitionTime written anew);
    - 422 for a JSON patch whose `test` op fails (kopf adds the finalizer with a resourceVersion test)."""

    _generated = itertools.count(1)
    _versions = itertools.count(1000)

    async def _handle(self, request: Any) -> Any:
        data, action = request.data, str(request.action)
        meta = data.get("metadata") if isinstance(data, dict) else None
        if action.endswith("CREATE") and isinstance(meta, dict):
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{next(self._generated):05d}"
            meta["resourceVersion"] = str(next(self._versions))
        elif action.endswith("UPDATE") and request.resource is not None and self._changes(request):
            version = str(next(self._versions))
            if isinstance(data, list):  # a JSON patch (its `test` ops see the old version: they come first)
                data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            elif isinstance(data, dict):  # a merge patch
                data["metadata"] = {**(meta if isinstance(meta, dict) else {}), "resourceVersion": version}
        return await super()._handle(request)

    def _changes(self, request: Any) -> bool:
        """Whether a patch changes the object: an API server gives a new resourceVersion only then (a patch that
        changes nothing is a no-op: Kubernetes API concepts, "Resource versions")."""
        key = (request.resource, request.namespace, request.name)
        obj = self._objects[key] if key in self._objects else None  # noqa: SIM401 - (kmock's array has no get)
        if obj is None or obj.deleted or request.data is None:
            return False  # the emulator answers it (not found, or nothing to apply)
        try:
            return patch_dict(obj.raw, request.data) != obj.raw
        except jsonpatch.JsonPatchTestFailed as exc:
            raise PatchTestFailed(message=str(exc)) from exc
