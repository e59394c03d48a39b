"""Store connections for Spark tasks: each task reaches the store from the (credential-free) options.

A Python worker serves many tasks (`spark.python.worker.reuse`), so the connection is kept per worker
process and per store; an Aerospike client's cluster discovery then happens once per worker, not once
per task. Nothing here knows a backend beyond the URL scheme used for the lmdb host check.

A reused worker also runs a full `gc.collect()` after every task (pyspark/daemon.py), which walks every
object the worker holds: pyspark, pyarrow, ignis and their modules, about 30 ms of CPU per task here,
as much as reading some 7,000 messages (bench/README.md). So the first task of a worker freezes what
exists by then (`gc.freeze()`: "move them to a permanent generation and ignore them in all the future
collections", Python docs, gc module); later collections walk only what tasks create. Reference
counting still frees frozen objects; only a reference cycle among them would outlive the worker.
"""

from __future__ import annotations

import atexit
import gc
import os
import socket
import threading

from ignis.errors import StoreUnavailable
from ignis.storage import Storage, open_store
from ignis_pipeline.options import SourceOptions

LMDB_LOCAL_ONLY = ("an lmdb store is one directory on one host, so the ignis data source reads and writes it "
                   "only with a local master (local[*]) or a standalone master on this host's loopback address "
                   "(spark://127.0.0.1:PORT); use an aerospike:// store on a cluster")

_stores: dict[tuple[int, str, str, str], Storage] = {}
_lock = threading.Lock()
_frozen_in: int | None = None  # the process whose long-lived objects are frozen


def check_host(options: SourceOptions) -> None:
    """Refuse, with a clear message, to use an lmdb store on a host other than the driver's."""
    here = socket.gethostname()
    if options.is_lmdb and here != options.planner_host:
        raise StoreUnavailable(f"this task runs on host {here!r} but the driver is on {options.planner_host!r}: "
                               + LMDB_LOCAL_ONLY)


def task_store(options: SourceOptions) -> Storage:
    """The store of this worker process for `options` (opened on first use, closed at exit). Called at
    the start of every task; inside a Spark task, the first call of a process freezes the objects the
    worker holds by then (see the module doc)."""
    check_host(options)
    freeze_worker_objects()
    key = (os.getpid(), options.store, options.farm_id, options.client_id)
    with _lock:
        store = _stores.get(key)
        if store is None:
            # purge_interval=0: a Spark worker never runs lmdb's background purge of expired records (the
            # services do); expired records read as absent anyway.
            store = open_store(options.store, farm_id=options.farm_id, client_id=options.client_id,
                               purge_interval=0)
            _stores[key] = store
        return store


def freeze_worker_objects() -> bool:
    """Once per Spark Python worker process: gc.freeze() what it holds (modules, caches). True if this
    call froze; never in a process that is not running a Spark task (a driver, a test)."""
    global _frozen_in
    if _frozen_in == os.getpid():
        return False
    from pyspark import TaskContext

    if TaskContext.get() is None:
        return False
    _frozen_in = os.getpid()
    gc.freeze()
    return True


def open_driver_store(options: SourceOptions) -> Storage:
    """A connection for the driver side (planning, commits); the caller closes it."""
    return open_store(options.store, farm_id=options.farm_id, client_id=options.client_id, purge_interval=0)


@atexit.register
def _close_all() -> None:
    with _lock:
        for key, store in list(_stores.items()):
            if key[0] == os.getpid():
                store.close()
        _stores.clear()
