"""The batcher-worker: reads work streams, batches per length bucket, runs onnxruntime."""
