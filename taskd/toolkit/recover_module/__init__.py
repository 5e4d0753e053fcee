"""The `DLRecoverManager` client of the ClusterD-compatible `Recover` service."""
