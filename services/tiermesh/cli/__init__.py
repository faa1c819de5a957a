"""The `tiermesh` command."""
