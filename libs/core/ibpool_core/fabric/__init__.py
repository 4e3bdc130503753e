"""The InfiniBand fabric: the immutable topology model, what is derived from it, and its formats."""
