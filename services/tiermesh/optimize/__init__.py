"""Quantize, calibrate, gate, profile and report: `tiermesh optimize` and `tiermesh profile`."""
