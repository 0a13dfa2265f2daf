"""High availability of the root: candidates elected through etcd (see docs/ha.md).

Pure logic (no I/O): `lease` (when a leader must stop acknowledging), `role` (leader,
standby or electing from what etcd shows), `syncack` (semi-synchronous acknowledgement),
`fencing` (terms recorded in the log). `etcd` is the one I/O module: an adapter speaking
etcd v3's JSON gateway.
"""
