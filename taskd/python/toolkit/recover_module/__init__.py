"""TaskD-compatible path for taskd.toolkit.recover_module; TaskD's package exports `DLRecoverManager`."""

from taskd.client.manager import DLRecoverManager

__all__ = ["DLRecoverManager"]
