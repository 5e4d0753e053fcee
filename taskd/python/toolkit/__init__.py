"""TaskD-compatible path for taskd.toolkit."""
