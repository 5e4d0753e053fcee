"""Compatibility paths used by MindSpore and TaskD documentation (taskd.python.*)."""
