"""config.py: one config path, dataclass fields that are flags with their defaults and reasons."""

import argparse
from dataclasses import dataclass

import pytest

from dali_pipes.config import LoaderConfig
from dali_pipes.options import add_arguments, count_or_fraction, from_args, option


@dataclass(frozen=True)
class Example:
    size: int = option(224, "output side")
    pair: tuple[float, float] = option((0.5, 1.0), "low high")
    name: str | None = option(None, "optional", type=str)
    on: bool = option(False, "a switch")


def test_fields_become_flags_and_come_back():
    parser = argparse.ArgumentParser()
    add_arguments(parser, Example, "example")
    args = parser.parse_args(["--size", "128", "--pair", "0.1", "0.9", "--name", "x", "--on"])
    assert from_args(Example, args) == Example(128, (0.1, 0.9), "x", True)
    assert from_args(Example, parser.parse_args([])) == Example()
    assert "output side (default: 224)" in parser.format_help()


def test_counts_and_fractions():
    assert count_or_fraction("12") == 12 and count_or_fraction("0.01") == 0.01
    with pytest.raises(argparse.ArgumentTypeError):
        count_or_fraction("1.5")


def test_every_loader_field_has_a_reason():
    parser = argparse.ArgumentParser()
    add_arguments(parser, LoaderConfig, "loader")
    assert "--num-threads" in parser.format_help() and "--remote-feed" in parser.format_help()
