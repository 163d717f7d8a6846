"""Messages to token ids: chat templates (chat_format). The app, the server and
`generate` call it; the engine takes token ids only."""
