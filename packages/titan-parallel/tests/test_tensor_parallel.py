"""apply_tp on a pipeline stage: the whole model's plan applies, entries for modules the stage lacks are left
out (torch would warn about each), and the stage's own layers are sharded."""

import sys
import warnings
from pathlib import Path

from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pp_toy.py beside the tests (importlib mode)

import pp_toy  # noqa: E402

from titan_parallel import apply_tp  # noqa: E402
from titan_parallel.pp.pipeline_split import build_stage_modules  # noqa: E402


def last_stage():
    blocks = [pp_toy.block_fqns()[:2], pp_toy.block_fqns()[2:]]
    (part,) = build_stage_modules(pp_toy.build_model(), blocks, [1], pp_toy.INPUT_FQNS, pp_toy.OUTPUT_FQNS)
    assert part.tok_embeddings is None
    return part


def skip_warnings(apply) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply()
    return [str(w.message) for w in caught if "tok_embeddings" in str(w.message)]


def test_stage_without_embedding_takes_the_whole_plan(one_rank_mesh):
    plain = last_stage()
    assert skip_warnings(lambda: parallelize_module(plain, one_rank_mesh, pp_toy.tp_plan(False)))  # the control
    part = last_stage()
    assert skip_warnings(lambda: apply_tp(part, one_rank_mesh, pp_toy.tp_plan(False))) == []
    assert isinstance(part.output.weight, DTensor)
    assert all(isinstance(p, DTensor) for p in part.layers["2"].parameters() if p.dim() == 2)
