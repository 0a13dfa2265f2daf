"""Shared test support: real processes, free ports, store fixtures."""
