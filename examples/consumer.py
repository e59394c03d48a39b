"""Consume the `orders` queue with a push consumer: `concurrency` workers (from the manifest), a
handler that acks good orders, rejects bad ones to the sideline, and ignores duplicates.

    .venv/bin/python examples/consumer.py            # until Ctrl-C
    .venv/bin/python examples/consumer.py --drain    # until the queue is empty
"""

from __future__ import annotations

import argparse
import logging

from ignis import Consumer, Ignis, Message


class DuplicateOrder(Exception):
    """Declared ignorable: the order was already processed, so the message is simply deleted."""


def handle(message: Message) -> bool:
    order = message.payload
    if not isinstance(order, dict) or "order" not in order:
        return False  # sideline with reason "rejected"; a person can look at it with `ignis sideline list`
    if order.get("duplicate"):
        raise DuplicateOrder(order["order"])
    print(f"order {order['order']} (attempt {message.attempts}, shard {message.ref.shard})")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drain", action="store_true", help="stop once the queue is empty")
    parser.add_argument("--store", default=None, help="store URL (default: IGNIS_STORE or ./.ignis-data)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    with Ignis(args.store) as ignis:
        consumer = Consumer(ignis, queues=["orders"])
        consumer.register("orders.v1", handle, ignorable=[DuplicateOrder])
        if args.drain:
            consumer.drain(timeout=300)
        else:
            consumer.run()  # graceful stop on SIGINT / SIGTERM
        print(f"outcomes: {dict(consumer.outcomes)}")


if __name__ == "__main__":
    main()
