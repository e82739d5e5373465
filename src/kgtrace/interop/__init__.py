"""Converting weights to and from other tools (PyKEEN)."""
