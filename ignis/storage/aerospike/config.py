"""Configuration of the Aerospike backend: the store URL plus settings from the environment
(`IGNIS_AEROSPIKE_*`) and an optional YAML file (`IGNIS_AEROSPIKE_CONFIG_FILE` or `?config=` in the URL).

Precedence: URL query > environment > config file > defaults. Credentials (user/password) may come from
any of them but never appear in `redacted_url`, in errors or in `repr` (the password is a SecretStr).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import aerospike
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from ignis.errors import InvalidInputError
from ignis.storage.base import RESERVATION_FRESH_MS

DEFAULT_PORT = 3000
CONFIG_FILE_ENV = "IGNIS_AEROSPIKE_CONFIG_FILE"
AckMode = Literal["auto", "durable-delete", "tombstone"]
AckCheck = Literal["message", "generation"]


class AerospikeSettings(BaseSettings):
    """Everything needed to reach a cluster and how to talk to it."""

    model_config = SettingsConfigDict(env_prefix="IGNIS_AEROSPIKE_", extra="forbid")

    hosts: str = Field("127.0.0.1:3000", description="seed hosts, host[:port] comma-separated")
    namespace: str = Field("ignis", description="Aerospike namespace holding every IgnisMQ set")
    user: str | None = Field(None, description="user name (security-enabled clusters)")
    password: SecretStr | None = Field(None, description="password; never logged")
    tls_enable: bool = Field(False, description="connect over TLS")
    tls_name: str | None = Field(None, description="TLS name of the server certificate (enables TLS)")
    tls_cafile: str | None = Field(None, description="CA bundle that signed the server certificate")
    tls_certfile: str | None = Field(None, description="client certificate (mutual TLS)")
    tls_keyfile: str | None = Field(None, description="client private key (mutual TLS)")
    socket_timeout_ms: int = Field(1000, ge=0, description="socket idle timeout per attempt")
    total_timeout_ms: int = Field(5000, ge=0, description="total timeout per call")
    retries: int = Field(3, ge=0, le=100, description="retries of transient errors, where repeating is safe")
    retry_sleep_ms: int = Field(50, ge=0, description="sleep between retries")
    max_conns_per_node: int = Field(100, ge=1, description="connection pool size per server node")
    thread_pool_size: int = Field(16, ge=1, description="client thread pool (batch and async work)")
    tend_interval_ms: int = Field(1000, ge=250, description="how often the client checks the cluster's nodes")
    ack_mode: AckMode = Field("auto", description="auto: durable delete on Enterprise, tombstones on Community")
    ack_check: AckCheck = Field(
        "message", description="message: an ack's tombstone settles only the message its claim stamped; generation: "
        "the record's generation alone, one filter expression less per ack, and a batch's settles the live records "
        "without the filter of its ids (docs/aerospike/durability.md)")
    claim_write_delay_ms: int = Field(
        1000, ge=0, description="a subscription's claim record is written this long after its claim unless an ack "
        "settled the slot first (then only the ack's tombstone is written); 0: at once (docs/aerospike/layout.md)")
    max_record_bytes: int = Field(1 << 20, ge=1024, description="largest record the namespace accepts")
    login_timeout_ms: int = Field(5000, ge=0, description="connect/login timeout")

    @property
    def write_grace_ms(self) -> int:
        """The producer's write deadline: every attempt of a load's write and the waits between them, the longest a
        reserved slot waits for its write (Storage.reserve), and a second for the gap between the increment's
        answer and the write (a scheduling delay)."""
        return ((self.retries + 1) * self.total_timeout_ms + self.retries * self.retry_sleep_ms
                + RESERVATION_FRESH_MS + 1000)

    @model_validator(mode="after")
    def _claims_written_in_time(self) -> AerospikeSettings:
        # The sweeper claims a slot a cursor passed with no claim record once the write deadline is over (a claimer
        # that died): a late claim record must land well before that, or a live consumer's message is delivered
        # twice.
        if self.claim_write_delay_ms * 2 > self.write_grace_ms:
            if "claim_write_delay_ms" in self.model_fields_set:
                raise ValueError(f"IGNIS_AEROSPIKE_CLAIM_WRITE_DELAY_MS {self.claim_write_delay_ms} must be at most "
                                 f"half the write deadline ({self.write_grace_ms} ms, from retries and "
                                 "total_timeout_ms)")
            self.claim_write_delay_ms = self.write_grace_ms // 4  # (the default, under a short deadline)
        return self

    @field_validator("hosts")
    @classmethod
    def _hosts_parse(cls, value: str) -> str:
        parse_hosts(value)
        return value

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls)

    @property
    def tls(self) -> bool:
        return self.tls_enable or bool(self.tls_name)

    def host_list(self) -> list[tuple[str, int] | tuple[str, int, str]]:
        hosts = parse_hosts(self.hosts)
        if self.tls_name:
            return [(host, port, self.tls_name) for host, port in hosts]
        return list(hosts)

    def redacted_url(self, farm_id: str, client_id: str) -> str:
        """The store URL without credentials: safe for logs, metrics and errors."""
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in parse_hosts(self.hosts))
        return f"aerospike://{hosts}/{self.namespace}?farm={farm_id}&client={client_id}"

    def client_config(self) -> dict[str, Any]:
        """The `aerospike.client(config)` dict. Policies follow DESIGN §3: commit level ALL, replica
        master-then-proles (the C/Python client calls it SEQUENCE), sendKey. The client's own retries are
        off: the store retries with tenacity, and only calls that are safe to repeat."""
        base = {"socket_timeout": self.socket_timeout_ms, "total_timeout": self.total_timeout_ms,
                "max_retries": 0, "replica": aerospike.POLICY_REPLICA_SEQUENCE}
        write = {**base, "commit_level": aerospike.POLICY_COMMIT_LEVEL_ALL, "key": aerospike.POLICY_KEY_SEND}
        # Queries (queue listing, purges, pipeline reads) keep the client's partition retries: while a cluster
        # migrates, a node answers "partition unavailable" for partitions it no longer owns, and the client
        # retries only those partitions, from the last digest it got, once its partition map is fresh ("the
        # latest servers support retries on individual data partitions ... useful when a cluster is
        # migrating", Aerospike QueryPolicy docs; the clients' default for queries is 5 retries). With 0 a
        # query failed outright, dozens of times in a node restart's minute or two of migrations (a real
        # 3-node cluster: about 40 failed queue listings in 200 s; 5 with 5 retries 250 ms apart). Retries
        # spread over about one total timeout ride the migration out; the total timeout still bounds a call.
        sleep_ms = max(self.tend_interval_ms // 2, 50)
        query = {**base, "max_retries": max(self.total_timeout_ms // sleep_ms, 5), "sleep_between_retries": sleep_ms}
        config: dict[str, Any] = {
            "hosts": self.host_list(),
            "policies": {"read": dict(base), "write": dict(write), "operate": dict(write),
                         "remove": dict(write), "batch": dict(base), "query": query,
                         "batch_write": {"commit_level": aerospike.POLICY_COMMIT_LEVEL_ALL,
                                         "key": aerospike.POLICY_KEY_SEND},
                         "login_timeout_ms": self.login_timeout_ms},
            "max_conns_per_node": self.max_conns_per_node,
            "thread_pool_size": self.thread_pool_size,
            "tend_interval": self.tend_interval_ms,
        }
        if self.user:
            config["user"] = self.user
            config["password"] = self.password.get_secret_value() if self.password else ""
        if self.tls:
            tls: dict[str, Any] = {"enable": True}
            for key, value in (("cafile", self.tls_cafile), ("certfile", self.tls_certfile),
                               ("keyfile", self.tls_keyfile)):
                if value:
                    tls[key] = value
            config["tls"] = tls
        return config


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """`h1:3000,h2,[::1]:3100` -> [(h1, 3000), (h2, 3000), (::1, 3100)]."""
    hosts = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if part.startswith("["):
            host, _, rest = part[1:].partition("]")
            port_text = rest.removeprefix(":")
        else:
            host, _, port_text = part.rpartition(":") if part.count(":") == 1 else (part, "", "")
        try:
            port = int(port_text) if port_text else DEFAULT_PORT
        except ValueError:
            raise ValueError(f"host {part!r}: port {port_text!r} is not a number") from None
        if not host or not 0 < port < 65536:
            raise ValueError(f"host {part!r} is not host[:port]")
        hosts.append((host, port))
    if not hosts:
        raise ValueError("no hosts given")
    return hosts


def load_settings(overrides: dict[str, Any], config_file: str | None = None) -> AerospikeSettings:
    """Settings from URL values (`overrides`), the environment and the config file. A bad value is an
    InvalidInputError naming the setting; a secret's value is never echoed."""
    path = config_file or os.environ.get(CONFIG_FILE_ENV)
    if path and not os.path.isfile(path):
        raise InvalidInputError(f"aerospike config file {path!r} does not exist")

    class _WithFile(AerospikeSettings):
        model_config = SettingsConfigDict(yaml_file=path)

    try:
        return _WithFile(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors(include_url=False, include_input=False):
            field = ".".join(map(str, error["loc"]))
            problems.append(f"IGNIS_AEROSPIKE_{field.upper()}: {error['msg']}" if field else error["msg"])
        raise InvalidInputError("invalid aerospike settings: " + "; ".join(problems)) from None
