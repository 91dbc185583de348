"""Test plugins shared by every tier: the real Prometheus and the real cluster fixtures.

Tiers are folders: ``tests/unit`` (no network, fake time), ``tests/integration`` (the real
component under test), and later ``tests/e2e``.
"""

pytest_plugins = [
    "tests.fixtures.prometheus",
    "tests.fixtures.cluster",
    "tests.fixtures.simpods",
]
