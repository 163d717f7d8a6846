"""What a checkpoint on disk is: safetensors headers, the expert-tensor layout, the
architecture table and the config. Below `engine` and `models`; imports neither."""
