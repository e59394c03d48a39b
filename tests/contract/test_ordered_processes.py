"""Contract: an ordered queue consumed by several processes, one of them SIGKILLed while it holds messages: zero
order violations per key across the processes, every message handled, and the killed holder's messages handled
first again once their holds end (handlerTimeoutSeconds). lmdb and the real server (the emulator lives in one
process: skipped, said so)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from support.ordering import order_violations

from ignis import QueueSpec

WORKER = str(Path(__file__).resolve().parent.parent / "support" / "proc_worker.py")
KEYS, PER_KEY = 40, 12


def spawn(url: str, handle_seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, WORKER, "consume-ordered", url, "seq", "4", str(handle_seconds)],
                            stdout=subprocess.PIPE, text=True)


def test_sigkilled_consumer_breaks_no_per_key_order(backend) -> None:
    with backend.ignis() as ignis:
        ignis.apply(QueueSpec.build(name="seq", handlerType="seq", shards=8, ordered=True, handlerTimeoutSeconds=1))
        q = ignis.queue("seq")
        for n in range(PER_KEY):
            for k in range(KEYS):
                q.publish(f"k{k}:{n}", key=f"k{k}")
    victim = spawn(backend.url, 0.02)
    others = [spawn(backend.url, 0.002) for _ in range(2)]
    events: list[list[str]] = []
    open_ids: dict[str, str] = {}
    # the victim handles a few messages, then dies holding one (begun, not acked)
    for line in victim.stdout:  # type: ignore[union-attr]
        events.append(line.split())
        kind, _, payload, msg_id = events[-1][:4]
        if kind == "begin":
            open_ids[msg_id] = payload
        else:
            open_ids.pop(msg_id, None)
        if kind == "begin" and sum(1 for e in events if e[0] == "acked") >= 10:
            victim.send_signal(signal.SIGKILL)
            break
    victim.wait(30)
    assert victim.returncode == -signal.SIGKILL
    held_by_the_dead = set(open_ids)
    assert held_by_the_dead, "the victim died holding nothing"
    deadline = time.monotonic() + 180
    for proc in others:
        out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
        assert proc.returncode == 0
        events += [line.split() for line in out.splitlines()]
    begins = [(int(e[1]), *e[2].split(":")) for e in events if e[0] == "begin"]
    begins = [(at, key, int(n)) for at, key, n in begins]
    acks: dict[tuple[str, int], list[int]] = defaultdict(list)
    for e in events:
        if e[0] == "acked":
            key, n = e[2].split(":")
            acks[(key, int(n))].append(int(e[1]))
    assert set(acks) == {(f"k{k}", n) for k in range(KEYS) for n in range(PER_KEY)}, "not every message handled"
    assert order_violations(begins, acks) == []
    redelivered = {e[3] for e in events if e[0] == "begin" and int(e[4]) > 1}
    assert held_by_the_dead <= redelivered  # the dead holder's messages came again (their holds ended)
