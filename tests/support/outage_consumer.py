"""A consumer process for the outage tests: runs `Consumer` on one queue, printing `acked <id>` to stdout
(flushed) for each message it handled, with the process's logs (ignis.logs, text) on stderr."""

from __future__ import annotations

import sys

from ignis import Consumer, Ignis
from ignis.logs import configure


def main() -> None:
    url, queue_name = sys.argv[1], sys.argv[2]
    configure("text", "INFO")
    with Ignis(url) as ignis:
        consumer = Consumer(ignis, queues=[queue_name], poll_interval=0.05)

        @consumer.handler(queue_name)
        def handle(message: object) -> None:
            sys.stdout.write(f"acked {message.id}\n")  # type: ignore[attr-defined]
            sys.stdout.flush()

        sys.stdout.write("ready\n")
        sys.stdout.flush()
        consumer.run()


if __name__ == "__main__":
    main()
