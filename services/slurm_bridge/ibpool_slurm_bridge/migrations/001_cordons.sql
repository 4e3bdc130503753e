-- ibpool's cordons as the failover controller published them: the newest word on each one
-- (`lifted` once an Uncordoned came), so an older event delivered late changes nothing.
CREATE TABLE IF NOT EXISTS slurm_bridge_cordons (
    node_id   text        NOT NULL,
    scope     text        NOT NULL,
    gpu_index int         NOT NULL,
    rail      int         NOT NULL,
    reason    text        NOT NULL,
    lifted    boolean     NOT NULL,
    at        timestamptz NOT NULL,
    PRIMARY KEY (node_id, scope, gpu_index, rail)
);
