"""The gateway: the public KServe v2 gRPC API and the Delivery service."""
