"""The encoded ledger of a busy cluster stays within a documented number of bytes, so a change that
bloats the snapshots (what the allocator stores and what every ledger replica reads at start) fails.

The ledger is `busy_ledger` (built through `allocate.decide`, as tests/bench/bench_snapshot.py
builds it at 1,000 to 12,500 nodes). Two bounds, each about 20 % above what was measured when they
were set (2026-12-05; tests/bench/results/bench_snapshot-latest.json has the figures per size):

- the replicas' copy (`without_past`: nodes, allocations, quotas, usage and the answers of the
  allocations held) per node of 8 GPUs: measured 8,280 bytes at 250 nodes (the bench: 9,061,
  8,786 and 8,571 at 1,000, 5,000 and 12,500 nodes; it varies with the gangs drawn, whose answers
  grow with the square of their size: every member's grant lists every member);
- the allocator's stored copy adds the past (answers and end events of allocations no longer held,
  up to `PAST_KEPT` + slack, whatever the cluster's size): measured 809 bytes per entry.
"""

from __future__ import annotations

from ibpool_core.pool.ledger import decode_ledger, encode_ledger, without_past

from .busy_ledger import GPUS_PER_NODE, busy_ledger

NODES = 250
PAST = 2_000
PUBLISHED_BYTES_PER_NODE = 10_000
STORED_BYTES_PER_PAST_ENTRY = 1_000


def test_a_busy_ledgers_snapshot_stays_within_its_bytes_per_node_and_per_past_entry() -> None:
    busy = busy_ledger(NODES, past=PAST)
    ledger = busy.ledger
    # The ledger is busy as the bound assumes: most GPUs held, every kind of allocation, a full past.
    assert busy.gpus_held >= 0.8 * NODES * GPUS_PER_NODE, busy.gpus_held
    assert set(busy.kinds) == {"fraction", "gang", "mig", "whole"}, busy.kinds
    past = len(ledger.answers) + len(ledger.ended) - len(ledger.allocations)
    assert past >= 2 * PAST, past

    stored = encode_ledger(ledger)
    published = encode_ledger(without_past(ledger))
    assert decode_ledger(stored) == ledger
    assert len(published) <= PUBLISHED_BYTES_PER_NODE * NODES, (
        f"the replicas' snapshot of {NODES} busy nodes is {len(published):,} bytes, "
        f"{len(published) / NODES:,.0f} per node; the bound is {PUBLISHED_BYTES_PER_NODE:,}"
    )
    per_entry = (len(stored) - len(published)) / past
    assert per_entry <= STORED_BYTES_PER_PAST_ENTRY, (
        f"the stored snapshot's past is {per_entry:,.0f} bytes per answer or end event kept; "
        f"the bound is {STORED_BYTES_PER_PAST_ENTRY:,}"
    )
