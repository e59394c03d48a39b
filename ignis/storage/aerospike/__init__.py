"""The production backend: `Storage` on Aerospike with the exact layout of DESIGN §3.

Layout (names from `ignis.names`): queue records in `{farm}_{client}_ignis_queues` (key = queue name,
sendKey, STRING index `{set}_active` on bin `active`); message records in `{client}_data_set` keyed
`{magazine}_SHARD_{n}_{slot}` with the envelope bins; shard pointers in `{client}_meta_set` keyed
`{magazine}_SHARD_{n}_METADATA` (bins LOAD_POINTER, FIRE_POINTER); the farm-wide `{farm}_ignis_system`
set holds the sweeper epoch counter, the clients registry (one record, map bin `clients`) and leases.

Atomicity from single-record operations, one round trip each:
* load: one `operate` on the meta record (increment LOAD_POINTER by n, read it back) allocates n slots,
  then the data records are written (one `put`, or one `batch_write`). A crash in between leaves a hole.
  If the increment fails *in doubt* it is repeated: the slot numbers come only from an increment's
  answer, so a repeat can at worst leave the first increment's slots as holes (skipped and counted by
  fire), never give one slot to two messages. The write refuses a *sealed* slot (below): such a message
  is written again into a new slot, so a write that came too late is never left behind the fire pointer.
* claim: one `operate` on the meta record guarded by the filter `FIRE_POINTER < LOAD_POINTER`, writing
  FIRE = min(FIRE + k, LOAD) by expression and reading the old and new value: distinct callers always
  get distinct slots. An in-doubt claim is not repeated: slots it may have taken are recovered by the
  sweeper (unstamped records below the fire pointer) — duplication, never loss. Then one update-only
  `operate` (one slot) or `batch_operate` (several) stamps fireTS, bumps attempts and reads the records.
  A missing record is usually a publish in flight (a consumer that is caught up claims between a
  producer's increment and its write, or a slot a concurrent publish reserved for the next one): it is
  *awaited*, and the claimer re-reads it (`restamp`) until it
  lands or the producer's write deadline (`write_grace_ms`) has passed; then it *seals* the slot: a
  tombstone marked `sealedAt` that every later write to the slot is refused by (filter, in the write).
* move (sweep, shovel, dead-letter): a per-record claim that a newer epoch wins — bins `mvEpoch` and
  `mvTo` (the target slot) written on the source under the filter `mvEpoch <= epoch` — then the copy,
  then the delete filtered by `mvEpoch == epoch`. A newer epoch that takes over a claimed record seals
  the older claim's target slot first (or finds the copy already there), so a paused ex-leader that
  resumes can neither copy twice nor delete.
* sweep pointers: one `operate` fenced by the filter `sweepEpoch <= epoch` that writes the pointer map
  through one expression: a `let` binding per shard to max(stored, new) (forward-only; linear in the
  number of shards, so 512 shards are one small expression), adds to the counter and stores the epoch.

Acks that stay acked. Community Edition has no durable deletes: a plainly deleted record comes back
after a cold restart. `ack_mode=auto` asks the server for its edition: Enterprise -> deletes with
`durable_delete`; Community -> a *tombstone*: the record is replaced (update-only) by the single bin
`deletedAt` keeping its original TTL ("don't update"), so it disappears when the message would have
expired anyway and a restart finds the newer tombstone, not the message. Every read path (claim, read,
peek, stamp_unfired, pointers, purge, queue registry) treats a tombstone as absent. Queue deletion uses
the same mechanism; a magazine purge leaves `purgedAt` tombstones instead, which a new message written
to the slot (the queue declared again) simply replaces, and which a claim takes for an awaited slot.

Retries: tenacity repeats transient errors of reads and idempotent writes; a non-idempotent write
(increment) is repeated only when the client says the server surely did not apply it (`in_doubt`
False), except where a repeat is harmless by design: the load pointer (at worst a hole), the sweeper
epoch (at worst a gap) and the fire stamp (at worst one extra attempt counted — better than leaving a
claimed message to the sweeper). Not repeated when in doubt: the claim (its slots are recovered by the
sweeper), the sweep update (its counter is not idempotent), the lease compare-and-set.

Time to live goes in each write's policy (`ttl`; -2 = keep the record's own): the client deprecates it
in the record metadata.

The code is split by concern, one module each, composed by the `AerospikeStore` facade (`store`): `context`
(the client, settings, key builders and error plumbing every concern shares), `registry` (queue records and
their index), `system` (the farm-wide epoch, clients and leases), `reads` (batch reads, peeks, settles and
deletes), `seals` (seals and hole counts), `allocation` (slot allocation and loads, and the repair of pointers a
rollback set back), `claims` (claims and their stamps), `moves` (fenced moves), `pointers` (shard pointers and
beacons), `delayed` (delayed messages) and `purge` (magazine purges); `config` and `errors` hold the settings and
the error mapping.
"""

from ignis.storage.aerospike.context import PURGED, SEALED, TOMBSTONE
from ignis.storage.aerospike.moves import MOVE_EPOCH
from ignis.storage.aerospike.store import AerospikeStore, open_aerospike
from ignis.storage.aerospike.system import EPOCH_BIN, EPOCH_KEY

__all__ = ["EPOCH_BIN", "EPOCH_KEY", "MOVE_EPOCH", "PURGED", "SEALED", "TOMBSTONE", "AerospikeStore", "open_aerospike"]
