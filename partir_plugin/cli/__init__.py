"""The `partir` command line (`main`) and the kernel's own subcommands beside it."""
