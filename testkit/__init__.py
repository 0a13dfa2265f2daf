"""What tests and benches share: starting and stopping real processes by PID, free ports,
waiting for a condition, a local etcd, an HA cluster, a replication harness.

`bench/` imports this, never `tests/` (an import-linter contract).
"""
