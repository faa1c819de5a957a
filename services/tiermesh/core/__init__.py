"""Shared building blocks of every tiermesh service."""
