"""Aerospike errors -> `ignis.errors`, and which errors are worth repeating.

Every message names the operation, the target (namespace / set / store URL without credentials) and
what to do; the client's own message is appended, never a password (the client never puts one there).
"""

from __future__ import annotations

from aerospike import exception as ex

from ignis.errors import IgnisError, InvalidInputError, StoreError, StoreFull, StoreUnavailable
from ignis.logs import one_line

# Transient: the cluster is moving partitions, a node is busy, a socket timed out. Repeating a read or
# an idempotent write is safe; a non-idempotent write is repeated only when `in_doubt` is False (the
# server certainly did not apply it).
TRANSIENT = (ex.TimeoutError, ex.ConnectionError, ex.ClusterChangeError, ex.ClusterError, ex.DeviceOverload,
             ex.RecordBusy, ex.NoMoreConnectionsError, ex.InvalidNodeError, ex.IndexNotReadable,
             ex.QueryQueueFull, ex.BatchQueueFullError, ex.NoResponse, ex.MaxErrorRateExceeded)


def error_field(exc: BaseException, name: str, default: object = None) -> object:
    """A field of a client error: code, msg, file, line or in_doubt. The client raises each error with these
    as its args and also sets them as attributes of the error's *class*, where they stay until the next
    error of that class: an attribute read on an error that carries no instance attribute of its own (one
    built from args, as the emulator and record_error build them) gets another error's value. Args first."""
    index = ("code", "msg", "file", "line", "in_doubt").index(name)
    args = getattr(exc, "args", ())
    if len(args) > index:
        return args[index]
    return vars(exc).get(name, default) if hasattr(exc, "__dict__") else default


def is_transient(exc: BaseException, idempotent: bool) -> bool:
    if not isinstance(exc, TRANSIENT):
        return False
    return idempotent or not error_field(exc, "in_doubt", False)


# Every error class of the client by its result code, to name a batch's per-record codes as the client
# names a single call's errors.
_BY_CODE: dict[int, type[ex.AerospikeError]] = {
    cls.code: cls for cls in vars(ex).values()
    if isinstance(cls, type) and issubclass(cls, ex.AerospikeError) and isinstance(getattr(cls, "code", None), int)}


def _detail(exc: ex.AerospikeError) -> str:
    # One line: the client's message may carry a multi-line `sub-errors:` list.
    return one_line(f"[{error_field(exc, 'code', '?')}] {error_field(exc, 'msg', '') or ''}")


def record_error(code: int | None, operation: str, where: str, what: str = "") -> IgnisError:
    """The `ignis.errors` exception for a failing per-record result code of a batch call (a batch does not
    raise when the cluster is down: its records come back with codes such as -15 or -10, or come back
    missing with an overall code). The same mapping as a single call's error."""
    code = -1 if code is None else int(code)
    cls = _BY_CODE.get(code, ex.ClientError if code < 0 else ex.ServerError)
    text = f"{what}: result code {code}" if what else f"result code {code}"
    return map_error(cls(code, text, "batch", 0, False), operation, where)  # its fields: args (error_field)


def map_error(exc: ex.AerospikeError, operation: str, where: str) -> IgnisError:
    """One `ignis.errors` exception for an Aerospike error raised by `operation` on `where`."""
    detail = _detail(exc)
    doubt = " (the write may or may not have been applied)" if error_field(exc, "in_doubt", False) else ""
    if isinstance(exc, ex.NamespaceNotFound):
        return StoreError(f"aerospike {operation} on {where}: the namespace does not exist on the cluster; "
                          f"add it to aerospike.conf or point the store URL at an existing one {detail}")
    if isinstance(exc, ex.ForbiddenError):
        return StoreError(f"aerospike {operation} on {where}: the server refused the write; a record TTL is "
                          "refused when the namespace has nsup-period 0 (set nsup-period, e.g. 120) "
                          f"{detail}")
    if isinstance(exc, ex.RecordTooBig):
        return InvalidInputError(f"aerospike {operation} on {where}: record too big for the namespace "
                                 f"(max-record-size / write-block-size, 1 MiB by default); publish a smaller "
                                 f"payload {detail}")
    if isinstance(exc, ex.BinNameError):
        return InvalidInputError(f"aerospike {operation} on {where}: bin name too long (Aerospike allows 15 "
                                 f"characters) {detail}")
    if isinstance(exc, ex.ServerFull):
        return StoreFull(f"aerospike {operation} on {where}: the namespace is full (stop-writes or device "
                         f"full) {detail}")
    if isinstance(exc, ex.AdminError | ex.SecurityNotEnabled):
        return StoreUnavailable(f"aerospike {operation} on {where}: authentication or authorization failed "
                                f"(check IGNIS_AEROSPIKE_USER / IGNIS_AEROSPIKE_PASSWORD and the user's roles) "
                                f"{detail}")
    if isinstance(exc, ex.TLSError):
        return StoreUnavailable(f"aerospike {operation} on {where}: TLS handshake failed (check tls_name, "
                                f"CA file, client cert/key) {detail}")
    if isinstance(exc, ex.TimeoutError):
        return StoreUnavailable(f"aerospike {operation} on {where}: timed out{doubt} {detail}")
    if isinstance(exc, ex.ParamError | ex.BatchFailed):
        return StoreError(f"aerospike {operation} on {where}: failed{doubt} {detail}")
    if isinstance(exc, ex.ClientError | ex.ClusterError | ex.ClusterChangeError):
        # A ClientError is raised by the client itself: no node answered (connection refused or lost, "cluster
        # is empty" = InvalidNodeError, no response, max error rate): the store is not reachable.
        return StoreUnavailable(f"aerospike {operation} on {where}: cluster unreachable or unstable{doubt} "
                                f"{detail}")
    if isinstance(exc, TRANSIENT):  # busy, overloaded, queues full: it answers, but not now
        return StoreUnavailable(f"aerospike {operation} on {where}: the cluster is busy{doubt} {detail}")
    if isinstance(exc, ex.IndexError):
        return StoreError(f"aerospike {operation} on {where}: secondary index error {detail}")
    return StoreError(f"aerospike {operation} on {where}: failed{doubt} {detail}")
