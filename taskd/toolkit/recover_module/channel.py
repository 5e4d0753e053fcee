"""Old path of the client's channel helpers; the code lives in taskd.client.rpc."""

from taskd.client.rpc import ADDRESS_FORMS, DEFAULT_CHANNEL_OPTIONS, MAX_MESSAGE_BYTES, make_channel, normalize_address

__all__ = ["ADDRESS_FORMS", "DEFAULT_CHANNEL_OPTIONS", "MAX_MESSAGE_BYTES", "make_channel", "normalize_address"]
