"""The per-node agent: supervises the ranks a launcher started and drives their recovery.

The map, by responsibility (docs/architecture.md has one row per module):

- `plugin` is what msrun loads, `config` what configures it, `supervisor` the main loop that sequences
  the rest, `summary` what happened to a job, `console` the one line per event.
- `round/`: a node's life as a pure machine: `states` (and what the agent decides alone), `events` in and
  actions out, `rules` (the table and `RoundMachine`) and `handlers`; `actions` carries the actions out,
  one executor per action type.
- `link/`: the controller: `orders` (what it says), `controller` (the link), `reports` and
  `report_policy` (what the agent says back), `registration` (a held node, fencing, a continued rank's
  word), `job_status` (every node joined, the whole job ended), `node_loss` (replacements, standbys, a
  survivor's wait).
- `watches/`: what the agent watches in its ranks: `hangs` and their `culprit`, `exits` (a bug, an
  early exit 0), `stragglers`, `metrics`.
- `ranks/`: the ranks: `table`, `control` through the `launcher` interface (and msrun's logs), `live`
  recovery, `resumption`, `resize`, `migration`.
- `snapshots/`: a node's snapshots copied to its buddy (`replication`, `copies`).
"""
