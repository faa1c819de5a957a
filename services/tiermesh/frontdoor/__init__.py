"""The Go front door (go/*.go): the public KServe v2 gRPC port in a compiled process in front
of the Python gateway, built here from Debian's Go packages (build.py)."""
