"""The per-node agent: supervises the ranks a launcher started and drives their recovery.

The map, by responsibility (docs/architecture.md has one row per module):

- `plugin` is what msrun loads, `config` what configures it, `supervisor` the main loop that sequences
  the rest, `summary` what happened to a job, `console` the one line per event.
- `round/`: a node's life as a pure machine: `states`, `events` (in) and actions (out), `rules` and
  `handlers`, `machine`; `actions` carries the actions out, one executor per action type.
- `link/`: the controller: `orders` (what it says), `controller` (the link), `reports` and
  `report_policy` (what the agent says back), registration and fencing (`held_node`, `fencing`), the
  job's status (`join_wait`, `job_end`, `node_loss`, `loss_wait`), `continued`, `policy`.
- `watches/`: what the agent watches in its ranks: `hangs` and their `culprit`, `departures`, `bugs`,
  `stragglers`, `metrics`.
- `ranks/`: the ranks: `table`, `control` through the `launcher` interface, `live` recovery,
  `resumption`, `resize`, `migration`, `msrun_logs`.
- `snapshots/`: a node's snapshots copied to its buddy (`replication`, `copies`).
"""
