"""`make run`: the local topologies (plain, secure, HA) and what they share."""
