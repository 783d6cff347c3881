import re

import pytest

from titan_train.cli.train import main
from titan_train.config import (
    ConfigError,
    JobConfig,
    build_config,
    help_text,
    load_config,
    parse_argv,
    read_toml,
    to_toml,
)
from titan_train.config.docs import field_docs
from titan_train.config.parallel_layout import resolve_layout
from titan_train.config.sections import Training


def cli(*argv: str) -> JobConfig:
    return load_config(parse_argv(list(argv)))


def test_overrides_are_typed():
    config = cli(
        "--training.steps",
        "7",
        "--optimizer.lr=3e-4",
        "--training.deterministic",
        "true",
        "--lr_scheduler.decay_type",
        "cosine",
    )
    assert config.training.steps == 7
    assert config.optimizer.lr == 3e-4
    assert config.training.deterministic is True
    assert config.lr_scheduler.decay_type == "cosine"


def test_bare_boolean_flag_means_true():
    assert cli("--training.deterministic", "--training.steps", "3").training.deterministic is True


def test_unknown_key_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"unknown config key 'training.step'; did you mean 'training.steps'\?"):
        cli("--training.step", "10")


def test_unknown_section_suggests_the_close_one():
    with pytest.raises(ConfigError, match=r"unknown config section \[trainig\]; did you mean 'training'\?"):
        cli("--trainig.steps", "10")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--training.steps", "ten"], "training.steps='ten' must be an integer"),
        (["--training.steps", "2.5"], "training.steps='2.5' must be an integer"),
        (["--optimizer.lr", "fast"], "optimizer.lr='fast' must be a number"),
        (["--training.deterministic", "yes"], "training.deterministic='yes' must be a boolean: true or false"),
        (
            ["--lr_scheduler.decay_type", "cosin"],
            r"lr_scheduler.decay_type='cosin' is not allowed; use one of "
            r"'linear', 'cosine', 'sqrt', 'constant'; did you mean 'cosine'\?",
        ),
        (["--training.steps", "0"], r"training.steps=0 must be >= 1"),
        (["--optimizer.beta2", "1.0"], r"optimizer.beta2=1.0 must be in \[0, 1\)"),
        (["--lr_scheduler.min_lr_factor", "2"], r"lr_scheduler.min_lr_factor=2.0 must be in \[0, 1\]"),
        (["--parallelism.tensor_parallel_degree", "0"], "parallelism.tensor_parallel_degree=0 must be >= 1"),
        (["--model.flavor", "debugg"], r"model.flavor: .*did you mean 'debug'"),
        (["--model.name", "lama3"], r"model.name: .*did you mean 'llama3'"),
        (["--training.steps"], "--training.steps needs a value"),
        (["stray"], "unexpected argument 'stray'"),
        (["--training.dataset", "c4"], "training.dataset='c4'"),
        (["--checkpoint.export_safetensors", "true"], "checkpoint.export_safetensors=true .* checkpoint.enable=false"),
        (["--training.dataset", "text"], "training.dataset_path"),
        (["--model.tokenizer_path", "/no/such/tokenizer.json"], "model.tokenizer_path='/no/such/tokenizer.json'"),
    ],
)
def test_bad_values_name_the_field(argv, message):
    with pytest.raises(ConfigError, match=message):
        cli(*argv)


