"""TaskD's import path for the `Recover` stub and servicer; the generated code is taskd.proto's."""

from taskd.proto.recover_pb2_grpc import *  # noqa: F403
