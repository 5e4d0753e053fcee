"""The recovery controller: per-job state machine, persistence and the gRPC `Recover` service.

`taskd server` runs it standalone; `EmbeddedController` runs it inside another process
(`taskd run`, or MSRunPlugin when no MINDX_SERVER_IP is set).
"""
