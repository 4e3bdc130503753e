"""The pool allocator: one ledger of every GPU of the cluster, changed only through events."""
