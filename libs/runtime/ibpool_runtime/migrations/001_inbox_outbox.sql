-- Every service schema gets an inbox (handled event ids) and an outbox (events to publish).
CREATE TABLE IF NOT EXISTS inbox (
    consumer   text        NOT NULL,
    event_id   text        NOT NULL,
    handled_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

CREATE TABLE IF NOT EXISTS outbox (
    seq        bigserial   PRIMARY KEY,
    event_id   text        NOT NULL UNIQUE,
    subject    text        NOT NULL,
    headers    text        NOT NULL,
    body       bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
