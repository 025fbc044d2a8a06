r"""The ``fbo-torch`` command line."""

from __future__ import annotations

import argparse
import sys

import fbo_torch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fbo-torch",
        description="Federated Bayesian optimization (FTS, DP-FTS-DE) on PyTorch/BoTorch.",
    )
    parser.add_argument("--version", action="version", version=f"fbo_torch {fbo_torch.__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
