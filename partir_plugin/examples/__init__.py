"""Small runnable examples; `python -m partir_plugin.examples.demo` is the README's demo."""
