"""A producer or consumer process for the fault suite (tests/test_aerospike_faults.py).

    fault_worker.py produce URL QUEUE SECONDS RATE [DELAYED_EVERY]
                                                       # publish for SECONDS at about RATE/s; every
                                                       # DELAYED_EVERY-th message with a delay of DELAY_S
    fault_worker.py produce-topic URL TOPIC SECONDS RATE SUBJECTS
                                                       # publish to a topic, the subjects (a comma list) in turn
    fault_worker.py consume URL QUEUE                  # a Consumer until SIGTERM (a subscription's too)

stdout (flushed, one line per step, each with the time it happened, epoch ms):
    published <ms> <id> [<due ms>]      a publish that returned (confirmed); a delayed one with its due time
    subject <id> <subject>              a topic publish's subject (after its published line)
    handled <ms> <id> <attempts>        the handler got the message
    acked <ms> <id>                     its ack returned
The process's logs (ignis.logs, text) go to stderr. A producer whose publish fails waits (backing off) and
publishes a new message: an unconfirmed one may still have been stored, and may be delivered."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ignis import Consumer, Ignis
from ignis.envelope import now_ms
from ignis.errors import StoreError
from ignis.logs import configure
from ignis.outage import Backoff
from ignis.queue import Message, Queue

_out = threading.Lock()


def say(*words: object) -> None:
    with _out:
        sys.stdout.write(" ".join(str(w) for w in words) + "\n")
        sys.stdout.flush()


DELAY_S = 2.0


def paced(name: str, seconds: float, rate: float, publish: Callable[[int], None]) -> None:
    """Call publish(i) for i = 0, 1, ... at about `rate` a second for `seconds`; one whose store call fails is
    retried as a new message after a backoff (an unconfirmed one may still have been stored)."""
    backoff = Backoff()
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            publish(i)
        except StoreError as exc:
            time.sleep(backoff.failed(f"publish {name}", exc))
            continue
        backoff.ok()
        i += 1
        time.sleep(max(0.0, 1 / rate - (time.monotonic() - started)))


def produce(ignis: Ignis, queue_name: str, seconds: float, rate: float, delayed_every: int = 0) -> None:
    queue = ignis.queue(queue_name)

    def publish(i: int) -> None:
        delayed = delayed_every > 0 and i % delayed_every == delayed_every - 1
        ref = queue.publish(f"m-{i}".encode(), delay=DELAY_S if delayed else None)
        say("published", now_ms(), ref.id, *([ref.slot] if delayed else []))  # (a delayed ref's slot: its due time)

    paced(queue_name, seconds, rate, publish)


def produce_topic(ignis: Ignis, topic_name: str, seconds: float, rate: float, subjects: list[str]) -> None:
    topic = ignis.topic(topic_name)

    def publish(i: int) -> None:
        subject = subjects[i % len(subjects)]
        ref = topic.publish(f"m-{i}".encode(), subject=subject)
        say("published", now_ms(), ref.id)
        say("subject", ref.id, subject)

    paced(topic_name, seconds, rate, publish)


class ReportingConsumer(Consumer):
    """A Consumer that also says when the store accepted an ack (the consumer's acks are batched, and retried
    while the store is down: ignis.acks)."""

    def _acked(self, queue: Queue, messages: list[Message]) -> None:
        super()._acked(queue, messages)
        for m in messages:
            say("acked", now_ms(), m.id)


def consume(ignis: Ignis, queue_name: str) -> None:
    consumer = ReportingConsumer(ignis, queues=[queue_name], poll_interval=0.05)

    def handle(message: Any) -> None:
        say("handled", now_ms(), message.id, message.attempts)

    consumer.register(queue_name, handle)
    consumer.run()  # until SIGTERM


def main() -> None:
    action, url, queue_name = sys.argv[1:4]
    configure("text", "INFO")
    logging.getLogger("ignis.delay").setLevel(logging.DEBUG)  # which process moved which delayed messages
    # Like a service (ignis sweeper): a worker started while the machine is too busy to connect in time waits.
    with Ignis(url, connect_wait_seconds=60) as ignis:
        say("ready", now_ms())
        if action == "produce":
            produce(ignis, queue_name, float(sys.argv[4]), float(sys.argv[5]),
                    int(sys.argv[6]) if len(sys.argv) > 6 else 0)
        elif action == "produce-topic":
            produce_topic(ignis, queue_name, float(sys.argv[4]), float(sys.argv[5]), sys.argv[6].split(","))
        elif action == "consume":
            consume(ignis, queue_name)
        else:
            raise SystemExit(f"unknown action {action}")
    say("done", now_ms())


if __name__ == "__main__":
    main()
