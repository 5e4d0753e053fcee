"""TaskD's path of the generated `Recover` messages (`...recover_module.pb.recover_pb2`): taskd's, re-exported."""
