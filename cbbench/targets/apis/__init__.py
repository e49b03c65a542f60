"""The per-API client parts beside the streaming core (http, sse, request): each --api's request
body and stream parser (api_specs chooses them), the pooling APIs' non-streaming path, and the
server-side tokenize call."""
