"""How `total` rows cut into `parts`: the sizes torch.tensor_split gives, the first `total % parts` one larger.
Shared by async TP's chunks and expert parallel's balanced stand-in for routing, which must agree with it."""


def near_equal_sizes(total: int, parts: int) -> list[int]:
    base, larger = divmod(total, parts)
    return [base + 1 if i < larger else base for i in range(parts)]
