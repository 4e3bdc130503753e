"""Runtime prediction learned from finished jobs (docs/prediction.md)."""
