"""Moved to :mod:`taskd.process.pidfd`; kept so existing imports work. Import from taskd.process."""

from taskd.process.pidfd import Exit, RankWatch  # noqa: F401
