"""The embedded default backend: one LMDB environment holding the DESIGN §3 layout.

Each Aerospike set is an LMDB named database with the same name, keyed by the same record keys, so a
layout read with `ignis` tools compares 1:1 with Aerospike. Every record value starts with an
8-byte big-endian expire-at (epoch ms, 0 = never); then a msgpack map of bins, except for data
records, which have a fixed binary layout (see records._DATA). Expired records read as absent everywhere and
are purged in the background. The `{set}_active` database plays the secondary index.

LMDB gives what the Aerospike backend has to build from single-record operations: every primitive
here is one transaction, so load never leaves a hole on a crash, and claim/stamp is one atomic step.
Several processes on one host share the environment safely (LMDB's lock file, robust mutex).

The package is split by the concerns `Storage` names: `store` (the `LmdbStore` facade), `environment`
(the per-process environment, group commit, purger, fork handling), `context` (transactions shared by the
concerns), `records` (the byte layout), `registry`, `leases`, `allocation`, `claims`, `moves`, `reads`,
`delayed`, and `doorbell` (waking consumer processes after a load).
"""

from ignis.storage.lmdb.doorbell import EnvironmentBell, LmdbDoorbell
from ignis.storage.lmdb.store import DURABILITY_MODES, LmdbStore

__all__ = ["DURABILITY_MODES", "EnvironmentBell", "LmdbDoorbell", "LmdbStore"]
