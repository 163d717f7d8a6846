"""The engine: token ids in, tokens and figures out. It imports nothing from sessions,
ui, server, chat or Textual (tests/test_layering.py holds it to that).

- run/: the engine thread, its protocol, open_engine, the Runner, the KV pool
- model/: loading a model with streamed MoE blocks, the blocks, routing mass, context
- experts/: the expert index, the native reader, the slot cache, device memory, I/O stats
- policy/: eviction policies, routing traces, trace-driven routing
- distributed/: expert-parallel ranks
"""
