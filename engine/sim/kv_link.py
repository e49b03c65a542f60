"""The links a disaggregated deployment moves KV over, from its prefill to its decode
instances (``--kv-link NAME``).

Bandwidth is per GPU per direction: each GPU of a tensor-parallel instance sends its own
shard of the KV over its own link (NVLink port, PCIe slot, or the NIC it is paired with, as
in a DGX H100's one 400 Gb/s NIC per GPU), so an instance of tp GPUs moves tp times that. The
latency is the fixed cost of one transfer (setup and completion notification), of the order
NCCL and NIXL report for a small message; it is an assumption, not measured here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

GB = 1e9
US = 1e-6


@dataclass(frozen=True)
class KVLink:
    name: str
    bandwidth: float  # bytes/s per GPU per direction
    latency_s: float  # per transfer
    what: str

    def transfer_s(self, nbytes: float, num_gpus: int = 1) -> float:
        """One request's KV (``nbytes`` over the whole instance) over ``num_gpus`` links."""
        return self.latency_s + nbytes / (self.bandwidth * num_gpus)

    def to_dict(self) -> dict:
        return asdict(self)


KV_LINKS: dict[str, KVLink] = {
    link.name: link
    for link in (
        KVLink("nvlink", 450 * GB, 10 * US, "NVLink 4 within a node (H100/H200 SXM)"),
        KVLink("pcie", 64 * GB, 10 * US, "PCIe Gen5 x16 (through host memory or P2P)"),
        KVLink("infiniband", 50 * GB, 5 * US, "InfiniBand NDR 400 Gb/s, one NIC per GPU"),
        KVLink("roce", 50 * GB, 10 * US, "RoCE v2 400 GbE, one NIC per GPU"),
    )
}


def get_kv_link(name: str) -> KVLink:
    key = name.lower()
    if key not in KV_LINKS:
        raise ValueError(f"unknown KV link {name!r}: choose one of {', '.join(KV_LINKS)}")
    return KV_LINKS[key]


def parse_disaggregate(text: str) -> tuple[int, int]:
    """'P:D' -> (prefill instances, decode instances), each at least 1."""
    p, sep, d = text.partition(":")
    try:
        if not sep:
            raise ValueError
        num_p, num_d = int(p), int(d)
    except ValueError:
        raise ValueError(f"--disaggregate {text!r}: use P:D, e.g. 1:1 or 2:3") from None
    if num_p < 1 or num_d < 1:
        raise ValueError(f"--disaggregate {text}: both pools need at least one instance "
                         f"(got {num_p} prefill, {num_d} decode)")
    return num_p, num_d
