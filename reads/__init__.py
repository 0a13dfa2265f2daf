"""reads."""
