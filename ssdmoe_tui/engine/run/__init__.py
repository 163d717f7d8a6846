"""Running the engine: the engine thread (service) and its typed protocol, open_engine,
the Runner that turns token ids into token events, the in-memory KV pool."""
