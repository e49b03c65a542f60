"""The per-API endpoints of `cbbench serve` over the serving core (generate, async_engine,
protocol): chat and completions, the Responses API and its store, Anthropic's Messages,
embeddings and rerank (and the pooling they share), /tokenize and /detokenize."""
