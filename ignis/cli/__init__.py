"""The `ignis` command-line interface (typer + rich). The entry point is `ignis.cli.app:main`."""
