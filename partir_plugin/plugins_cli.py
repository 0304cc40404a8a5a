"""`partir plugins`: list loaded plugins and what they contribute."""

from __future__ import annotations


def add_arguments(parser) -> None:
    del parser


def run(args) -> int:
    from . import kernel

    for name, module in kernel.loaded_plugins():
        print(f"{name:24s} {module}")
    print("tactics:    ", ", ".join(sorted(kernel.tactic_factories())) or "-")
    print("hardware:   ", ", ".join(sorted(kernel.hardware_specs())) or "-")
    print("simulators: ", ", ".join(sorted(kernel.simulators())) or "-")
    print("searchers:  ", ", ".join(sorted(kernel.searchers())) or "-")
    return 0
