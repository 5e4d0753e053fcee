"""TaskD's `toolkit` layout, kept as re-exports; the client lives in taskd.client."""
