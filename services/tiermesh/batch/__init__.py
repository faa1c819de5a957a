"""Offline batch jobs: many inputs computed in the gaps of the online traffic."""
