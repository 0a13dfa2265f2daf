"""memcached."""
