"""Aerospike backend configuration: store URL, environment, config file, TLS — no server needed."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.aerospike_emulator import EmulatedServer

from ignis.errors import InvalidInputError
from ignis.storage import Storage, open_store
from ignis.storage.aerospike import context
from ignis.storage.aerospike.config import load_settings, parse_hosts


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> EmulatedServer:
    server = EmulatedServer(namespaces=("test", "ns-from-file", "ns-from-env"))
    monkeypatch.setattr(context, "client_factory", server.client)
    return server


def test_store_implements_the_protocol_and_url_names_the_target(server: EmulatedServer) -> None:
    store = open_store("aerospike://a:3000,b/test?farm=dc1&client=billing")
    assert isinstance(store, Storage)
    assert store.farm_id == "dc1" and store.client_id == "billing"
    assert store.url == "aerospike://a:3000,b:3000/test?farm=dc1&client=billing"
    assert store.with_client("other").url.endswith("client=other")
    store.close()


def test_hosts_parse() -> None:
    assert parse_hosts("h1:3000, h2 ,[::1]:3100") == [("h1", 3000), ("h2", 3000), ("::1", 3100)]
    for bad in ("", "h1:port", "h1:70000"):
        with pytest.raises(ValueError):
            parse_hosts(bad)


def test_url_options_and_errors(server: EmulatedServer) -> None:
    store = open_store("aerospike://h1/test?socket_timeout_ms=250&total_timeout_ms=900&retries=1&retry_sleep_ms=5")
    policy = server.configs[-1]["policies"]["read"]
    assert policy["socket_timeout"] == 250 and policy["total_timeout"] == 900
    assert store._shared.settings.retries == 1
    store.close()
    with pytest.raises(InvalidInputError, match="unknown option"):
        open_store("aerospike://h1/test?colour=blue")
    with pytest.raises(InvalidInputError, match="IGNIS_AEROSPIKE_RETRIES"):
        open_store("aerospike://h1/test?retries=-1")
    with pytest.raises(InvalidInputError, match="IGNIS_AEROSPIKE_HOSTS"):
        open_store("aerospike://h1:notaport/test")


def test_tls_settings_become_client_config(server: EmulatedServer) -> None:
    settings = load_settings({"hosts": "h1:4333,h2:4333", "tls_name": "aerospike.example", "tls_cafile": "/ca.pem",
                              "tls_certfile": "/c.pem", "tls_keyfile": "/k.pem", "user": "u", "password": "p"})
    config = settings.client_config()
    assert config["hosts"] == [("h1", 4333, "aerospike.example"), ("h2", 4333, "aerospike.example")]
    assert config["tls"] == {"enable": True, "cafile": "/ca.pem", "certfile": "/c.pem", "keyfile": "/k.pem"}
    assert config["user"] == "u" and config["password"] == "p"
    assert "tls" not in load_settings({}).client_config() and "user" not in load_settings({}).client_config()


def test_queries_keep_the_clients_partition_retries(server: EmulatedServer) -> None:
    """Single-record calls are retried by the store (only the safe ones); a query must keep the client's own
    per-partition retries, or it fails for as long as a cluster migrates (seen on a real 3-node cluster)."""
    policies = load_settings({"tend_interval_ms": 1000}).client_config()["policies"]
    assert policies["read"]["max_retries"] == 0 and policies["write"]["max_retries"] == 0
    assert policies["query"]["max_retries"] >= 3 and 50 <= policies["query"]["sleep_between_retries"] <= 1000


def test_precedence_url_over_env_over_file(server: EmulatedServer, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "aerospike.yaml"
    config.write_text("namespace: ns-from-file\nretries: 7\nmax_conns_per_node: 11\nuser: file-user\n")
    monkeypatch.setenv("IGNIS_AEROSPIKE_CONFIG_FILE", str(config))
    monkeypatch.setenv("IGNIS_AEROSPIKE_RETRIES", "5")
    monkeypatch.setenv("IGNIS_AEROSPIKE_PASSWORD", "from-a-secret")
    settings = load_settings({"max_conns_per_node": 3})
    assert (settings.namespace, settings.retries, settings.max_conns_per_node) == ("ns-from-file", 5, 3)
    assert settings.user == "file-user" and settings.password.get_secret_value() == "from-a-secret"

    store = open_store("aerospike://h1?farm=f&client=c")  # no namespace in the URL: the file's
    assert store.url == "aerospike://h1:3000/ns-from-file?farm=f&client=c"
    assert server.configs[-1]["user"] == "file-user"
    store.close()
    monkeypatch.setenv("IGNIS_AEROSPIKE_NAMESPACE", "ns-from-env")
    assert load_settings({}).namespace == "ns-from-env"
    assert load_settings({"namespace": "test"}).namespace == "test"


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="does not exist"):
        open_store(f"aerospike://h1/test?config={tmp_path}/nope.yaml")
