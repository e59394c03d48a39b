"""Fixtures of the operator tests: `harness` runs kopf against kmock's API emulator and an lmdb store."""

from kopf_harness import harness, kmock_options, operator_config  # noqa: F401  (fixtures)
