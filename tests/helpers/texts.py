"""Prompt texts several suites send: a long system prompt (long enough that a second turn's
reuse of it shows in the cache figures) and a first user message."""

from __future__ import annotations

SYSTEM = (
    "You are a patient assistant for people who run large mixture-of-experts language "
    "models on small machines. Answer plainly, explain the trade-offs between memory, "
    "disk bandwidth and speed, and say when a question needs measurements rather than "
    "guesses. Prefer short paragraphs. "
) * 6
HELLO = [{"role": "user", "content": "Hello there, how are you?"}]
