"""titan-checkpoint: export a checkpoint to Hugging Face layout, list a folder's checkpoints, verify one.

titan-checkpoint export CKPT OUT [--model llama3] [--dtype bfloat16] [--max-shard-size 50GB] [--tokenizer PATH]
titan-checkpoint import HF_DIR OUT [--dtype bfloat16]
titan-checkpoint list FOLDER
titan-checkpoint verify CKPT

Exit codes, as titan-train and titan-generate: 0 done; 2 a usage mistake (an unknown option, a bad value, a
path that does not exist), one line on stderr; 1 the checkpoint could not be used (damaged, incomplete, for
another model), one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import sys

from titan_checkpoint.errors import CheckpointCorruptError, CheckpointError
from titan_checkpoint.folder import read_meta, resolve_checkpoint, step_dir
from titan_checkpoint.hf_export import export_safetensors
from titan_checkpoint.location import as_location
from titan_checkpoint.storage import read_dcp_metadata, verify_files

EXAMPLES = """\
examples:
  titan-checkpoint list outputs/checkpoint
  titan-checkpoint verify outputs/checkpoint/step-100
  titan-checkpoint export outputs/checkpoint outputs/hf --dtype bfloat16 --tokenizer tokenizer.json
  titan-checkpoint import Llama-3.2-1B outputs/llama-3.2-1b

exit codes: 0 done, 2 a usage mistake (nothing ran), 1 the checkpoint could not be used."""

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _version() -> str:
    try:
        return f"titan-checkpoint {importlib.metadata.version('titan-checkpoint')}"
    except importlib.metadata.PackageNotFoundError:
        return "titan-checkpoint unknown (not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="titan-checkpoint",
        description=__doc__.split("\n")[0],
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)

    export = commands.add_parser("export", help="write a checkpoint's model in Hugging Face layout")
    export.add_argument("checkpoint", help="a step-<N> folder, or a checkpoint folder (its latest step)")
    export.add_argument("out", help="output folder (must be empty or absent, unless --overwrite)")
    export.add_argument("--model", help="adapter name (entry point in titan.hf_adapters); default: the checkpoint's")
    export.add_argument("--dtype", default="bfloat16", help="dtype of the written tensors (default: bfloat16)")
    export.add_argument(
        "--max-shard-size", default="50GB", help="largest file, e.g. 5GB (default: 50GB; one model.safetensors)"
    )
    export.add_argument("--tokenizer", help="tokenizer.json, or a folder of tokenizer files, to copy alongside")
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")

    hf_import = commands.add_parser("import", help="write a Hugging Face model folder as a DCP checkpoint")
    hf_import.add_argument("hf_dir", help="a Hugging Face model folder (config.json + *.safetensors)")
    hf_import.add_argument("out", help="checkpoint folder to write step-0 into (must hold no checkpoint)")
    hf_import.add_argument("--dtype", help="dtype of the written tensors (default: as stored in HF_DIR)")

    listing = commands.add_parser("list", help="the complete checkpoints of a folder")
    listing.add_argument("folder")

    verify = commands.add_parser("verify", help="check every file of a checkpoint against its sizes and CRC-32s")
    verify.add_argument("checkpoint")
    return parser


def _list(folder: str) -> None:
    from titan_checkpoint.folder import complete_steps

    if not as_location(folder).is_dir():
        raise FileNotFoundError(f"{folder} is not a folder; give a checkpoint folder (holding step-<N> folders)")
    steps = complete_steps(folder)
    if not steps:
        print(f"{folder}: no complete checkpoint")
    for step in steps:
        meta = read_meta(step_dir(folder, step))
        kind = "model only" if meta.get("model_only") else ", ".join(meta.get("contents", []))
        print(f"step-{step}\t{meta.get('time', '?')}\tworld_size={meta.get('world_size', '?')}\t{kind}")


def _verify(checkpoint: str) -> None:
    path = resolve_checkpoint(checkpoint)
    meta = read_meta(path)
    problems = verify_files(path, read_dcp_metadata(path), meta.get("files"))
    if problems:
        raise CheckpointCorruptError(f"checkpoint {path} is damaged: {'; '.join(problems)}")
    checked = "sizes and CRC-32s" if meta.get("files") else "sizes (no checksums recorded)"
    print(f"{path}: ok ({checked})")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "export":
            out = export_safetensors(
                args.checkpoint,
                args.out,
                model_name=args.model,
                dtype=args.dtype,
                max_shard_size=args.max_shard_size,
                tokenizer=args.tokenizer,
                overwrite=args.overwrite,
            )
            print(f"wrote {out}")
        elif args.command == "import":
            from titan_checkpoint.hf_convert import import_hf_checkpoint

            print(f"wrote {import_hf_checkpoint(args.hf_dir, args.out, dtype=args.dtype)}")
        elif args.command == "list":
            _list(args.folder)
        else:
            _verify(args.checkpoint)
    except (ValueError, FileNotFoundError) as e:  # a bad option value or path: the user's to fix
        print(f"titan-checkpoint {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except CheckpointError as e:
        print(f"titan-checkpoint {args.command}: error: {e}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
