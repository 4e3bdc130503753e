-- A gang's members on nodes hosted by one agent process share the allocation id: one row per node.
ALTER TABLE workloads DROP CONSTRAINT IF EXISTS workloads_pkey;
ALTER TABLE workloads ADD PRIMARY KEY (allocation_id, node_id);
