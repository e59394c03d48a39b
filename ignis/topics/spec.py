"""Topic model: `TopicSpec`, the fields of an IgnisTopic, their limits and defaults.

Read from an IgnisTopic manifest (camelCase, the apiVersion of IgnisQueue), built in Python (snake_case), and
converted to and from the topic record's bins (ignis.topics.registry). One line per violation, as QueueSpec.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from ignis.errors import InvalidSpecError
from ignis.spec import API_VERSION, CLIENT_ID_PATTERN, ONE_YEAR_SECONDS, QUEUE_NAME_PATTERN, DeletionPolicy, _describe
from ignis.spec import _Model as Model

TOPIC_KIND = "IgnisTopic"
MAX_RETENTION_BYTES = 1 << 50  # 1 PiB: a bound that catches a unit slip, not a real limit


class TopicSpec(Model):
    """A topic: a sharded, retained log of messages with subjects, read by subscriptions (queues with
    `subscribe`). A message leaves it `retention_seconds` after its publish, or earlier, oldest first, once the
    topic holds more than `retention_bytes` (when set)."""

    name: str = Field(min_length=1, max_length=63, pattern=QUEUE_NAME_PATTERN)
    client_id: str | None = Field(None, min_length=1, max_length=40, pattern=CLIENT_ID_PATTERN)
    shards: int = Field(32, ge=1, le=512)
    retention_seconds: int = Field(7 * 24 * 3600, ge=1, le=ONE_YEAR_SECONDS)
    retention_bytes: int | None = Field(None, ge=1, le=MAX_RETENTION_BYTES)
    deletion_policy: DeletionPolicy = DeletionPolicy.RETAIN

    @classmethod
    def build(cls, source: str | None = None, /, **fields: Any) -> TopicSpec:
        """Validate fields (camelCase or snake_case); raise InvalidSpecError listing every problem."""
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise InvalidSpecError(_describe(exc), source) from None

    @classmethod
    def from_manifest(cls, doc: Any, source: str | None = None) -> TopicSpec:
        """Read one IgnisTopic manifest."""
        if not isinstance(doc, dict):
            raise InvalidSpecError([f"manifest must be a mapping, got {type(doc).__name__}"], source)
        problems = []
        if doc.get("apiVersion") != API_VERSION:
            problems.append(f"apiVersion={doc.get('apiVersion')!r}: must be {API_VERSION!r}")
        if doc.get("kind") != TOPIC_KIND:
            problems.append(f"kind={doc.get('kind')!r}: must be {TOPIC_KIND!r}")
        metadata = doc.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if not name:
            problems.append("metadata.name: required (it is the topic name)")
        spec = doc.get("spec", {})
        if not isinstance(spec, dict):
            problems.append("spec: must be a mapping")
        if problems:
            raise InvalidSpecError(problems, source)
        fields = dict(spec)
        if "name" in fields:
            raise InvalidSpecError(["spec.name: not allowed; use metadata.name"], source)
        if "clientId" not in fields and "client_id" not in fields and isinstance(metadata, dict):
            namespace = metadata.get("namespace")
            if namespace:
                fields["clientId"] = namespace
        return cls.build(source, name=name, **fields)

    def to_manifest(self) -> dict[str, Any]:
        spec = self.model_dump(by_alias=True, mode="json", exclude={"name"}, exclude_none=True)
        return {"apiVersion": API_VERSION, "kind": TOPIC_KIND, "metadata": {"name": self.name}, "spec": spec}

    def config_bins(self) -> dict[str, Any]:
        """The config bins of the topic record (runtime bins, such as createdAt, are the store's)."""
        return {"shards": self.shards, "retention": self.retention_seconds,
                "retentionBytes": self.retention_bytes or 0, "deletionPolicy": self.deletion_policy.value}

    @classmethod
    def from_bins(cls, name: str, bins: dict[str, Any], client_id: str | None = None) -> TopicSpec:
        fields = {"name": name, "clientId": client_id, "shards": bins.get("shards", 32),
                  "retentionSeconds": bins.get("retention"),
                  "retentionBytes": int(bins.get("retentionBytes") or 0) or None,
                  "deletionPolicy": bins.get("deletionPolicy", "Retain")}
        return cls.build(f"stored topic {name!r}", **{k: v for k, v in fields.items() if v is not None})
