"""`ssdmoe serve`: an OpenAI-compatible HTTP server on the streamed engine.

Layers, each one job:
- `schema.py`: request bodies parsed and validated once, into typed dataclasses;
- `engine_client.py`: the one seam to the engine (`AsyncEngine` over an `EngineService`,
  any `protocol.EngineClient`), events bridged into asyncio, up to `max_batch`
  generations at once (decoded together), a bounded queue;
- `prompts.py`: exact-history prompts (a record of each reply's tokens, keyed by the
  messages a client sends back) and `prompt_cache.py`: KV checkpoints on disk;
- `prompting/output.py` (shared with the app's tool loop): stop strings and tool calls cut
  out of the streamed text;
- `routes.py`: paths, key check, error envelope, middleware; the `serving_*` modules
  handle requests (vLLM's layout), on `serving_engine.py`'s shared generation steps.

Starlette and uvicorn are an optional extra (`ssdmoe-tui[server]`); nothing outside this
package imports it, and the engine never imports it.
"""
