"""Publish orders to the `orders` queue of examples/queues/orders.yaml.

    .venv/bin/ignis queue apply -f examples/queues/orders.yaml
    .venv/bin/python examples/producer.py --count 100
"""

from __future__ import annotations

import argparse

from ignis import Ignis


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10, help="orders to publish")
    parser.add_argument("--store", default=None, help="store URL (default: IGNIS_STORE or ./.ignis-data)")
    args = parser.parse_args()

    with Ignis(args.store) as ignis:
        orders = ignis.queue("orders")
        # One customer's orders share a partition key: they land on one shard, in publish order.
        refs = orders.publish_many(
            [{"order": n, "customer": f"c-{n % 7}", "amount": 10 + n} for n in range(args.count)]
        )
        urgent = orders.publish({"order": "urgent"}, key="c-0", headers={"priority": "high"})
        print(f"published {len(refs) + 1} orders; the urgent one is {urgent}")


if __name__ == "__main__":
    main()
