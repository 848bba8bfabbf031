"""The GPU check's PyTorch loop (run by scripts/gpu-check.sh on a GPU machine).

A feed on cuda:0 is read the way a training loop on its own stream reads it:
every batch's tensors are cloned on a side stream *after* a spin of ~20 ms
queued on that stream, and the batch is dropped at once, long before the
clone runs. The feed must not reuse the batch's memory before the clone has
read it (the release wait). The clones are then compared byte for byte with
the same feed on the CPU. Two passes: format='torch' inside
``torch.cuda.stream(side)`` (the stream torch names through DLPack), and
format='dlpack' with ``Tensor.use_on_stream(side)`` while torch imports on
its default stream.

Usage: python3 gpu_torch_check.py DATA_GLOB [ROWS]
Prints one line per pass; exits 1 on any mismatch, naming the pass, batch,
tensor, how many elements differ and the first that does.
"""

from __future__ import annotations

import sys

import torch

import sqlfeed


def main() -> int:
    data, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    query = (
        "SELECT arrow_cast(make_array(f0, f1, f2, f3, f4, f5, f6, f7), "
        "'FixedSizeList(8, Float32)') AS x, label AS y, "
        f"image_to_tensor(image_decode(image_png)) AS img FROM '{data}' WHERE id < {rows}"
    )
    # Same-size batches (drop_last) and two slots (prefetch=1): the feed
    # writes the very buffer a late reader reads, the deterministic form of
    # a missing release wait.
    options = dict(batch_size=256, drop_last=True, shuffle=5, prefetch=1)
    session = sqlfeed.Session()
    expected = [
        {name: t.clone() for name, t in batch.items()}
        for batch in session.feed(query, device="cpu", format="torch", **options)
    ]
    side = torch.cuda.Stream()
    spin = 30_000_000  # cycles: ~20 ms at H200 clocks

    def late_clone(tensors: dict) -> dict:
        with torch.cuda.stream(side):
            torch.cuda._sleep(spin)
            return {name: t.clone() for name, t in tensors.items()}

    passes = {}
    read = []
    with torch.cuda.stream(side):
        for batch in session.feed(query, device="cuda:0", format="torch", **options):
            read.append(late_clone(batch))
            del batch
    passes["torch, stream named by torch"] = read

    read = []
    for batch in session.feed(query, device="cuda:0", format="dlpack", **options):
        tensors = {}
        for name, tensor in batch.items():
            tensor.use_on_stream(side)
            tensors[name] = torch.from_dlpack(tensor)
        read.append(late_clone(tensors))
        del batch, tensors
    passes["dlpack, use_on_stream"] = read

    torch.cuda.synchronize()
    failed = False
    for name, got in passes.items():
        problems = compare(expected, got)
        print(f"torch loop ({name}): {len(got)} batches, " + ("equal" if not problems else "MISMATCH"))
        for problem in problems[:5]:
            print(f"  {problem}")
        failed |= bool(problems)
    return 1 if failed else 0


def compare(expected: list[dict], got: list[dict]) -> list[str]:
    """Per differing tensor: how many elements differ and the first one."""
    if len(expected) != len(got):
        return [f"{len(got)} batches, the CPU feed gave {len(expected)}"]
    problems = []
    for step, (want, have) in enumerate(zip(expected, got)):
        for name, tensor in want.items():
            other = have[name].cpu()
            differ = (other != tensor).reshape(-1)
            count = int(differ.sum())
            if count:
                first = int(differ.nonzero()[0])
                problems.append(
                    f"batch {step} '{name}': {count} of {differ.numel()} elements differ, "
                    f"the first at {first} (read {other.reshape(-1)[first].item()}, "
                    f"the CPU feed has {tensor.reshape(-1)[first].item()})"
                )
    return problems


if __name__ == "__main__":
    sys.exit(main())
