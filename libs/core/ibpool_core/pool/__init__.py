"""The GPU pool: resources, MIG layouts, the ledger and packing policies. Pure."""
