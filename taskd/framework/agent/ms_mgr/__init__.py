"""TaskD-compatible layout: taskd.framework.agent.ms_mgr.msrun_plugin (the agent itself is taskd.agent)."""
