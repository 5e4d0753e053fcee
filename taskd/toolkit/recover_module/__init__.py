"""TaskD's package path for the recover client (re-export modules); the code lives in taskd.client."""

from taskd.client.manager import DLRecoverManager

__all__ = ["DLRecoverManager"]
