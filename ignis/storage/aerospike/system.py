"""The farm-wide system records in `{farm}_ignis_system`: the sweeper epoch counter (`next_epoch`), the clients
registry (one record, map bin `clients`) and the leases (compare-and-set on the record generation, held off
after a rollback lost writes to them). Separate because these records belong to the farm, not to a client's
queues or magazines, and are the coordination between sweepers and operators."""

from __future__ import annotations

import time

import aerospike
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.expressions import arithmetic
from aerospike_helpers.operations import expression_operations as expr_ops
from aerospike_helpers.operations import map_operations as map_ops
from aerospike_helpers.operations import operations as ops

from ignis import names
from ignis.envelope import now_ms
from ignis.errors import StoreUnavailable
from ignis.storage.aerospike.context import AerospikeContext
from ignis.storage.base import LeaseRecord
from ignis.storage.rollback import report

EPOCH_KEY, EPOCH_BIN = "sweeperEpoch", "epoch"
CLIENTS_KEY, CLIENTS_BIN = "clients", "clients"
LEASE_PREFIX = "lease:"
LEASE_BINS = ("holder", "acquired_ms", "renewed_ms", "duration_s", "transitions")


class SystemRecords:
    """The sweeper epoch, the clients registry and the leases of a farm."""

    def __init__(self, ctx: AerospikeContext) -> None:
        self._ctx = ctx

    def next_epoch(self) -> int:
        # Repeating an in-doubt increment is safe here: it can only skip an epoch, and epochs need to be
        # increasing, not dense. The epoch is at least the current time in ms: a store that loses the last
        # increments (rollback.py) still hands out an epoch above every one handed out before its crash, since
        # epochs come seconds apart (one per leadership) and the restart takes longer than that.
        at_least_now = arithmetic.Max(exp.IntBin(EPOCH_BIN), now_ms()).compile()
        try:
            _, _, bins = self._ctx.call("next_epoch", self._ctx.client.operate,
                                        self._ctx.key(self._ctx.system_set, EPOCH_KEY),
                                        [ops.increment(EPOCH_BIN, 1),
                                         expr_ops.expression_write(EPOCH_BIN, at_least_now), ops.read(EPOCH_BIN)],
                                        None, self._ctx.never)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "next_epoch", self._ctx.system_set) from None
        return int(bins[EPOCH_BIN])

    def register_client(self, client_id: str) -> None:
        client_id = names.check_id("clientId", client_id)
        policy = {"map_write_flags": aerospike.MAP_WRITE_FLAGS_CREATE_ONLY | aerospike.MAP_WRITE_FLAGS_NO_FAIL}
        try:  # one map put, create-only: idempotent, so safe to repeat; no read-modify-write
            self._ctx.call("register_client", self._ctx.client.operate,
                           self._ctx.key(self._ctx.system_set, CLIENTS_KEY),
                           [map_ops.map_put(CLIENTS_BIN, client_id, now_ms(), policy)], None, self._ctx.never)
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "register_client", self._ctx.system_set) from None

    def list_clients(self) -> list[str]:
        try:
            _, _, bins = self._ctx.call("list_clients", self._ctx.client.get,
                                        self._ctx.key(self._ctx.system_set, CLIENTS_KEY))
        except ex.RecordNotFound:
            return []
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "list_clients", self._ctx.system_set) from None
        return sorted((bins or {}).get(CLIENTS_BIN) or {})

    def _lease_held_off(self, name: str) -> None:
        until = self._ctx.shared.lease_holds.get(name)
        if until is not None:
            if time.monotonic() < until:
                raise StoreUnavailable(f"lease {name!r}: the store lost writes to it (a rollback); not read or "
                                       f"written for {until - time.monotonic():.0f} s more, until any holder "
                                       "it may have had has expired")
            del self._ctx.shared.lease_holds[name]

    def get_lease(self, name: str) -> LeaseRecord | None:
        self._lease_held_off(name)
        try:
            _, meta, bins = self._ctx.call("get_lease", self._ctx.client.get,
                                           self._ctx.key(self._ctx.system_set, LEASE_PREFIX + name))
        except ex.RecordNotFound:
            return None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "get_lease", self._ctx.system_set) from None
        lease = LeaseRecord(*(bins[b] for b in LEASE_BINS), version=meta["gen"])
        mark = (self._ctx.system_set, LEASE_PREFIX + name)
        high = self._ctx.shared.marks.mark(mark)
        if lease.version < high:
            # Writes to the lease were lost: who holds it is not known. This process neither renews nor takes
            # it for a whole lease duration (a holder it knows nothing of expires meanwhile), so the rollback
            # never makes two leaders. Then it starts afresh from what the store holds.
            report(f"generation of lease {name}", None, lease.version, high, queue="", kind="lease")
            self._ctx.shared.lease_holds[name] = time.monotonic() + lease.duration_s
            self._ctx.shared.marks.forget(lambda k: k == mark)
            self._lease_held_off(name)
        self._ctx.shared.marks.saw(mark, lease.version)
        return lease

    def replace_lease(self, name: str, lease: LeaseRecord, expected_version: int) -> LeaseRecord | None:
        self._lease_held_off(name)
        writes = [ops.write(b, getattr(lease, b)) for b in LEASE_BINS]
        if expected_version == 0:
            meta, policy = None, {**self._ctx.never, "exists": aerospike.POLICY_EXISTS_CREATE}
        else:  # compare-and-set on the record generation
            meta = {"gen": expected_version}
            policy = {**self._ctx.never, "exists": aerospike.POLICY_EXISTS_UPDATE, "gen": aerospike.POLICY_GEN_EQ}
        try:
            _, stored_meta, _ = self._ctx.call("replace_lease", self._ctx.client.operate,
                                               self._ctx.key(self._ctx.system_set,
                                                             LEASE_PREFIX + name), writes, meta, policy,
                                               idempotent=False)
        except (ex.RecordExistsError, ex.RecordGenerationError, ex.RecordNotFound):
            return None
        except ex.AerospikeError as exc:
            raise self._ctx.fail(exc, "replace_lease", self._ctx.system_set) from None
        self._ctx.shared.marks.saw((self._ctx.system_set, LEASE_PREFIX + name), stored_meta["gen"])
        return LeaseRecord(lease.holder, lease.acquired_ms, lease.renewed_ms, lease.duration_s, lease.transitions,
                           stored_meta["gen"])
