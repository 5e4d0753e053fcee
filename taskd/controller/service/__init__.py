"""The gRPC service: the server process, its servicers, the interceptor, auth, limits, connections, the hub."""
