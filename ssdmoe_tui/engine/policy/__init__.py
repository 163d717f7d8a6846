"""Which experts to keep and where routing comes from: eviction policies and predictors,
recorded routing traces, trace-driven routing."""
