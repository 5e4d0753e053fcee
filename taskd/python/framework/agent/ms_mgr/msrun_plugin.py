"""The import path msrun uses: `from taskd.python.framework.agent.ms_mgr.msrun_plugin import MSRunPlugin`."""

from taskd.framework.agent.ms_mgr.msrun_plugin import CALLBACKS, MSRunPlugin

__all__ = ["CALLBACKS", "MSRunPlugin"]
