"""TaskD's `taskd.api` package: only `taskd_agent_api`, the entry point MindSpore's msrun tries first.

TaskD's package also has `taskd_worker_api`, `taskd_manager_api` and `taskd_proxy_api`; taskd has
no counterpart that would honour their contracts, so they are absent rather than half-present
(docs/mindspore.md, "TaskD's API modules"). Import `taskd.api.taskd_agent_api` by its full path.
"""
