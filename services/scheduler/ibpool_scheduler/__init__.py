"""ibpool scheduler: queues and jobs, one scheduling cycle at a time, placements proposed to the pool allocator."""
