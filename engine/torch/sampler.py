"""Token sampling: greedy, temperature, top-k and top-p, seeded per request.

Greedy rows are one batched argmax. Random rows use the exponential-race form of categorical
sampling, ``argmax(probs / E)`` with ``E ~ Exp(1)`` per vocabulary entry. ``E`` comes from a
counter-based hash of (the request's seed, its id, its token count, the vocabulary index),
computed for the whole batch at once on the device: a request's samples depend only on itself,
never on which requests share its batch or in which order, and no per-row generator, kernel or
host loop is involved.

A client's own ``seed`` keys the noise by the seed alone, so the same seed, prompt and
parameters give the same tokens whichever request carries them and whatever shares its batch
(vLLM seeds a generator per request from it; OpenAI: repeated requests with the same seed and
parameters should return the same result). A request without one takes the run's default
seed mixed with its request id, so the requests of a run each draw their own tokens.

The model runner keeps each request's parameters in persistent per-slot tensors
(:class:`SamplingSlots`), written when the request gets its slot; a step then sends only the
sampled rows' slot indices and token counts, which travel with the step's other inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..core.request import Request

# The hash works on 32-bit values held in int64 tensors; its multiplier is below 2**31, so no
# product overflows int64 (a 32-bit value times it stays below 2**63).
MASK32 = 0xFFFFFFFF
HASH_MULTIPLIER = 0x45D9F3B
VOCAB_SALT = 0x9E3779B9
# Uniforms from the hash's top 24 bits: exact in float32, strictly inside (0, 1).
UNIFORM_BITS = 24
_UNIFORM_SHIFT = 32 - UNIFORM_BITS
_UNIFORM_SCALE = 2.0**-UNIFORM_BITS


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finalizer (xor-shift-multiply, twice): every input bit flips about
    half of the output bits."""
    x = ((x >> 16) ^ x) * HASH_MULTIPLIER & MASK32
    x = ((x >> 16) ^ x) * HASH_MULTIPLIER & MASK32
    return (x >> 16) ^ x


def seed_keys(seeds: torch.Tensor) -> torch.Tensor:
    """int64 seeds (any sign: both 32-bit halves are mixed) -> 32-bit row keys."""
    return _mix32(_mix32(seeds & MASK32) ^ ((seeds >> 32) & MASK32))


def row_keys(
    base_seeds: torch.Tensor, noise_ids: torch.Tensor, num_tokens: torch.Tensor
) -> torch.Tensor:
    """The noise key of each request's sample at its current length (all int64; only the
    seeds may be negative);
    ``noise_ids``: SamplingSlots.noise_id's."""
    k = _mix32(seed_keys(base_seeds) ^ (noise_ids & MASK32))
    return _mix32(k ^ (num_tokens & MASK32))


_VOCAB_HASH: dict[tuple[int, str], torch.Tensor] = {}


def exponential_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """float32 [N, vocab] of Exp(1) draws, a pure function of (key, vocabulary index)."""
    cache_key = (vocab, str(keys.device))
    vh = _VOCAB_HASH.get(cache_key)
    if vh is None:
        vh = _mix32(torch.arange(vocab, dtype=torch.int64, device=keys.device) ^ VOCAB_SALT)
        _VOCAB_HASH[cache_key] = vh
    bits = _mix32(keys.unsqueeze(1) ^ vh.unsqueeze(0)) >> _UNIFORM_SHIFT
    uniform = (bits.float() + 0.5) * _UNIFORM_SCALE
    return uniform.log_().neg_()


@dataclass(frozen=True)
class RowParams:
    """The sampled rows' parameters on the device, and what the host decided from them."""

    temperature: torch.Tensor | None  # float32 [N] (0 = greedy); None when every row is greedy
    top_k: torch.Tensor | None  # int64 [N] (0 = off)
    top_p: torch.Tensor | None  # float32 [N]
    keys: torch.Tensor | None  # int64 [N]
    max_top_k: int = 0  # largest top-k among random rows (0: none uses top-k)
    use_top_p: bool = False  # some random row has top-p < 1

    @property
    def any_random(self) -> bool:
        return self.temperature is not None


GREEDY_ROWS = RowParams(None, None, None, None)
# The noise id of a request with its own seed: one for every such request, so its noise is
# the seed's alone (see the module's docstring).
OWN_SEED_NOISE_ID = 0


