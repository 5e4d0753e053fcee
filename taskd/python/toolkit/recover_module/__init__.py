"""TaskD-compatible path for taskd.toolkit.recover_module."""
