"""memcached's text protocol: the listener's reads and, on the root, its writes as one
producer (through the writer the wiring hands it, as KT's)."""
