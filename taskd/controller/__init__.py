"""The recovery controller: per-job state machine, persistence and the gRPC `Recover` service.

`taskd server` runs it standalone; `EmbeddedController` runs it inside another process
(`taskd run`, or MSRunPlugin when no MINDX_SERVER_IP is set).

The map, by responsibility (docs/architecture.md has one row per module):

- `core` holds the jobs in memory, commits every handled event and fans signals out; `config`,
  `cli_commands` (`taskd server`, `taskd status`), `status_view`, `locator`, `clock`, `metrics`.
- `machine/`: one job's state machine, pure: `model` (its words), `events`, `table` and `handlers`,
  `state_machine`, `strategy`, `job` and its `agents`, `resumed`.
- `nodes/`: the nodes of a job: `node_loss`, `standby`, `resize`, `migration`, `replicas` (snapshot
  buddies), `stragglers`.
- `storage/`: the SQLite `store`, `stored_rows`, `snapshot` (a job as JSON), `checkpoint` (undo),
  `group_commit`, `wal_check`, `quota`, `job_record` (a job's stored history).
- `service/`: the process and its gRPC: `server`, `servicers`, `guard` (the interceptor), `auth`,
  `validation`, `limits`, `tenancy`, `connections`, `sockdiag`, `native_log`, `hub` (the agents' streams).
"""
