"""/tokenize and /detokenize as vLLM serves them: the prompt's token ids (and count, and the
model's context length), and ids back to text, with the server's codec: the --tokenizer when
one was given, else the word-per-token fallback. Each response says which in ``tokenizer``.
"""

from __future__ import annotations

from cbbench.server.protocol import (
    APIError,
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    check_vocab,
    parse_request,
    render_chat,
)
from cbbench.server.text import TextCodec


def parse_tokenize(body: object) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """The chat form when the body has ``messages``, else the completion form (as vLLM)."""
    if isinstance(body, dict) and "messages" in body:
        return parse_request(TokenizeChatRequest, body)
    return parse_request(TokenizeCompletionRequest, body)


def tokenize(req: TokenizeCompletionRequest | TokenizeChatRequest, codec: TextCodec,
             max_model_len: int | None) -> dict:
    if isinstance(req, TokenizeChatRequest):
        if req.continue_final_message:
            raise APIError(400, "continue_final_message is not supported",
                           param="continue_final_message")
        text = render_chat(req.messages, req.add_generation_prompt)
    else:
        text = req.prompt
    ids = codec.encode(text, add_special_tokens=req.add_special_tokens)
    out: dict = {"count": len(ids), "max_model_len": max_model_len or 0, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = codec.token_strs(ids)
    out["tokenizer"] = codec.kind
    return out


def detokenize(req: DetokenizeRequest, codec: TextCodec, vocab_size: int) -> dict:
    check_vocab(req.tokens, vocab_size, "tokens")
    return {"prompt": codec.decode(req.tokens), "tokenizer": codec.kind}
