"""parallelism.enable_async_tensor_parallel / async_tensor_parallel_implementation -> Layout.async_tensor_parallel:
which implementation runs where, and the error where the one asked for cannot run."""

import pytest

import titan_train.config.parallel_layout as layout_module
from titan_train.config import ConfigError, load_config, parse_argv
from titan_train.config.parallel_layout import resolve_layout

TP2 = ("--model.flavor", "debug", "--parallelism.tensor_parallel_degree", "2")
ASYNC = ("--parallelism.enable_async_tensor_parallel", "true")


def resolved(*options: str, world: int = 2):
    return resolve_layout(load_config(parse_argv(list(options))), world_size=world).async_tensor_parallel


def on_gpus(monkeypatch, gpus: int = 8):
    monkeypatch.setattr(layout_module, "device_type", lambda: "cuda")
    monkeypatch.setattr(layout_module.torch.cuda, "device_count", lambda: gpus)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def test_off_by_default_and_without_tensor_parallel():
    assert resolved(*TP2) is None
    assert resolved("--model.flavor", "debug", *ASYNC, world=1) is None


def test_auto_is_titan_on_cpu():
    assert resolved(*TP2, *ASYNC) == "titan"


@pytest.mark.parametrize("implementation", ["auto", "titan"])
def test_titan_inside_compiled_blocks_is_titan_with_a_note(implementation, caplog):
    with caplog.at_level("INFO", logger="titan"):
        chosen = resolved(*TP2, *ASYNC, "--compile.enable", "true",
                          "--parallelism.async_tensor_parallel_implementation", implementation)  # fmt: skip
    assert chosen == "titan"
    assert "compiles in pieces" in caplog.text
    assert ("needs CUDA GPUs" in caplog.text) == (implementation == "auto")


def test_auto_is_symmetric_memory_on_gpus_with_inductor(monkeypatch):
    on_gpus(monkeypatch)
    assert resolved(*TP2, *ASYNC, "--compile.enable", "true") == "symmetric_memory"
    assert resolved(*TP2, *ASYNC) == "titan"  # eager: the inductor pass has nothing to rewrite


@pytest.mark.parametrize(
    "gpus, options, requirement",
    [
        (0, (), "needs CUDA GPUs"),
        (8, (), "inductor backend"),
        (8, ("--compile.enable", "true", "--compile.backend", "aot_eager"), "inductor backend"),
        (1, ("--compile.enable", "true"), "must fit on one node (1 GPUs here)"),
    ],
)
def test_symmetric_memory_where_it_cannot_run_names_the_requirement(monkeypatch, gpus, options, requirement):
    if gpus:
        on_gpus(monkeypatch, gpus)
    asked = ("--parallelism.async_tensor_parallel_implementation", "symmetric_memory")
    with pytest.raises(ConfigError) as error:
        resolved(*TP2, *ASYNC, *asked, *options)
    message = str(error.value)
    assert "parallelism.async_tensor_parallel_implementation='symmetric_memory'" in message
    assert requirement in message and "'titan'" in message


def test_unknown_implementation_is_a_config_error():
    with pytest.raises(ConfigError, match="async_tensor_parallel_implementation"):
        resolved(*TP2, *ASYNC, "--parallelism.async_tensor_parallel_implementation", "nccl")
