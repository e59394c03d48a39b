"""Magazine layer (DESIGN §4): `Magazine`, one magazine of a queue handle (ignis.magazine.core), and the parts
it composes, one concern per module: active shards (shards), awaited slots (awaited), reservations for
publishes (reservations) and the prefetch (prefetch). Callers import from here.
"""

from ignis.magazine.core import Magazine
from ignis.magazine.loads import shard_for_key
from ignis.magazine.prefetch import PREFETCH_PER_FIRE
from ignis.magazine.reservations import RESERVE_MAX

__all__ = ["PREFETCH_PER_FIRE", "RESERVE_MAX", "Magazine", "shard_for_key"]