def noise_id(req: Request) -> int:
    """What row_keys mixes with the seed: the request's id where it runs on the default seed
    (each request of a run its own draws), OWN_SEED_NOISE_ID where it brought its own seed
    (the same seed the same draws, whichever request, as vLLM's per-request generator)."""
    return int(req.request_id) if req.sampling.seed is None else OWN_SEED_NOISE_ID


class SamplingSlots:
    """Per-slot sampling parameters: host arrays (for the host's decisions) and device tensors.
    Only the slots set since the last upload are copied (a request joining its slot); a steady
    batch, or one that only loses requests (a freed slot is simply not read), copies nothing.
    ``uploads`` counts the slot rows copied so far."""

    def __init__(self, num_slots: int, device: torch.device, default_seed: int = 0) -> None:
        self.device = device
        self.default_seed = default_seed
        self.dev: dict[str, torch.Tensor] | None = None
        self.uploads = 0
        self._allocate(num_slots)

    def _allocate(self, num_slots: int) -> None:
        old = getattr(self, "host", None)
        self.host: dict[str, np.ndarray] = {
            "temperature": np.zeros(num_slots, np.float32),
            "top_k": np.zeros(num_slots, np.int64),
            "top_p": np.ones(num_slots, np.float32),
            "seed": np.zeros(num_slots, np.int64),
            "noise_id": np.zeros(num_slots, np.int64),
        }
        if old is not None:
            for name, arr in old.items():
                self.host[name][: arr.shape[0]] = arr
        self.num_slots = num_slots
        self.dev = None  # reallocated: the next upload copies every slot
        self._dirty: set[int] = set()

    def set(self, slot: int, req: Request) -> None:
        if slot >= self.num_slots:
            self._allocate(max(slot + 1, 2 * self.num_slots))
        sp = req.sampling
        h = self.host
        h["temperature"][slot] = sp.temperature
        h["top_k"][slot] = sp.top_k
        h["top_p"][slot] = sp.top_p
        h["seed"][slot] = self.default_seed if sp.seed is None else sp.seed
        h["noise_id"][slot] = noise_id(req)
        self._dirty.add(slot)

    def _device_tensors(self) -> dict[str, torch.Tensor]:
        if self.dev is None or self._dirty:
            # Ordinary tensors, not inference tensors: updatable in place whether or not the
            # caller runs under inference mode.
            with torch.inference_mode(False):
                self._upload()
        assert self.dev is not None
        return self.dev

    def _upload(self) -> None:
        if self.dev is None:
            # copy=True: on a CPU .to() would return the host array's own memory, and the
            # partial uploads below (and their tests) would be no-ops.
            self.dev = {k: torch.from_numpy(v).to(self.device, copy=True)
                        for k, v in self.host.items()}
            self.uploads += self.num_slots
        else:
            rows = np.fromiter(sorted(self._dirty), np.int64, len(self._dirty))
            index = torch.from_numpy(rows).to(self.device)
            for name, tensor in self.dev.items():
                tensor[index] = torch.from_numpy(self.host[name][rows]).to(self.device)
            self.uploads += rows.size
        self._dirty.clear()

    def rows(self, slots: np.ndarray, num_tokens: np.ndarray, to_device) -> RowParams:
        """Parameters of the sampled rows, given their slots and token counts on the host;
        ``to_device(name, array)`` puts an array on the device (the step's input buffers).
        All-greedy batches (the common case) send nothing."""
        temps = self.host["temperature"][slots]
        random = temps > 0.0
        if not random.any():
            return GREEDY_ROWS
        ks = self.host["top_k"][slots][random]
        dev = self._device_tensors()
        slots_dev = to_device("sample_slots", slots)
        keys = row_keys(
            dev["seed"][slots_dev],
            dev["noise_id"][slots_dev],
            to_device("sample_num_tokens", num_tokens),
        )
        return RowParams(
            temperature=dev["temperature"][slots_dev],
            top_k=dev["top_k"][slots_dev],
            top_p=dev["top_p"][slots_dev],
            keys=keys,
            max_top_k=int(ks.max()) if ks.size else 0,
            use_top_p=bool((self.host["top_p"][slots][random] < 1.0).any()),
        )


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    """Per-row sampling parameters as lists, one row per logits row (tests, warm-up)."""

    temperatures: list[float]
    top_ks: list[int]
    top_ps: list[float]
    seeds: list[int]  # a seed per row, int64 (ignored for greedy rows)

    def to_rows(self, device: torch.device) -> RowParams:
        random = [t > 0.0 for t in self.temperatures]
        if not any(random):
            return GREEDY_ROWS
        ks = [k for k, r in zip(self.top_ks, random, strict=True) if r]
        ps = [p for p, r in zip(self.top_ps, random, strict=True) if r]
        return RowParams(
            temperature=torch.tensor(self.temperatures, dtype=torch.float32, device=device),
            top_k=torch.tensor(self.top_ks, dtype=torch.int64, device=device),
            top_p=torch.tensor(self.top_ps, dtype=torch.float32, device=device),
            keys=seed_keys(torch.tensor(self.seeds, dtype=torch.int64, device=device)),
            max_top_k=max(ks),
            use_top_p=any(p < 1.0 for p in ps),
        )


