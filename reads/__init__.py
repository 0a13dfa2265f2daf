"""Consumer reads: the replica HTTP read API and the KT and memcached protocol listeners."""
