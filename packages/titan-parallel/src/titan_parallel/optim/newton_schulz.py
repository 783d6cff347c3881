"""The Newton-Schulz orthogonalization of Muon, for one matrix or a stack of them (experts).

On one matrix it runs torch.optim.Muon's very operations in the same order (`torch.optim._muon`, Keller
Jordan's quintic iteration), so the result is bit for bit torch's. A stack (`[experts, rows, cols]`) runs the
same iteration batched: each matrix is orthogonalized alone, as if it were the only one.
"""

import torch

# Keller Jordan's coefficients and steps (https://kellerjordan.github.io/posts/muon/), torch's defaults.
NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def orthogonalize(
    matrix: torch.Tensor,
    coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
    steps: int = NS_STEPS,
    eps: float = NS_EPS,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """U S' V^T with S' ~ 1 for `matrix` = U S V^T (the last two dims; any leading dims are a batch), in
    `dtype`. bfloat16, torch's choice: the iteration tolerates its rounding and runs at the matmul units' rate."""
    if matrix.ndim not in (2, 3):
        raise ValueError(f"orthogonalize takes a matrix or a stack of matrices; got shape {tuple(matrix.shape)}")
    if steps >= 100:
        raise ValueError(f"steps={steps}: use fewer than 100 (torch.optim.Muon's bound)")
    a, b, c = coefficients
    x = matrix.to(dtype)
    # Iterate on the wide side: the Gram matrix x x^T is then the smaller one.
    tall = matrix.size(-2) > matrix.size(-1)
    if tall:
        x = x.mT
    # The Frobenius norm bounds the spectral norm: after this every singular value is at most 1.
    if x.ndim == 2:
        x = x / x.norm().clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.T
            x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    else:
        x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.mT
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x
