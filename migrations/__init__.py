"""migrations."""
