-- The health picture entry by entry (ibpool_core.health.decide.STATE_MAPS: nodes, holdings, jobs,
-- departed, finished, link_problems): a decision writes only the entries it changed
-- (StateChanges), so a tick's writes follow what happened, not the cluster's size. health_state.body
-- keeps the rest (the split-brain flag, the topology version) with its maps empty; the link map is
-- link_targets'. A body saved whole before this table is rewritten entry by entry when read.
CREATE TABLE IF NOT EXISTS health_entries (
    map  text NOT NULL,
    key  text NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (map, key)
);
