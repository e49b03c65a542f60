"""`cbbench serve`: an OpenAI-compatible HTTP server in front of the bundled engine.

- ``async_engine``: the bridge between asyncio and the engine, which runs in one thread;
- ``app``: the FastAPI app (completions, chat completions, models, health, metrics);
- ``protocol``: request models, validation, OpenAI-style errors and response bodies;
- ``metrics``: Prometheus metrics on a registry of the app's own;
- ``text``: prompt encoding and token decoding (a real tokenizer, or a documented fallback).
- ``chat_render``: chats as prompts (the tokenizer's chat template, or a minimal one).
"""
