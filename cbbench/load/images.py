"""Images in chat requests (issue 26): ``--workload random-mm``'s synthetic images and the
image paths or URLs of a JSONL workload, turned into OpenAI ``image_url`` content parts.

- ``--workload random-mm``: ``--workload random``'s lengths, plus ``--images-per-request N``
  images per request, each of a size drawn uniformly from ``--image-size`` (``WxH``, or a
  comma list ``512x512,1024x1024``). Pixels are uniform random bytes (vLLM bench's random-mm
  images), encoded as ``--image-format`` jpeg (quality 75, as Pillow's default) or png, sent as
  base64 ``data:`` URLs. Everything is drawn from --seed: the same requests carry the same
  bytes on every target. Encoding a 1024x1024 noise image takes ~0.1-0.2 s here, so the images
  come from a pool of IMAGE_POOL_SIZE distinct images per size, made before the run starts;
  each request draws its images from the pool (a server that caches vision-encoder outputs by
  image content would see repeats: say so when comparing such servers).
- A JSONL line's ``"images": [...]``: local paths (relative to the JSONL file's folder) are
  read, checked to be images (Pillow) when the workload loads, and sent as data: URLs;
  ``http(s)://`` and ``data:`` URLs are sent as given.

A request's record keeps ``images`` (how many) and ``image_bytes`` (the encoded bytes; a
remote URL's are unknown, so null), and the server's usage says ``image_tokens`` where it can.
"""

from __future__ import annotations

import base64
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cbbench.errors import UsageError

RANDOM_MM_WORKLOAD = "random-mm"
IMAGE_FORMATS = ("jpeg", "png")
DEFAULT_IMAGE_SIZE = "512x512"
DEFAULT_IMAGES_PER_REQUEST = 1
DEFAULT_IMAGE_FORMAT = "jpeg"
JPEG_QUALITY = 75  # Pillow's default
IMAGE_POOL_SIZE = 16  # distinct synthetic images per size
MAX_IMAGES_PER_REQUEST = 64
MAX_IMAGE_SIDE = 16384
MIN_IMAGE_SIDE = 1
SIZE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")
# A synthetic image's reference in a WorkloadRequest: "random:WxH:POOL_INDEX:FORMAT".
SYNTHETIC_PREFIX = "random:"
REMOTE_PREFIXES = ("http://", "https://", "data:")
IMAGE_STREAM = 17  # a random stream apart from lengths and prompts
MIME = {"JPEG": "image/jpeg", "PNG": "image/png", "GIF": "image/gif", "WEBP": "image/webp",
        "BMP": "image/bmp"}


def parse_image_sizes(text: str) -> tuple[tuple[int, int], ...]:
    """'1024x768' or '512x512,1024x1024' -> ((W, H), ...); UsageError naming the flag."""
    sizes = []
    for part in text.split(","):
        m = SIZE_RE.match(part)
        if m is None:
            raise UsageError(f"--image-size {text!r}: use WxH (e.g. 1024x1024), or a comma list "
                             "of them to draw from")
        w, h = int(m.group(1)), int(m.group(2))
        if not (MIN_IMAGE_SIDE <= w <= MAX_IMAGE_SIDE and MIN_IMAGE_SIDE <= h <= MAX_IMAGE_SIDE):
            raise UsageError(f"--image-size {part.strip()}: each side must be in "
                             f"[{MIN_IMAGE_SIDE}, {MAX_IMAGE_SIDE}]")
        sizes.append((w, h))
    return tuple(sizes)


@dataclass(frozen=True)
class ImageSpec:
    """--workload random-mm's images."""

    per_request: int = DEFAULT_IMAGES_PER_REQUEST
    sizes: tuple[tuple[int, int], ...] = ((512, 512),)
    format: str = DEFAULT_IMAGE_FORMAT

    def validate(self) -> ImageSpec:
        if not 1 <= self.per_request <= MAX_IMAGES_PER_REQUEST:
            raise UsageError(f"--images-per-request must be in [1, {MAX_IMAGES_PER_REQUEST}], "
                             f"got {self.per_request}")
        if self.format not in IMAGE_FORMATS:
            raise UsageError(f"--image-format must be one of {', '.join(IMAGE_FORMATS)}, got "
                             f"{self.format!r}")
        return self

    def refs(self, num_requests: int, seed: int) -> list[tuple[str, ...]]:
        """Each request's image references, drawn from --seed."""
        out = []
        for i in range(num_requests):
            rng = np.random.default_rng([seed, IMAGE_STREAM, i])
            size_idx = rng.integers(0, len(self.sizes), self.per_request)
            pool_idx = rng.integers(0, IMAGE_POOL_SIZE, self.per_request)
            out.append(tuple(
                f"{SYNTHETIC_PREFIX}{self.sizes[s][0]}x{self.sizes[s][1]}:{p}:{self.format}"
                for s, p in zip(size_idx.tolist(), pool_idx.tolist())
            ))
        return out

    def to_config(self) -> dict:
        return {"images_per_request": self.per_request,
                "image_size": [f"{w}x{h}" for w, h in self.sizes], "image_format": self.format}


