"""Images in chat messages, as `cbbench serve` charges them: each ``image_url`` part becomes
the vision tokens a named VLM would put in the prompt, plus its vision encoder's work.

The model charged is Qwen2-VL (Wang et al. 2024, "Qwen2-VL: Enhancing Vision-Language Model's
Perception of the World at Any Resolution"):

- Tokens. Its image processor (transformers, models/qwen2_vl/image_processing_qwen2_vl.py:
  ``smart_resize`` and the ``Qwen2VLImageProcessor`` defaults) resizes an H x W image so that
  both sides are multiples of 28 (patch 14 x spatial merge 2) and the area lies within
  [min_pixels, max_pixels] = [56*56, 28*28*1280], keeping the aspect ratio; the ViT's 14x14
  patches are merged 2x2 into one LLM token, so an image costs (H'/28) * (W'/28) tokens
  (1024 x 1024 -> 980 x 980 -> 35 * 35 = 1225). The vision start/end marker tokens around
  each image are not counted (the placeholders follow the chat template's text:
  chat_render.py).
- Encoder (a named assumption, not a measurement): the ViT is Qwen2-VL's 675M-parameter
  encoder (32 layers, width 1280) over the (H'/14) * (W'/14) patches, full attention within an
  image: 2 * 675e6 FLOPs per patch for its weights plus 4 * 32 * 1280 per (patch, patch)
  pair for attention. The simulator adds these FLOPs, at its device's FLOP rate, to the step
  that runs the request's first prefill chunk (engine/sim/sim_executor.py); the image tokens
  themselves are prefill tokens like any others. So TTFT grows with image size twice over.

An image arrives as a ``data:`` URL (base64); the server fetches nothing (a ``http(s)://``
URL is a 400). Only the image's header is read (Pillow) for its size; a part that is not an
image is a 400, and images beyond the request's image-byte limit a 413 (OpenAI's error shape).

This runs on the event loop, so its work is bounded before it starts: the image parts are
counted first (more than --limit-mm-per-prompt is a 400 before any is decoded), the prompt's
length with its image tokens is checked against the context before a placeholder id is built,
and the ids are built in one linear pass. A header claiming more pixels than Pillow's
decompression-bomb limit is a 400.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import zlib
from dataclasses import dataclass

from cbbench.server.limits import DEFAULT_LIMIT_IMAGES_PER_PROMPT, DEFAULT_MAX_IMAGE_BYTES
from cbbench.server.protocol import APIError

__all__ = ["DEFAULT_MAX_IMAGE_BYTES", "ImageCost", "add_images", "check_image_count",
           "image_tokens", "trace_images"]

# Chat bodies this large have their image parts counted from the raw JSON before validation:
# a smaller one holds too few parts for its validation to matter.
PRECOUNT_MIN_BYTES = 16 * 1024

# Qwen2-VL's image processor (transformers' Qwen2VLImageProcessor defaults).
PATCH_SIZE = 14
MERGE_SIZE = 2
FACTOR = PATCH_SIZE * MERGE_SIZE  # 28: one LLM token per 28 x 28 pixels
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
MAX_ASPECT_RATIO = 200
# Qwen2-VL's vision encoder (the assumption the encoder cost rests on).
VIT_PARAMS = 675e6
VIT_LAYERS = 32
VIT_WIDTH = 1280
DATA_URL_PREFIX = "data:"


@dataclass(frozen=True, slots=True)
class ImageCost:
    width: int
    height: int
    nbytes: int  # the encoded image's bytes (not its base64)
    tokens: int
    encoder_flops: float
    digest: int  # a content hash: the placeholder ids of the same image are the same


def smart_resize(height: int, width: int) -> tuple[int, int]:
    """Qwen2-VL's resize: (H', W'), multiples of 28 within [MIN_PIXELS, MAX_PIXELS]."""
    if min(height, width) < 1:
        raise ValueError("an image needs a positive size")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"the aspect ratio is above {MAX_ASPECT_RATIO}")
    h = max(FACTOR, round(height / FACTOR) * FACTOR)
    w = max(FACTOR, round(width / FACTOR) * FACTOR)
    if h * w > MAX_PIXELS:
        beta = math.sqrt(height * width / MAX_PIXELS)
        h = max(FACTOR, math.floor(height / beta / FACTOR) * FACTOR)
        w = max(FACTOR, math.floor(width / beta / FACTOR) * FACTOR)
    elif h * w < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h = math.ceil(height * beta / FACTOR) * FACTOR
        w = math.ceil(width * beta / FACTOR) * FACTOR
    return h, w


