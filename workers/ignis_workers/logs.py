"""The sweeper's log set-up lives in the core (`ignis.logs`), shared with the operator."""

from ignis.logs import JsonFormatter, configure

__all__ = ["JsonFormatter", "configure"]
