"""The plugin system: the hook specs plugins implement (`hookspecs`), the pluggy manager and the
name registries built from the plugins' answers (`manager`), and lookups of cost-model objects
by name (`resolve`)."""
