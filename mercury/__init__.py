"""mercury."""
