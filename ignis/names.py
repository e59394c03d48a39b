"""Set names, record keys and magazine names of DESIGN §3 — the one place they are spelled."""

from __future__ import annotations

import re

from ignis.errors import InvalidInputError

SIDELINE_SUFFIX = "_SIDELINE"
DEAD_SUFFIX = "_DEAD"
MAX_SET_NAME = 63  # Aerospike set-name limit; lmdb keeps the same names so layouts compare 1:1
ID_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$")


def check_id(kind: str, value: str) -> str:
    if not value or not ID_PATTERN.match(value):
        raise InvalidInputError(f"{kind}={value!r}: must be letters, digits and '-', starting and ending "
                                "alphanumeric")
    return value


def queue_set(farm_id: str, client_id: str) -> str:
    return _set_name(f"{farm_id}_{client_id}_ignis_queues")


def active_index(farm_id: str, client_id: str) -> str:
    return f"{queue_set(farm_id, client_id)}_active"


def system_set(farm_id: str) -> str:
    """Farm-wide records: sweeper epoch counter, clients registry, leases."""
    return _set_name(f"{farm_id}_ignis_system")


def data_set(client_id: str) -> str:
    return _set_name(f"{client_id}_data_set")


def meta_set(client_id: str) -> str:
    return _set_name(f"{client_id}_meta_set")


def sideline_of(queue: str) -> str:
    return queue + SIDELINE_SUFFIX


def dead_of(queue: str) -> str:
    return queue + DEAD_SUFFIX


# A subscription's cursor over its topic (ignis.topics): per topic shard, its meta record holds the subscription's
# position (the fire pointer) and its data records are the claims of the topic's slots (the message stays in the
# topic). The topic is in the name, so the store resolves a cursor's load pointer, records and wake-ups without a
# lookup; queue and topic names contain no '_', so the name splits unambiguously.
CURSOR_INFIX = "_FROM_"


def cursor_of(subscription: str, topic: str) -> str:
    return f"{subscription}{CURSOR_INFIX}{topic}"


def cursor_topic(magazine: str) -> str | None:
    """The topic a cursor magazine reads, None for any other magazine."""
    head, infix, topic = magazine.partition(CURSOR_INFIX)
    return topic if infix and head else None


def queue_and_kind(magazine: str) -> tuple[str, str]:
    """(queue, main | sideline | dead | cursor) of a magazine name (a topic's own magazine reads as main)."""
    for suffix, kind in ((SIDELINE_SUFFIX, "sideline"), (DEAD_SUFFIX, "dead")):
        if magazine.endswith(suffix):
            return magazine[: -len(suffix)], kind
    if CURSOR_INFIX in magazine:
        return magazine.partition(CURSOR_INFIX)[0], "cursor"
    return magazine, "main"


def topic_set(farm_id: str, client_id: str) -> str:
    """Topic metadata records (ignis.topics), one per topic, beside the queue set."""
    return _set_name(f"{farm_id}_{client_id}_ignis_topics")


def data_key(magazine: str, shard: int, slot: int) -> str:
    return f"{magazine}_SHARD_{shard}_{slot}"  # data_key_prefix + slot, in one step: built per message


def parse_data_key(key: str) -> tuple[str, int, int]:
    """(magazine, shard, slot) of a data record key (data_key's inverse)."""
    head, _, slot = key.rpartition("_")
    magazine, _, shard = head.rpartition("_SHARD_")
    if not magazine or not shard.isdigit() or not slot.isdigit():
        raise ValueError(f"{key!r} is not a data record key (MAGAZINE_SHARD_N_SLOT)")
    return magazine, int(shard), int(slot)


def data_key_prefix(magazine: str, shard: int) -> str:
    """Everything of a data key but the slot, so hot paths can build keys by appending the slot."""
    return f"{magazine}_SHARD_{shard}_"


def meta_key(magazine: str, shard: int) -> str:
    return f"{magazine}_SHARD_{shard}_METADATA"


DELAYED_SUFFIX = "_DELAYED"


def delayed_key(queue: str, due_ms: int, msg_id: str) -> str:
    """A delayed message's data record: by due time (13 digits of epoch ms: text order is time order, so lmdb
    reads the due ones as a prefix), then its id."""
    return f"{queue}{DELAYED_SUFFIX}_{due_ms:013d}_{msg_id}"


def delayed_prefix(queue: str) -> str:
    return f"{queue}{DELAYED_SUFFIX}_"


def delayed_meta_key(queue: str) -> str:
    """The queue's delay record in the meta set: how many delayed messages it holds, and who moves them."""
    return f"{queue}{DELAYED_SUFFIX}_METADATA"


def beacon_key(magazine: str) -> str:
    """The magazine's beacon record in the meta set (a counter publishers bump now and then: ignis.watch)."""
    return f"{magazine}_BEACON"


def magazine_prefix(magazine: str) -> str:
    """Prefix shared by every data and meta key of one magazine (queue names contain no '_')."""
    return f"{magazine}_SHARD_"


def shard_label(shard: int) -> str:
    """Shard id as stored in sweep-pointer maps: SHARD_0, SHARD_1, ..."""
    return f"SHARD_{shard}"


def _set_name(name: str) -> str:
    if len(name) > MAX_SET_NAME:
        raise InvalidInputError(
            f"set name {name!r} is {len(name)} characters; Aerospike allows {MAX_SET_NAME}: "
            "shorten farmId or clientId"
        )
    return name
