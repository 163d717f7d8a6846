"""The chat without Textual: conversation and model-lifecycle state (`controller`),
and what a shown reply carries (`replies`). Importable without Textual or MLX."""
