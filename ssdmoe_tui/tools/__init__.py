"""Tools for the chat, without Textual: MCP servers (`servers`, on the official `mcp`
SDK), the model's tool calls found in its reply (`calls`), and the loop that runs them
(`loop`). The UI only shows what these decide."""
