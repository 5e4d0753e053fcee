"""Moved to :mod:`taskd.process`; kept so existing imports work. Import from taskd.process in new code."""

from taskd.process import *  # noqa: F401,F403
from taskd.process import __all__  # noqa: F401
