"""The server's defaults, written once: `ServeOptions` (server/main.py) and the
`ssdmoe serve` flags (commands/serve.py) both read them. No imports: the CLI reads this
without loading Starlette."""

HOST = "127.0.0.1"  # loopback: nothing beyond this machine reaches a default server
PORT = 8080
MAX_QUEUE = 8  # requests waiting for the engine before new ones get 429
MAX_TOKENS = 4096  # a request that sets none
TEMPERATURE = 0.0  # a request that sets none: greedy
MAX_BODY_BYTES = 32 << 20