def request_rows(reqs: Sequence[Request], default_seed: int, device) -> RowParams:
    """Parameters of one row per request (at its current length), as the runner's slots give."""
    if not any(r.sampling.temperature > 0.0 for r in reqs):
        return GREEDY_ROWS
    slots = SamplingSlots(len(reqs), torch.device(device), default_seed)
    for i, req in enumerate(reqs):
        slots.set(i, req)
    num_tokens = np.fromiter((r.num_tokens for r in reqs), np.int64, len(reqs))
    return slots.rows(
        np.arange(len(reqs)), num_tokens, lambda _, arr: torch.from_numpy(arr).to(device)
    )


class Sampler:
    def __init__(self, default_seed: int = 0) -> None:
        # Used for requests without their own seed, so a whole benchmark run is reproducible.
        self.default_seed = default_seed

    def __call__(self, logits: torch.Tensor, reqs: Sequence[Request]) -> torch.Tensor:
        """float32 logits [N, vocab], one row per request -> token ids int64 [N]."""
        return self.sample_rows(logits, request_rows(reqs, self.default_seed, logits.device))

    def sample(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        return self.sample_rows(logits, batch.to_rows(logits.device))

    def sample_rows(self, logits: torch.Tensor, rows: RowParams) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        if not rows.any_random:
            return tokens
        temps, keys = rows.temperature, rows.keys
        assert temps is not None and keys is not None  # any_random: every tensor is set
        is_random = temps > 0.0
        scaled = logits / torch.where(is_random, temps, 1.0).unsqueeze(1)
        scaled = _apply_top_k_top_p(scaled, rows, is_random)
        probs = torch.softmax(scaled, dim=-1)
        drawn = (probs / exponential_noise(keys, logits.shape[1])).argmax(dim=-1)
        return torch.where(is_random, drawn, tokens)


def _apply_top_k_top_p(logits: torch.Tensor, rows: RowParams, is_random: torch.Tensor):
    """Mask to -inf everything outside each random row's top-k, then outside its top-p
    nucleus (greedy rows are left alone: their token is the argmax of the raw logits)."""
    vocab = logits.shape[1]
    use_k = rows.max_top_k > 0
    if not (use_k or rows.use_top_p):
        return logits
    top_k, top_p = rows.top_k, rows.top_p
    assert top_k is not None and top_p is not None  # some row is random: every tensor is set
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)  # 0 = off
    if not rows.use_top_p:
        # Top-k alone needs no full sort: one top-max(k) pass gives each row's k-th value as
        # its threshold (tokens tied with it are kept too).
        max_k = min(rows.max_top_k, vocab)
        values = logits.topk(max_k, dim=-1).values  # sorted, descending
        kth = (k.clamp(max=max_k) - 1).unsqueeze(1)
        threshold = values.gather(1, kth)
        off = ((top_k <= 0) | ~is_random).unsqueeze(1)
        threshold = threshold.masked_fill(off, float("-inf"))
        return logits.masked_fill(logits < threshold, float("-inf"))
    # Ascending, as vLLM's apply_top_k_top_p: the tail's mass accumulates from its smallest
    # terms, so a row's top-p of 1.0 (off, beside a row that uses one) drops nothing.
    sorted_logits, order = logits.sort(dim=-1)
    # Below the k-th largest logit out; tokens tied with it stay (HF's TopKLogitsWarper, vLLM's
    # rule, and the top-k-only pass above: bf16 logits tie often).
    kth = sorted_logits.gather(1, (vocab - k).unsqueeze(1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    # Out while the mass at or below a token is at most 1 - p (HF's TopPLogitsWarper): the
    # token that crosses p stays, and the top token always.
    mass_to = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop = mass_to <= (1.0 - top_p).unsqueeze(1)
    drop[:, -1] = False
    drop &= is_random.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
