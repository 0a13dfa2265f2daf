"""Why an HA leader refuses to acknowledge (both 503 problems: retry, maybe elsewhere)."""

from __future__ import annotations

from core.errors import OverloadedError


class NotInSyncError(OverloadedError):
    """A batch committed on the leader was not confirmed by enough standbys in time: it is
    not acknowledged (it may or may not survive a failover)."""


class NotLeaderError(OverloadedError):
    """This node may no longer acknowledge writes: its etcd lease could not be renewed."""
