"""The shared vocabulary every component speaks: errors, the error -> HTTP table, failpoints,
address parsing, the service protocol, OpenAPI building blocks and the compiled-or-pure
loader. No uvicorn and no prometheus: the listeners' transport and bounds are `net`'s.

A leaf: nothing here imports any other Mercury package, so the store, the gateway, the
replicator and the read servers can all depend on it without depending on each other or on
the process wiring in `mercury/`.
"""
