"""Storage backends behind one interface (`Storage`); `open_store` picks one from a URL."""

from __future__ import annotations

import re
import time
from urllib.parse import parse_qsl

from ignis.errors import InvalidInputError, StoreUnavailable
from ignis.storage.base import Claimed, LeaseRecord, QueueRecord, ShardPointers, SlotRef, Storage

__all__ = ["Claimed", "LeaseRecord", "QueueRecord", "ShardPointers", "SlotRef", "Storage", "open_store",
           "open_store_waiting"]

_SIZE_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _size(name: str, text: str) -> int:
    text = text.strip().lower().removesuffix("b").removesuffix("i")
    factor = _SIZE_SUFFIXES.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in _SIZE_SUFFIXES else text
    try:
        return int(float(digits) * factor)
    except ValueError:
        raise InvalidInputError(f"{name}={text!r}: not a size (e.g. 1073741824, 512m, 64g)") from None


def _redacted(url: str) -> str:
    """The URL with any `user:password@` replaced by `***@`."""
    return re.sub(r"(?<=://)[^/@?]*@", "***@", url)


def open_store(url: str, *, farm_id: str = "local", client_id: str = "default", purge_interval: float = 60.0
               ) -> Storage:
    """Open a store from its URL.

    `lmdb:///abs/path` or `lmdb://rel/path` (query: durability=fsync|fast, cursor_durability=checkpoint|fsync,
    map_size=64g, max_dbs=256,
    farm=F, client=C). A URL's farm/client override the arguments.
    `aerospike://[user:password@]host1:3000,host2:3000/namespace?farm=F&client=C` plus any setting of
    `AerospikeSettings` as a query parameter (config=FILE names a YAML settings file).
    """
    shown = _redacted(url)  # errors below quote the URL, never its password
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise InvalidInputError(f"store URL {shown!r} has no scheme; use lmdb:///path (or aerospike://...)")
    location, _, query = rest.partition("?")
    try:
        params = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise InvalidInputError(f"store URL {shown!r} has a malformed query string") from None
    farm_id = params.pop("farm", farm_id)
    client_id = params.pop("client", client_id)
    if scheme == "lmdb":
        from ignis.storage.lmdb import LmdbStore

        if not location:
            raise InvalidInputError(f"store URL {url!r} has no path; e.g. lmdb:///var/lib/ignis")
        kwargs: dict = {}
        for option in ("durability", "cursor_durability"):
            if option in params:
                kwargs[option] = params.pop(option)
        if "map_size" in params:
            kwargs["map_size"] = _size("map_size", params.pop("map_size"))
        if "max_dbs" in params:
            kwargs["max_dbs"] = int(_size("max_dbs", params.pop("max_dbs")))
        if params:
            raise InvalidInputError(f"store URL {url!r}: unknown lmdb option(s) {', '.join(sorted(params))}")
        return LmdbStore(location, farm_id=farm_id, client_id=client_id, purge_interval=purge_interval,
                         **kwargs)
    if scheme == "aerospike":
        from ignis.storage.aerospike import open_aerospike

        return open_aerospike(location, params, farm_id=farm_id, client_id=client_id)
    raise InvalidInputError(f"store URL {shown!r}: unknown scheme {scheme!r}; use lmdb:// or aerospike://")


def open_store_waiting(url: str, wait_seconds: float, **kwargs: object) -> Storage:
    """`open_store`, trying again while the store does not answer (StoreUnavailable: a server still starting,
    a node restarting, a machine too busy to connect in time) for up to `wait_seconds`, backing off as every
    store loop does (ignis.outage: capped, jittered; one WARNING line, not one per try). A bad URL or setting
    fails at once; so does the last try once the time is up. For the long-running
    services: a sweeper or consumer pod that starts before its Aerospike should wait for it, not crash. The
    embedded lmdb store opens at once or not at all (a path it cannot open stays so): no wait there."""
    from ignis.outage import Backoff

    if not url.startswith("aerospike:"):
        return open_store(url, **kwargs)  # type: ignore[arg-type]
    deadline = time.monotonic() + max(0.0, wait_seconds)
    backoff = Backoff()
    while True:
        try:
            store = open_store(url, **kwargs)  # type: ignore[arg-type]
        except StoreUnavailable as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise
            time.sleep(min(backoff.failed("open the store", exc), left))
            continue
        if backoff.failing:
            backoff.ok()
        return store
