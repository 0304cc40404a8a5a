"""Built-in plugins, registered through the `partir_plugin` entry-point group like any other."""
