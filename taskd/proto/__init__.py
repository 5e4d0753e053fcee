"""Generated protobuf and gRPC modules: regenerate with `python -m taskd.proto.generate`.

Never edit the *_pb2* files by hand; the test suite fails when they are stale.
"""
