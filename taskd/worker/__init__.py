"""Placeholder; the worker SDK is filled in below."""
