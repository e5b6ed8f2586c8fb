"""A tiny transformer block whose attention backend is chosen: see which SDPA kernel ran.

    python examples/attention.py --sdpa-backend math --profile math.json
    python examples/attention.py --sdpa-backend flash --profile flash.json
    rankscope run --nproc-per-node 1 --record-shapes examples/attention.py --sdpa-backend math

``--sdpa-backend`` restricts ``torch.nn.functional.scaled_dot_product_attention`` with
``torch.nn.attention.sdpa_kernel``: ``math`` forces the unfused math fallback, ``flash`` the
flash kernel (on CPU: ``aten::_scaled_dot_product_flash_attention_for_cpu``), ``auto`` lets torch
choose. ``--profile OUT.json`` profiles the steps with a plain ``torch.profiler`` in this one
process (CPU, and CUDA when there is a GPU; ``record_shapes=True``) and writes one Chrome trace,
which ``rankscope merge OUT.json`` takes as rank 0; ``--key-averages OUT.json`` also writes
``prof.key_averages()`` of that same run (count, self and total CPU and device time in µs per
op, and per op and input shapes) for comparing rankscope's op table with torch's own. Under
``rankscope run`` the rank runtime profiles the optimizer steps instead (no ``--profile``); a
process group is started only when torchrun's environment is there.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "auto": None,
    "math": [SDPBackend.MATH],
    "flash": [SDPBackend.FLASH_ATTENTION],
}


class Block(nn.Module):
    """Pre-norm self-attention + MLP, attention through ``scaled_dot_product_attention``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--sdpa-backend", choices=sorted(BACKENDS), default="auto")
    p.add_argument("--steps", type=int, default=6, help="training steps")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq", type=int, default=128, help="sequence length")
    p.add_argument("--dim", type=int, default=128, help="model width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--profile", metavar="OUT.json", help="profile here, write one Chrome trace")
    p.add_argument("--key-averages", metavar="OUT.json", help="with --profile: torch's table")
    return p.parse_args(argv)


def key_averages_rows(prof: torch.profiler.profile, by_shape: bool) -> list[dict[str, object]]:
    """``prof.key_averages()`` as plain rows (µs, as torch reports them)."""
    rows = []
    for e in prof.key_averages(group_by_input_shape=by_shape):
        rows.append(
            {
                "name": e.key,
                "shapes": str(e.input_shapes) if by_shape else "",
                "count": e.count,
                "self_cpu_us": e.self_cpu_time_total,
                "cpu_total_us": e.cpu_time_total,
                "self_device_us": e.self_device_time_total,
                "device_total_us": e.device_time_total,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    cuda = torch.cuda.is_available()
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("nccl" if cuda else "gloo")
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = Block(args.dim, args.heads).to(device=device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch_size, args.seq, args.dim, device=device, dtype=dtype)
    prof = None
    if args.profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities, record_shapes=True)
    backends = BACKENDS[args.sdpa_backend]
    with sdpa_kernel(backends) if backends else _nothing():
        model(x).float().pow(2).mean().backward()  # warm-up, not profiled
        opt.zero_grad(set_to_none=True)
        if prof is not None:
            prof.start()
        for _ in range(args.steps):
            loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        if prof is not None:
            prof.stop()
    if prof is not None:
        out = Path(args.profile)
        out.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out))
        if args.key_averages:
            table = {
                "ops": key_averages_rows(prof, by_shape=False),
                "ops_by_shape": key_averages_rows(prof, by_shape=True),
            }
            Path(args.key_averages).write_text(json.dumps(table, indent=1))
    print(
        f"attention: {args.steps} steps, sdpa backend {args.sdpa_backend}, loss {loss.item():.4f}"
    )
    if distributed:
        import torch.distributed as dist

        dist.destroy_process_group()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
