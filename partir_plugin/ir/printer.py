"""Print the Python IR as StableHLO in MLIR's generic form, which every op accepts."""

from __future__ import annotations

from .graph import Block, Func, Op, Value

# Attributes with a dialect prefix are discardable and go in `{...}`; the rest are properties.
_DROP = {"sdy.sharding_rule"}


class _Names:
    """SSA names (`%v0`, `%v1`, ...) in order of first appearance. A program's text is printed
    op by op (tens of thousands of them): names are given a whole operand or result list at a
    time."""

    def __init__(self):
        self.names: dict[Value, str] = {}

    def __call__(self, v: Value) -> str:
        n = self.names.get(v)
        if n is None:
            n = self.names[v] = f"%v{len(self.names)}"
        return n

    def join(self, values) -> str:
        """The names of `values`, comma-separated."""
        names = self.names
        out = []
        for v in values:
            n = names.get(v)
            if n is None:
                n = names[v] = f"%v{len(names)}"
            out.append(n)
        return ", ".join(out)


def _attr_dicts(op: Op) -> tuple[str, str]:
    """The op's properties (` <{...}>`, with its leading space) and discardable attributes
    (`{...}`), each empty where it has none."""
    if not op.attributes:
        return "", ""
    props, discardable = [], []
    for k, v in op.attributes.items():
        if k in _DROP:
            continue
        (discardable if "." in k else props).append(f"{k} = {v}")
    return (" <{" + ", ".join(props) + "}>" if props else "",
            "{" + ", ".join(discardable) + "}" if discardable else "")


def _print_block(block: Block, names: _Names, indent: str, lines: list[str], header: bool):
    if header:
        args = ", ".join(f"{names(a)}: {a.type}" for a in block.args)
        lines.append(f"{indent[:-2]}^bb0({args}):")
    for op in block.ops:
        _print_op(op, names, indent, lines)


def _print_op(op: Op, names: _Names, indent: str, lines: list[str]):
    lhs = f"{names.join(op.results)} = " if op.results else ""
    operands = names.join(op.operands)
    props, disc = _attr_dicts(op)
    in_types = ", ".join([str(v.type) for v in op.operands])
    out_types = ", ".join([str(r.type) for r in op.results])
    if len(op.results) != 1:
        out_types = f"({out_types})"
    tail = f"{' ' + disc if disc else ''} : ({in_types}) -> {out_types}"
    if not op.regions:
        lines.append(f'{indent}{lhs}"{op.name}"({operands}){props}{tail}')
        return
    lines.append(f'{indent}{lhs}"{op.name}"({operands}){props} ({{')
    for ri, region in enumerate(op.regions):
        for block in region.blocks:
            _print_block(block, names, indent + "    ", lines, header=True)
        if ri + 1 < len(op.regions):
            lines.append(f"{indent}}}, {{")
    lines.append(f"{indent}}}){tail}")


def print_func(func: Func, name: str = "main", module_attrs: str = "") -> str:
    """Print `func` as a module with one public function named `name`."""
    names = _Names()
    args = ", ".join(f"{names(a)}: {a.type}" + (
        f" {{{func.arg_attrs[i]}}}" if i in func.arg_attrs else "")
        for i, a in enumerate(func.args))
    rets = ", ".join(str(v.type) for v in func.returns)
    lines = [f"module @partir{(' attributes {' + module_attrs + '}') if module_attrs else ''} {{",
             f"  func.func public @{name}({args}) -> ({rets}) {{"]
    for op in func.ops:
        _print_op(op, names, "    ", lines)
    ret_vals = ", ".join(names(v) for v in func.returns)
    ret_types = ", ".join(str(v.type) for v in func.returns)
    lines.append(f'    "func.return"({ret_vals}) : ({ret_types}) -> ()')
    lines += ["  }", "}"]
    return "\n".join(lines) + "\n"


print_module = print_func
