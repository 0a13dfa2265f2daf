"""High availability of the root: candidates elected through etcd (see docs/ha.md).

The decision rules are pure, in modules of their own that import no I/O (an import-linter
contract): `lease` (when a leader must stop acknowledging), `role` (leader, standby or
electing from what etcd shows), `syncack` (semi-synchronous acknowledgement), `gate`
(whether a committed batch may be acknowledged), `errors`. The term record they fence with
is the log's (`store/terms.py`). The stateful role around them: `etcd` (an adapter speaking
etcd v3's JSON gateway), `candidate` (election), `standby`, `leader` (the ack gate, fencing,
hand-over), `front` (what a standby serves on the gateway's port) and `metrics`.
"""
