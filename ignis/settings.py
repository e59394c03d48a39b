"""Configuration from the environment (prefix IGNIS_), overridable by CLI flags and API arguments."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from ignis.errors import InvalidInputError

DEFAULT_STORE = "lmdb://./.ignis-data"


SERVICE_CONNECT_WAIT_SECONDS = 120.0  # a service pod that starts before its store waits this long for it


class IgnisSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="IGNIS_", extra="ignore")

    store: str = Field(DEFAULT_STORE, description="store URL: lmdb:///path or aerospike://hosts/namespace")
    farm_id: str = Field("local", description="deployment / datacentre id, prefixed onto queue-set names")
    client_id: str = Field("default", description="owning application; scopes set names")
    max_payload_bytes: int = Field(1 << 20, ge=1, description="largest payload publish accepts")
    hole_budget: int = Field(512, ge=1, description="holes one fire call may skip before giving up")
    active_shard_refresh_seconds: float = Field(
        1.0, gt=0, description="how often a fire re-reads shard pointers that nothing else kept fresh")
    poll_interval_seconds: float = Field(
        10.0, gt=0, description="longest an idle consumer sleeps before it looks for work on its own (a publish "
        "wakes it at once: in this process directly, from another through the doorbell or the watcher)")
    queue_refresh_seconds: float = Field(5.0, gt=0, description="how often consumers re-read queue config")
    connect_wait_seconds: float | None = Field(
        None, ge=0, description="how long opening the store keeps trying while it does not answer; default: "
        f"0 (fail at once) for the library and one-off commands, {SERVICE_CONNECT_WAIT_SECONDS:g} for the "
        "long-running services (ignis sweeper, ignis up, ignis operator)")


def load_settings(**overrides: Any) -> IgnisSettings:
    """Settings from the environment plus explicit overrides; a bad value is an InvalidInputError naming
    the variable, the value and the rule (not a raw pydantic error)."""
    try:
        return IgnisSettings(**overrides)
    except ValidationError as exc:
        problems = [f"IGNIS_{'_'.join(map(str, e['loc'])).upper()}={e.get('input')!r}: {e['msg']}"
                    for e in exc.errors(include_url=False)]
        raise InvalidInputError("invalid settings: " + "; ".join(problems)) from None


def service_wait(settings: IgnisSettings) -> float:
    """How long a long-running service keeps trying to open its store (IgnisSettings.connect_wait_seconds)."""
    chosen = settings.connect_wait_seconds
    return SERVICE_CONNECT_WAIT_SECONDS if chosen is None else chosen