def image_tokens(width: int, height: int) -> int:
    """The LLM tokens of one image: (H'/28) * (W'/28) after smart_resize."""
    h, w = smart_resize(height, width)
    return (h // FACTOR) * (w // FACTOR)


def encoder_flops(width: int, height: int) -> float:
    """The assumed ViT's FLOPs for one image: weights per patch, attention per patch pair."""
    h, w = smart_resize(height, width)
    patches = (h // PATCH_SIZE) * (w // PATCH_SIZE)
    return 2.0 * VIT_PARAMS * patches + 4.0 * VIT_LAYERS * VIT_WIDTH * patches * patches


def decode_data_url(url: str, param: str) -> bytes:
    """The bytes of a base64 ``data:`` URL; a 400 for any other URL or a malformed one."""
    if not url.startswith(DATA_URL_PREFIX):
        raise APIError(400, f"{param}: only data: URLs (base64) are accepted; this server "
                       "fetches no image from the network", param=param)
    head, sep, data = url.partition(",")
    if not sep or not head.endswith(";base64"):
        raise APIError(400, f"{param}: a data: URL must be base64 (data:image/...;base64,...)",
                       param=param)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"{param}: the data: URL is not valid base64", param=param) from None


def image_cost(data: bytes, param: str) -> ImageCost:
    """Size (from the header alone), tokens and encoder FLOPs of one encoded image."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow warns past MAX_IMAGE_PIXELS (a header only is read: no harm here) and
            # raises past twice that (~179M pixels): a 400, never the 500 it was.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as im:
                width, height = im.size
    except Image.DecompressionBombError:
        raise APIError(400, f"{param}: the image's header claims more than "
                       f"{2 * (Image.MAX_IMAGE_PIXELS or 0)} pixels (a decompression bomb)",
                       param=param) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise APIError(400, f"{param}: not an image Pillow can read ({type(e).__name__})",
                       param=param) from None
    try:
        tokens = image_tokens(width, height)
    except ValueError as e:
        raise APIError(400, f"{param}: a {width}x{height} image cannot be taken: {e}",
                       param=param) from None
    return ImageCost(width, height, len(data), tokens, encoder_flops(width, height),
                     zlib.crc32(data))


def too_many_image_bytes(total: int, limit: int) -> APIError:
    return APIError(413, f"the request's images are {total} bytes, more than the {limit} bytes "
                    "this server accepts per request (--max-image-bytes)",
                    code="request_too_large")


def placeholder_ids(cost: ImageCost, vocab_size: int) -> list[int]:
    """The prompt ids standing for an image: its token count of one id drawn from its content
    hash, so the same image gives the same ids (a prefix cache can share it) and different
    images differ from their first token."""
    return [cost.digest % vocab_size if vocab_size else 0] * cost.tokens


def image_parts(messages) -> list[tuple[str, object]]:
    """(param, part) of every image part of a chat request's messages, in order; nothing read."""
    from cbbench.server.protocol import ImagePart

    return [(f"messages.{i}.content.{j}.image_url", part)
            for i, m in enumerate(messages) if not isinstance(m.content, str) and m.content
            for j, part in enumerate(m.content) if isinstance(part, ImagePart)]


def too_many_images(count: int, limit: int) -> APIError:
    return APIError(400, f"the request has {count} images; at most {limit} may be given in one "
                    "prompt (--limit-mm-per-prompt)", param="messages")


def count_image_parts(body: bytes) -> int:
    """The image parts of a chat body, from its raw JSON (pydantic-core's parser: ~5 us per KB,
    against ~60 us per KB to validate the request): so an image count past the limit is
    refused before the request is validated. 0 for a body that is not the expected shape
    (validation then says what is wrong)."""
    from pydantic_core import from_json

    try:
        doc = from_json(body)
    except ValueError:
        return 0
    messages = doc.get("messages") if isinstance(doc, dict) else None
    if not isinstance(messages, list):
        return 0
    return sum(1 for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
               for p in m["content"] if isinstance(p, dict) and p.get("type") == "image_url")


def check_image_count(body: bytes, limit: int) -> None:
    """A 400 for a chat body with more than ``limit`` image parts, before it is validated."""
    if len(body) >= PRECOUNT_MIN_BYTES and (count := count_image_parts(body)) > limit:
        raise too_many_images(count, limit)


def chat_images(messages, limit: int,
                max_images: int = DEFAULT_LIMIT_IMAGES_PER_PROMPT) -> list[ImageCost]:
    """Every image of a chat request's messages, in order; a 400 past ``max_images`` images
    (counted before any is decoded), a 413 once their bytes pass ``limit``, a 400 for one
    that is not a base64 image."""
    parts = image_parts(messages)
    if len(parts) > max_images:
        raise too_many_images(len(parts), max_images)
    out: list[ImageCost] = []
    total = 0
    for param, part in parts:
        data = decode_data_url(part.image_url.url, param)  # type: ignore[attr-defined]
        total += len(data)
        if total > limit:
            raise too_many_image_bytes(total, limit)
        out.append(image_cost(data, param))
    return out


def add_images(ids: list[int], messages, ctx) -> tuple[list[int], tuple[ImageCost, ...]]:
    """A chat prompt's ids with its images' placeholder ids after the text's, and the images
    (none: ``ids`` unchanged). The torch engine's models read text only: images are a 400."""
    images = chat_images(messages, ctx.cfg.max_image_bytes, ctx.cfg.limit_images_per_prompt)
    if not images:
        return ids, ()
    info = ctx.bridge.info or {}
    if info.get("engine") != "sim":
        raise APIError(400, "image inputs are simulated (--engine sim): the torch engine's "
                       "models read text only", param="messages")
    served = ctx.ready()
    total = len(ids) + sum(im.tokens for im in images)
    if served.max_model_len and total > served.max_model_len:
        # Checked before a placeholder id is built: the ids of a prompt that cannot run.
        raise APIError(400, f"This model's maximum context length is {served.max_model_len} "
                       f"tokens. However, the messages and their {len(images)} images are "
                       f"{total} tokens.", param="messages", code="context_length_exceeded")
    out = list(ids)
    for im in images:  # one pass: extend, never a copy of the prompt per image
        out.extend(placeholder_ids(im, served.vocab_size))
    return out, tuple(images)


def trace_images(trace, images: tuple[ImageCost, ...]) -> None:
    """The request log's image fields: how many, their bytes and the prompt tokens they cost."""
    trace.images = len(images)
    trace.image_bytes = sum(im.nbytes for im in images)
    trace.image_tokens = sum(im.tokens for im in images)