def test_toml_type_errors_name_the_field(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[training]\nsteps = "many"\n')
    with pytest.raises(ConfigError, match="training.steps='many' must be an integer"):
        cli("--config", str(recipe))
    recipe.write_text("[training]\nsetps = 3\n")
    with pytest.raises(
        ConfigError, match=r"r.toml: unknown config key 'training.setps'; did you mean 'training.steps'"
    ):
        cli("--config", str(recipe))


def test_extends_merges_and_command_line_wins(tmp_path):
    (tmp_path / "base.toml").write_text('[training]\nsteps = 100\nseq_len = 64\n[job]\nname = "base"\n')
    (tmp_path / "child.toml").write_text('extends = "base.toml"\n[training]\nsteps = 20\n')
    config = cli("--config", str(tmp_path / "child.toml"), "--training.seq_len", "32")
    assert (config.training.steps, config.training.seq_len, config.job.name) == (20, 32, "base")


def test_extends_cycle_and_missing_files_are_errors(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(ConfigError, match="extend each other in a cycle"):
        read_toml(tmp_path / "a.toml")
    with pytest.raises(ConfigError, match="does not exist"):
        read_toml(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[training\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        read_toml(tmp_path / "bad.toml")


def test_print_config_round_trips(tmp_path):
    config = cli("--training.steps", "9", "--job.description", 'a "quoted" run', "--training.deterministic", "true")
    (tmp_path / "printed.toml").write_text(to_toml(config))
    assert build_config(read_toml(tmp_path / "printed.toml")) == config


def test_help_shows_every_field_with_its_doc():
    text = help_text()
    assert "--training.local_batch_size int  (default: 8)" in text
    assert field_docs(Training)["local_batch_size"] in text
    assert "--lr_scheduler.decay_type linear|cosine|sqrt|constant" in text


def test_every_field_is_documented():
    import dataclasses

    for section in dataclasses.fields(JobConfig):
        docs = field_docs(section.type)
        missing = [f.name for f in dataclasses.fields(section.type) if not docs.get(f.name)]
        assert not missing, f"[{section.name}] fields without a doc string: {missing}"


def test_global_batch_must_be_a_multiple():
    config = cli("--training.local_batch_size", "4", "--training.global_batch_size", "10")
    with pytest.raises(
        ConfigError, match="training.global_batch_size=10 is not a multiple of .* = 4; use a multiple of 4"
    ):
        resolve_layout(config, world_size=1)
    assert (
        resolve_layout(
            cli("--training.local_batch_size", "4", "--training.global_batch_size", "12"), 1
        ).accumulation_steps
        == 3
    )


@pytest.mark.parametrize(
    "options, world, message",
    [
        (["--parallelism.tensor_parallel_degree", "2"], 3,
         "^world size 3 is not divisible by parallelism.data_parallel_replicate_degree=1 x parallelism."
         "context_parallel_degree=1 x parallelism.tensor_parallel_degree=2 x parallelism.pipeline_parallel_degree=1 "
         r"= 2, so parallelism.data_parallel_shard_degree=-1 has no whole value; .*\(its divisors: 1, 3\)$"),
        (["--parallelism.data_parallel_shard_degree", "3"], 4,
         "^parallelism.data_parallel_replicate_degree=1 x parallelism.data_parallel_shard_degree=3 x .* = 3, but the "
         "world size is 4; .* set parallelism.data_parallel_shard_degree=-1 .* or launch 3 processes$"),
        (["--parallelism.context_parallel_degree", "2", "--model.name", "hyena"], 2,
         "model.name='hyena' has no attention"),
        (["--parallelism.context_parallel_degree", "2", "--training.seq_len", "50"], 2,
         "training.seq_len=50 is not divisible by 2 x parallelism.context_parallel_degree = 4"),
        (["--parallelism.tensor_parallel_degree", "4", "--model.flavor", "tiny"], 4,
         r"parallelism.tensor_parallel_degree=4 does not divide n_kv_heads=2 \(model.flavor='tiny'\); use 1 or 2"),
        (["--parallelism.tensor_parallel_degree", "3", "--model.flavor", "debug"], 3,
         r"parallelism.tensor_parallel_degree=3 does not divide n_heads=16 \(model.flavor='debug'\); use 1, 2, 4, "
         "8 or 16"),
        # A degree that cannot fit the model is reported as such, even when the world size does not fit either.
        (["--parallelism.tensor_parallel_degree", "3", "--model.flavor", "debug"], 4,
         r"^parallelism.tensor_parallel_degree=3 does not divide n_heads=16 \(model.flavor='debug'\)"),
        (["--parallelism.context_parallel_degree", "2", "--training.seq_len", "50"], 3,
         "^training.seq_len=50 is not divisible by 2 x parallelism.context_parallel_degree"),
        (["--parallelism.simple_fsdp_overlap", "bucket", "--parallelism.fsdp_implementation", "simple_fsdp"], 2,
         "simple_fsdp_overlap='bucket' .* needs .* compile.enable=true"),
        (["--parallelism.simple_fsdp_overlap", "bucket_reorder", "--parallelism.fsdp_implementation", "simple_fsdp",
          "--compile.enable", "true", "--training.deterministic", "true"], 2,
         "simple_fsdp_overlap='bucket_reorder' with training.deterministic=true: inductor skips its .* reordering"),
        (["--parallelism.fsdp_implementation", "simple_fsdp", "--float8.enable", "true"], 2,
         "float8.enable=true is not supported with parallelism.fsdp_implementation='simple_fsdp'"),
        (["--parallelism.fsdp_implementation", "simple_fsdp", "--compile.enable", "true",
          "--activation_checkpoint.mode", "full"], 2, "checkpoints whole blocks, which torch .* simple_fsdp"),
        (["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "every2"], 2,
         "activation_checkpoint.selective_ac_option='every2' is not supported; use 'op' .* or a positive integer"),
    ],
)  # fmt: skip
def test_unequal_layouts_fail_before_any_process_group(options, world, message):
    with pytest.raises(ConfigError, match=message):
        resolve_layout(cli(*options), world_size=world)


@pytest.mark.parametrize("ac", [["full"], ["selective", "--activation_checkpoint.selective_ac_option", "2"]])
def test_whole_block_ac_with_tp_and_compile_is_refused_with_the_workaround(ac):
    config = cli("--parallelism.tensor_parallel_degree", "2", "--compile.enable", "true",
                 "--activation_checkpoint.mode", *ac)  # fmt: skip
    with pytest.raises(ConfigError, match="use activation_checkpoint.mode='selective' with selective_ac_option='op'"):
        resolve_layout(config, world_size=2)
    config.activation_checkpoint.mode, config.activation_checkpoint.selective_ac_option = "selective", "op"
    assert resolve_layout(config, world_size=2).dims.tp == 2


PP2 = ("--parallelism.pipeline_parallel_degree", "2", "--model.flavor", "debug")  # debug: 6 blocks


@pytest.mark.parametrize(
    "options, message",
    [
        (["--parallelism.pipeline_parallel_schedule", "1f1x"],
         "pipeline_parallel_schedule='1f1x' is unknown; use one of GPipe, 1F1B, Interleaved1F1B, "
         "InterleavedZeroBubble, ZBVZeroBubble, DualPipeV"),
        (["--parallelism.pipeline_parallel_layers_per_stage", "1", "--parallelism.pipeline_parallel_schedule",
          "Interleaved1F1B"], "makes 8 stages .* but the model has 6 blocks"),
        (["--training.local_batch_size", "3", "--parallelism.pipeline_parallel_microbatch_size", "2"],
         r"local_batch_size=3 is not divisible by .*microbatch_size=2; use a microbatch size in \[1, 3\]"),
        (["--training.local_batch_size", "1"], "'1F1B' needs at least 2 microbatches"),
        (["--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble", "--compile.enable", "true"],
         "'ZBVZeroBubble' splits backward .* turn off compile.enable "),
        (["--parallelism.pipeline_parallel_schedule", "InterleavedZeroBubble", "--activation_checkpoint.mode",
          "selective"], r"per-op selective activation checkpointing \(activation_checkpoint.selective_ac_option='op'\) "
                        "allows one"),
        (["--parallelism.pipeline_parallel_stage_blocks", "layers.0 layers.1,layers.3 layers.2 layers.4 layers.5"],
         "pipeline_parallel_stage_blocks must list every block once, in model order .* out of order"),
        (["--parallelism.pipeline_parallel_stage_blocks", "layers.0,layers.1", "--parallelism."
          "pipeline_parallel_layers_per_stage", "2"], "set only one"),
    ],
)  # fmt: skip
def test_pipeline_errors_name_the_setting_before_any_process_group(options, message):
    with pytest.raises(ConfigError, match=message):
        resolve_layout(cli(*PP2, "--training.local_batch_size", "2", *options), world_size=2)


def test_pipeline_splits():
    def stages(*options):
        return resolve_layout(cli(*PP2, "--training.local_batch_size", "4", *options), 2).pipeline.stage_blocks

    # Embedding and output count as a block each: 6 blocks + 2 over 2 stages is 3 + 3, over 4 stages 1+2+2+1.
    assert [len(s) for s in stages()] == [3, 3]
    assert [len(s) for s in stages("--parallelism.pipeline_parallel_schedule", "Interleaved1F1B")] == [1, 2, 2, 1]
    interleaved_2_per_stage = ("--parallelism.pipeline_parallel_schedule", "Interleaved1F1B",
                               "--parallelism.pipeline_parallel_layers_per_stage", "2")  # fmt: skip
    assert [len(s) for s in stages(*interleaved_2_per_stage)] == [1, 2, 2, 1]
    explicit = stages("--parallelism.pipeline_parallel_stage_blocks", "layers.0,layers.1 layers.2 layers.3 layers.4 "
                      "layers.5")  # fmt: skip
    assert explicit == [["layers.0"], ["layers.1", "layers.2", "layers.3", "layers.4", "layers.5"]]
    pipeline = resolve_layout(cli(*PP2, "--training.local_batch_size", "4"), 2).pipeline
    assert pipeline.n_microbatches == 4 and pipeline.schedule == "1F1B"
    assert resolve_layout(cli("--model.flavor", "debug"), 1).pipeline is None


def test_layout_product_must_match_world_size():
    with pytest.raises(ConfigError, match="= 2, but the world size is 1"):
        resolve_layout(
            cli("--parallelism.tensor_parallel_degree", "2", "--parallelism.data_parallel_shard_degree", "1"), 1
        )


@pytest.mark.parametrize(
    "options, message",
    [
        (["--parallelism.pipeline_parallel_schedule", "1F1b_typo"],
         "^parallelism.pipeline_parallel_schedule='1F1b_typo' is unknown; use one of GPipe, 1F1B, "),
        (["--activation_checkpoint.selective_ac_option", "every2"],
         "^activation_checkpoint.selective_ac_option='every2' is not supported; use 'op'"),
        (["--parallelism.pipeline_parallel_layers_per_stage", "-1"],
         "^parallelism.pipeline_parallel_layers_per_stage=-1 must be >= 1, or 0"),
    ],
)  # fmt: skip
def test_a_wrong_value_is_an_error_while_its_feature_is_off(options, message):
    # pipeline_parallel_degree = 1 and activation_checkpoint.mode = "none" (the defaults): the values are unused.
    with pytest.raises(ConfigError, match=message):
        cli(*options)


def test_no_error_speaks_in_library_abbreviations():
    abbreviations = re.compile(r"(?<![\w.])(tp|pp|cp|dp_shard|dp_replicate|schedule|pp_degree)=")
    failing = [
        (["--parallelism.tensor_parallel_degree", "2"], 3),
        (["--parallelism.data_parallel_shard_degree", "3", "--parallelism.context_parallel_degree", "2"], 4),
        (["--parallelism.pipeline_parallel_degree", "2", "--training.local_batch_size", "1"], 2),
        (["--parallelism.pipeline_parallel_degree", "3", "--parallelism.pipeline_parallel_layers_per_stage", "5"], 3),
    ]
    for options, world in failing:
        with pytest.raises(ConfigError) as error:
            resolve_layout(cli(*options), world_size=world)
        assert not abbreviations.search(str(error.value)), str(error.value)


def test_cli_reports_config_errors_before_any_work(capsys):
    assert main(["--training.stepz", "3"]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and "did you mean 'training.steps'" in err


def test_cli_print_config(capsys):
    assert main(["--training.steps", "3", "--print-config"]) == 0
    assert "steps = 3" in capsys.readouterr().out


def test_a_tokenizer_larger_than_the_flavors_vocabulary_is_refused_before_any_work(tmp_path):
    from tokenizers import Tokenizer, models

    vocab = {"<s>": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(3000)}}  # 3002 tokens > tiny's 2048
    Tokenizer(models.WordLevel(vocab, unk_token="w0")).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ConfigError, match=r"the tokenizer has 3002 tokens but model.flavor='tiny' has vocab_size=2048"):
        cli("--model.flavor", "tiny", "--model.tokenizer_path", str(tmp_path / "tokenizer.json"))
