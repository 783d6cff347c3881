"""MXFP4 tensors of a Hugging Face folder (the published GPT-OSS checkpoints' experts), dequantized on import.

Such a folder holds, instead of a tensor X [experts, in, out], the pair X_blocks (uint8 [experts, out, in / 32, 16]:
groups of 32 FP4 e2m1 values along `in`, two per byte, low nibble first) and X_scales (uint8 [experts, out, in / 32]:
each group's power of two, biased by 127). The OCP Microscaling spec defines the format; transformers'
integrations.mxfp4.convert_moe_packed_tensors is the reference this code equals bit for bit: the same table, the same
ldexp, the same transpose to Hugging Face's unquantized layout. Every FP4 value times a power of two in [2^-127, 2^128]
is exact in bf16 as in fp32 (or overflows in both), so the dtype only sets the memory.

Nothing is quantized back: an export writes the model's tensors in its dtype.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import torch

from titan_checkpoint.errors import CheckpointMismatchError

BLOCKS, SCALES = "_blocks", "_scales"
# The 16 FP4 e2m1 values by their 4-bit code: sign bit, then 2 exponent bits and 1 mantissa bit.
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
SCALE_BIAS = 127


def mxfp4_pairs(keys: Iterable[str], needed: Collection[str] | None, where: str) -> dict[str, tuple[str, str]]:
    """{X: (X_blocks, X_scales)} for each X stored as an MXFP4 pair among `keys` rather than under its own name.

    needed: the keys the adapter reads (its hf_keys()); a pair is recognised only for one of them, so a tensor that
    merely ends in _blocks keeps its name. None (an adapter that does not list them): any complete pair. Half a
    pair of a needed key is refused, naming the missing half; `where` (the folder) starts the error."""
    keys = set(keys)
    pairs = {}
    for key in sorted(keys):
        for own, other in ((BLOCKS, SCALES), (SCALES, BLOCKS)):
            if not key.endswith(own):
                continue
            name = key.removesuffix(own)
            if name in keys or (needed is not None and name not in needed):
                continue
            if name + other in keys:
                pairs[name] = (name + BLOCKS, name + SCALES)
            elif needed is not None:
                raise CheckpointMismatchError(
                    f"{where} holds {key} but not {name + other}: the MXFP4 tensor {name} needs both (blocks: the "
                    "FP4 values, scales: their powers of two); the folder is incomplete, download it again"
                )
    return pairs


@torch.no_grad()
def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32, rows_per_chunk: int = 4096
) -> torch.Tensor:
    """MXFP4 blocks [experts, rows, groups, bytes] and scales [experts, rows, groups] as the tensor Hugging Face
    stores unquantized: [experts, groups * bytes * 2, rows] in `dtype`. Written into the result `rows_per_chunk`
    rows of one expert at a time, so the temporaries stay small beside a 120B layer's experts."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, not {blocks.dtype} and {scales.dtype}")
    if blocks.dim() != 4 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(
            f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not pair: blocks are "
            "[experts, rows, groups, bytes], scales [experts, rows, groups]"
        )
    experts, rows, groups, nbytes = blocks.shape
    table = torch.tensor(FP4_E2M1, dtype=dtype)
    # Byte b -> (its low nibble's value, its high one's): one lookup per byte instead of one per nibble.
    by_byte = torch.stack((table.repeat(16), table.repeat_interleave(16)), dim=-1)
    out = torch.empty(experts, groups * nbytes * 2, rows, dtype=dtype)
    for expert in range(experts):
        for start in range(0, rows, rows_per_chunk):
            end = min(start + rows_per_chunk, rows)
            packed = blocks[expert, start:end].reshape(-1).int()
            values = torch.index_select(by_byte, 0, packed).view(end - start, groups, nbytes * 2)
            # ldexp, not a multiplication by 2^(s - 127): scale 255 times 0.5 is 2^127, where 2^128 alone is inf.
            torch.ldexp(values, scales[expert, start:end].int().unsqueeze(-1) - SCALE_BIAS, out=values)
            out[expert, :, start:end] = values.view(end - start, -1).t()
    return out
