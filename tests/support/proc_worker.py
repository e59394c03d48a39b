"""A child process for the multi-process and crash tests: publishes or consumes, printing one line per
completed step (after the store call returned), flushed, so the parent knows what was acknowledged."""

from __future__ import annotations

import sys

from ignis import Ignis


def main() -> None:
    action, url, queue_name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    out = sys.stdout
    with Ignis(url) as ignis:
        queue = ignis.queue(queue_name)
        if action == "publish":  # one message per call; print only once publish has returned
            for i in range(count):
                ref = queue.publish(f"{sys.argv[5]}-{i}")
                out.write(f"published {ref.id}\n")
                out.flush()
        elif action == "publish-every":  # one message every argv[5] seconds, on a schedule
            import time

            start = time.monotonic()
            for i in range(count):
                time.sleep(max(0.0, start + i * float(sys.argv[5]) - time.monotonic()))
                ref = queue.publish(f"paced-{i}")
                out.write(f"published {ref.id}\n")
                out.flush()
        elif action == "publish-held":  # one publish whose commit waits, after its committing ring, for a line
            from ignis.storage.lmdb.context import StoreContext  # on stdin (lmdb: the doorbell's ring-then-commit)

            ring = StoreContext.ring_committing

            def held(self: StoreContext, *args: object, **kwargs: object) -> None:
                ring(self, *args, **kwargs)
                out.write("rang\n")
                out.flush()
                sys.stdin.readline()  # (the write transaction stays open meanwhile)

            StoreContext.ring_committing = held  # type: ignore[method-assign]
            ref = queue.publish(sys.argv[5])
            out.write(f"published {ref.id}\n")
            out.flush()
        elif action == "publish-delayed":  # one message per call, each `argv[5]` seconds later than now
            for i in range(count):
                ref = queue.publish(f"delayed-{i}", delay=float(sys.argv[5]))
                out.write(f"published {ref.id} {ref.slot}\n")
                out.flush()
        elif action == "claim":  # fire without acking: which slots did this process get?
            out.write("ready\n")
            out.flush()
            while messages := queue.fire_many(count):
                for m in messages:
                    out.write(f"claimed {m.ref} {m.id}\n")
            out.flush()
        elif action == "consume":  # fire, then ack, printing each step
            while (m := queue.fire()) is not None:
                out.write(f"fired {m.id}\n")
                out.flush()
                m.ack()
                out.write(f"acked {m.id}\n")
                out.flush()
        elif action == "consume-ordered":  # an ordered queue's consumer: begin (time, payload), handle, ack (time)
            import time

            idle_until = time.monotonic() + count  # (count: seconds without a message before it stops)
            from ignis.errors import StoreError

            while time.monotonic() < idle_until:
                try:
                    m = queue.fire(timeout=0.5)
                except StoreError:  # a store outage (a node down): again in a moment
                    time.sleep(0.5)
                    idle_until = time.monotonic() + count
                    continue
                if m is None:
                    continue
                out.write(f"begin {time.time_ns()} {m.payload} {m.id} {m.attempts}\n")
                out.flush()
                time.sleep(float(sys.argv[5]))  # handling
                try:
                    m.ack()
                except StoreError:  # not acked (or not known to be): it comes again
                    out.write(f"ackfailed {time.time_ns()} {m.payload} {m.id}\n")
                else:
                    out.write(f"acked {time.time_ns()} {m.payload} {m.id}\n")
                out.flush()
                idle_until = time.monotonic() + count
        else:
            raise SystemExit(f"unknown action {action}")


if __name__ == "__main__":
    main()
