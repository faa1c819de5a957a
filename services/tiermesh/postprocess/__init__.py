"""Postprocess: per-model output steps, then delivery to the owning gateways."""
