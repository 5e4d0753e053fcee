"""TaskD's import path for the recover client (`taskd.python.toolkit.recover_module.recover_manager`)."""

from taskd.toolkit.recover_module.recover_manager import *  # noqa: F403
from taskd.toolkit.recover_module.recover_manager import __all__  # noqa: F401
