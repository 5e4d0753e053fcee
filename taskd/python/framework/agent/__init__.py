"""Compatibility re-export."""
