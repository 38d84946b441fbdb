"""Data: bundled real datasets and the Arrow → torch path agents train from."""
