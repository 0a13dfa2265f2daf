"""mercury.dev."""
