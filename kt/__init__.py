"""Kyoto Tycoon: its protocols (HTTP/REST, TSV-RPC, binary), the listener's reads and
writes, the update-log parser and the bridge that follows a KT server's update log.

Writes reach the gateway's write path only through the `writes.KtWriter` the wiring hands
the listener (`gateway/protocol_writer.py` implements it), so nothing here imports the
gateway.
"""
