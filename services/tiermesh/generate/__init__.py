"""Generative serving: continuous-batching decisions (`scheduler`) and the engine that runs
them on the ONNX decoder with per-sequence KV caches (`engine`)."""
