"""/tokenize and /detokenize as vLLM serves them: the prompt's token ids (and count, and the
model's context length), and ids back to text, with the server's codec: the --tokenizer when
one was given, else the word-per-token fallback. Each response says which in ``tokenizer``.
The chat form renders the messages as /v1/chat/completions does (chat_render.py).
"""

from __future__ import annotations

from cbbench.server.chat_render import ChatRenderer
from cbbench.server.protocol import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    check_vocab,
    parse_request,
)
from cbbench.server.text import TextCodec


def parse_tokenize(body: object) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """The chat form when the body has ``messages``, else the completion form (as vLLM)."""
    if isinstance(body, dict) and "messages" in body:
        return parse_request(TokenizeChatRequest, body)
    return parse_request(TokenizeCompletionRequest, body)


def tokenize(req: TokenizeCompletionRequest | TokenizeChatRequest, codec: TextCodec,
             max_model_len: int | None, chat: ChatRenderer) -> dict:
    if isinstance(req, TokenizeChatRequest):
        prompt = chat.render(req.messages, req.add_generation_prompt, req.continue_final_message)
        text = prompt.text
        # Left out: the rule the chat endpoint encodes with (no BOS of the encoder's when the
        # template wrote one); given: as asked, as vLLM does.
        special = (req.add_special_tokens if req.add_special_tokens is not None
                   else prompt.add_special_tokens)
    else:
        text, special = req.prompt, req.add_special_tokens
    ids = codec.encode(text, add_special_tokens=special)
    out: dict = {"count": len(ids), "max_model_len": max_model_len or 0, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = codec.token_strs(ids)
    out["tokenizer"] = codec.kind
    return out


def detokenize(req: DetokenizeRequest, codec: TextCodec, vocab_size: int) -> dict:
    check_vocab(req.tokens, vocab_size, "tokens")
    return {"prompt": codec.decode(req.tokens), "tokenizer": codec.kind}
