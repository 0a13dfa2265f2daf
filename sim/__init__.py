"""Deterministic simulation of the replication tree (`mercury sim`, docs/replication.md)."""
