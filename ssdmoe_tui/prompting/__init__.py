"""Messages to token ids: chat templates (chat_format); and back: a reply's text into
content and tool calls (output). The app, the server and `generate` call it; the engine
takes token ids only."""
