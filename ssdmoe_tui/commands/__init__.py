"""One module per `ssdmoe` command; `cli.py` registers them in this order.

The list lives here, not in cli.py, so a command that needs the others' names
(`launch` tells the chat app from the other commands it runs under mlx.launch) reads
it without importing the front door.
"""

COMMAND_MODULES = [
    "chat",
    "generate",
    "serve",
    "launch",
    "index",
    "repack",
    "demo_model",
    "requant",
    "models",
    "bench",
    "eval",
    "trace",
]
