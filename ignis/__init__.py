"""IgnisMQ core library: durable, sharded, at-least-once message queues.

    from ignis import Ignis, QueueSpec, Consumer
"""

from ignis.browse import BrowsedMessage
from ignis.client import Ignis
from ignis.consumer import Consumer, Handler
from ignis.errors import (
    AlreadySettled,
    HoleBudgetExceeded,
    IgnisError,
    InvalidInputError,
    InvalidSpecError,
    MessageNotFound,
    PayloadTooLarge,
    QueueInactive,
    QueueNotFound,
    StaleEpoch,
    StoreError,
    StoreFull,
    StoreUnavailable,
    TopicNotFound,
)
from ignis.queue import Message, MessageRef, Queue, QueueStats, Transfer
from ignis.settings import IgnisSettings
from ignis.spec import BatchingSpec, DeletionPolicy, QueueSpec, ShovelSpec, SubscribeSpec
from ignis.storage import SlotRef, Storage, open_store
from ignis.topics import Topic, TopicSpec, TopicStats

__all__ = [
    "AlreadySettled",
    "BatchingSpec",
    "BrowsedMessage",
    "Consumer",
    "DeletionPolicy",
    "Handler",
    "HoleBudgetExceeded",
    "Ignis",
    "IgnisError",
    "IgnisSettings",
    "InvalidInputError",
    "InvalidSpecError",
    "Message",
    "MessageNotFound",
    "MessageRef",
    "PayloadTooLarge",
    "Queue",
    "QueueInactive",
    "QueueNotFound",
    "QueueSpec",
    "QueueStats",
    "ShovelSpec",
    "SlotRef",
    "StaleEpoch",
    "Storage",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "SubscribeSpec",
    "Topic",
    "TopicNotFound",
    "TopicSpec",
    "TopicStats",
    "Transfer",
    "open_store",
]
