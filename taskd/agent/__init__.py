"""The per-node agent: supervises the ranks a launcher started and drives their recovery.

`supervisor` sequences the parts: `ranks`, `rank_control`, `hang_watch`, `controller_link`,
`executors`, `policy`, `msrun_logs`; `plugin` is what msrun loads, `config` what configures it.
"""
