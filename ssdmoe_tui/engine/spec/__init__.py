"""Speculative decoding over the streamed engine: drafts that cost nothing to make
(`drafts`), a governor that prices each round before it runs (`governor`), and the
one-pass verify with its KV rewind (`verify`). docs/engine.md, "Speculative decoding"."""
