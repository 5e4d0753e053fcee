"""TaskD's import path for the `Recover` messages (`pb.ClientInfo`, ...); the generated code is taskd.proto's."""

from taskd.proto.recover_pb2 import *  # noqa: F403
from taskd.proto.recover_pb2 import DESCRIPTOR  # noqa: F401
