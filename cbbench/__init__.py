"""cbbench: benchmark LLM serving with a bundled continuous-batching engine."""

__version__ = "0.1.0"