def synthetic_image(width: int, height: int, index: int, fmt: str, seed: int) -> bytes:
    """One pool image: uniform random RGB pixels, encoded."""
    rng = np.random.default_rng([seed, IMAGE_STREAM, width, height, index])
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    from PIL import Image

    buf = io.BytesIO()
    if fmt == "jpeg":
        Image.fromarray(pixels).save(buf, format="JPEG", quality=JPEG_QUALITY)
    else:
        Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def check_image_file(path: Path, where: str) -> str:
    """A workload's image file: it exists and Pillow reads it as an image; its MIME type."""
    from PIL import Image, UnidentifiedImageError

    if not path.is_file():
        raise UsageError(f"{where}: image file not found: {path}")
    try:
        with Image.open(path) as im:
            fmt = im.format or ""
            im.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError):
        raise UsageError(f"{where}: {path} is not an image file Pillow can read") from None
    return MIME.get(fmt, f"image/{fmt.lower() or 'octet-stream'}")


def parse_images(value: object, base: Path, where: str) -> tuple[str, ...]:
    """A JSONL line's ``images``: paths (checked now, made absolute) and URLs."""
    if not isinstance(value, list) or not value or not all(
            isinstance(v, str) and v for v in value):
        raise UsageError(f"{where}: 'images' must be a non-empty list of paths or URLs")
    if len(value) > MAX_IMAGES_PER_REQUEST:
        raise UsageError(f"{where}: at most {MAX_IMAGES_PER_REQUEST} images per request")
    out = []
    for v in value:
        if v.startswith(REMOTE_PREFIXES):
            out.append(v)
            continue
        path = Path(v).expanduser()
        path = path if path.is_absolute() else base / path
        check_image_file(path, where)
        out.append(str(path))
    return tuple(out)


class ImageParts:
    """Image references -> (image_url content part, encoded bytes or None), each made once."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._cache: dict[str, tuple[dict, int | None]] = {}
        self._json: dict[str, bytes] = {}

    def part(self, ref: str) -> tuple[dict, int | None]:
        got = self._cache.get(ref)
        if got is None:
            url, nbytes = self._url(ref)
            got = self._cache[ref] = ({"type": "image_url", "image_url": {"url": url}}, nbytes)
        return got

    def _url(self, ref: str) -> tuple[str, int | None]:
        if ref.startswith(SYNTHETIC_PREFIX):
            size, idx, fmt = ref[len(SYNTHETIC_PREFIX):].split(":")
            w, h = (int(x) for x in size.split("x"))
            data = synthetic_image(w, h, int(idx), fmt, self.seed)
            return data_url(data, f"image/{fmt}"), len(data)
        if ref.startswith("data:"):
            head, _, payload = ref.partition(",")
            try:
                n = len(base64.b64decode(payload)) if head.endswith(";base64") else None
            except ValueError:
                n = None
            return ref, n
        if ref.startswith(REMOTE_PREFIXES):
            return ref, None
        path = Path(ref)
        mime = check_image_file(path, "image")
        data = path.read_bytes()
        return data_url(data, mime), len(data)

    def content(self, text: str, refs: tuple[str, ...]) -> tuple[EncodedContent, int | None]:
        """A user message's content, its JSON made now: the text, then the images; and their
        bytes (None when one is a remote URL)."""
        pieces = [json.dumps({"type": "text", "text": text}, separators=(",", ":")).encode()]
        total: int | None = 0
        for ref in refs:
            pieces.append(self._part_json(ref))
            n = self.part(ref)[1]
            total = None if n is None or total is None else total + n
        return EncodedContent(b"[" + b",".join(pieces) + b"]"), total

    def _part_json(self, ref: str) -> bytes:
        got = self._json.get(ref)
        if got is None:
            got = self._json[ref] = json.dumps(self.part(ref)[0], separators=(",", ":")).encode()
        return got


@dataclass(frozen=True, slots=True)
class EncodedContent:
    """A chat message's content parts as JSON bytes, made before the run: a request body
    splices them in (json.dumps of a megabyte of base64 took ~50 ms on the 2-core machine,
    inside the send lag; the splice copies it)."""

    json: bytes


# Stands for the content in the body's JSON until the content's bytes replace it.
_MARK = "\x00cbbench-content\x00"
_MARK_JSON = json.dumps(_MARK).encode()


def image_request_body(ctx, content: EncodedContent, max_tokens: int,
                       extra: dict | None = None) -> bytes:
    """targets/request.py's request_body for a chat request whose content is pre-encoded."""
    payload = dict(ctx.payload)
    if extra:
        payload.update(extra)
    payload["messages"] = [{"role": "user", "content": _MARK}]
    payload["max_tokens"] = max_tokens
    head, tail = json.dumps(payload, separators=(",", ":")).encode().split(_MARK_JSON)
    return b"".join((head, content.json, tail))


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def attach_images(prompts: list, wreqs, seed: int) -> list[tuple[int, int | None] | None] | None:
    """Turn the prompts of requests with images into chat content parts (text, then images),
    in place, before the run's clock starts; each request's (images, image bytes), or None
    for a run without images."""
    if not any(w.images for w in wreqs):
        return None
    parts = ImageParts(seed)
    info: list[tuple[int, int | None] | None] = [None] * len(wreqs)
    for pos, w in enumerate(wreqs):
        if w.images:
            content, nbytes = parts.content(prompts[pos], w.images)
            prompts[pos] = content
            info[pos] = (len(w.images), nbytes)
    return info
