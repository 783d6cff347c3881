"""model_tensor_names / read_model_tensors: a checkpoint's model tensors by name, on one process, no model built."""

import ckpt_toy
import torch
from ckpt_toy import params

from titan_checkpoint import ModelState, model_tensor_names, read_model_tensors, save_checkpoint


def test_names_and_a_subset_read_from_the_latest_or_a_given_step(tmp_path):
    first, _, _ = ckpt_toy.build(seed=7)
    later, _, _ = ckpt_toy.build(seed=8)
    save_checkpoint(tmp_path, 1, {"model": ModelState(first)})
    save_checkpoint(tmp_path, 2, {"model": ModelState(later)})
    assert model_tensor_names(tmp_path) == list(params(later))  # a folder of steps: the latest, in saved order

    def is_norm(fqn: str) -> bool:
        return fqn.endswith(".norm")

    for step, model in ((None, later), (1, first)):
        tensors = read_model_tensors(tmp_path, is_norm, step=step)
        expected = {fqn: tensor for fqn, tensor in params(model).items() if is_norm(fqn)}
        assert list(tensors) == list(expected) and all(torch.equal(tensors[k], v) for k, v in expected.items())
    assert read_model_tensors(tmp_path / "step-1", lambda fqn: False) == {}
